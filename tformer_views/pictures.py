"""Pictures the pages send to the browser, drawn with PIL: heat over a photo, patch grids, tiles of pictures.

Pictures travel as PNG or JPEG, never as tensors: an overlay for a 224-px image is a few tens of
kilobytes; its attention weights would be megabytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .colour import colourise

__all__ = [
    "DISPLAY_PX",
    "data_uri",
    "display_scale",
    "enlarged",
    "grid_picture",
    "label_font",
    "overlay",
    "patch_sequence",
    "tiles",
    "to_jpeg",
    "to_png",
]

DISPLAY_PX = 448  # pictures smaller than this are enlarged (pixel-exact) for the screen


@lru_cache(maxsize=8)
def label_font(size: int = 12) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """PIL's own font at `size` pixels (the bitmap font, which takes no size, when PIL has no FreeType)."""
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


def to_png(image: Image.Image) -> bytes:
    """A picture as PNG bytes (what the pages send to the browser)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=3)
    return buffer.getvalue()


def to_jpeg(image: Image.Image, quality: int = 88) -> bytes:
    """A picture as JPEG bytes: overlays on photos are a tenth of their PNG size and encode faster."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def data_uri(image: Image.Image) -> str:
    """The picture as a JPEG data URI (an overlay on a photo: a few tens of KB)."""
    return "data:image/jpeg;base64," + base64.b64encode(to_jpeg(image)).decode("ascii")


def display_scale(size: tuple[int, int]) -> int:
    """Whole-number enlargement for small pictures (a 32-px input is shown at 320 px)."""
    return max(1, DISPLAY_PX // max(1, min(size)))


def enlarged(image: Image.Image) -> Image.Image:
    k = display_scale(image.size)
    return image if k == 1 else image.resize((image.width * k, image.height * k), Image.Resampling.NEAREST)


def overlay(
    image: Image.Image, grid_map: np.ndarray, alpha: float = 0.6, smooth: bool = True, cmap: str = "inferno"
) -> Image.Image:
    """The picture with a [rows, cols] map laid over it as heat (0 = dark, the map's maximum = bright).

    smooth: bilinear between patch centres; else every patch is one flat block. Enlarged for small inputs.
    """
    base = enlarged(image.convert("RGB"))
    heat = Image.fromarray(colourise(grid_map, cmap, lo=0.0))
    heat = heat.resize(base.size, Image.Resampling.BILINEAR if smooth else Image.Resampling.NEAREST)
    return Image.blend(base, heat, float(alpha))


def tiles(
    images: Sequence[Image.Image], labels: Sequence[str], columns: int, tile_px: int, gap: int = 6, label_px: int = 16
) -> Image.Image:
    """Pictures side by side in rows of `columns`, each scaled to `tile_px` wide, a label above each."""
    if not images:
        raise ValueError("no pictures to lay out")
    columns = max(1, min(columns, len(images)))
    scaled = [
        im.resize((tile_px, max(1, round(im.height * tile_px / im.width))), Image.Resampling.BILINEAR) for im in images
    ]
    tile_h = max(im.height for im in scaled)
    rows = -(-len(scaled) // columns)
    canvas = Image.new("RGB", (columns * (tile_px + gap) - gap, rows * (tile_h + label_px + gap) - gap), "white")
    draw, font = ImageDraw.Draw(canvas), label_font(12)
    for i, (im, label) in enumerate(zip(scaled, labels)):
        x, y = (i % columns) * (tile_px + gap), (i // columns) * (tile_h + label_px + gap)
        draw.text((x + tile_px // 2, y + label_px // 2), label, fill=(40, 40, 40), font=font, anchor="mm")
        canvas.paste(im, (x, y + label_px))
    return canvas


def grid_picture(image: Image.Image, patch_size: int) -> Image.Image:
    """The model's input with its P x P patch grid drawn, row and column numbers on the edges."""
    base = enlarged(image.convert("RGB"))
    k = display_scale(image.size)
    rows, cols = image.height // patch_size, image.width // patch_size
    margin = 18
    canvas = Image.new("RGB", (base.width + margin, base.height + margin), "white")
    canvas.paste(base, (margin, margin))
    draw, font = ImageDraw.Draw(canvas), label_font(10)
    step = patch_size * k
    for c in range(cols + 1):
        draw.line(
            [(margin + c * step, margin), (margin + c * step, margin + rows * step)], fill=(255, 255, 255), width=1
        )
    for r in range(rows + 1):
        draw.line(
            [(margin, margin + r * step), (margin + cols * step, margin + r * step)], fill=(255, 255, 255), width=1
        )
    label_every = 1 if step >= 16 else 2
    for c in range(0, cols, label_every):
        draw.text((margin + c * step + step // 2, margin // 2), str(c), fill=(60, 60, 60), font=font, anchor="mm")
    for r in range(0, rows, label_every):
        draw.text((margin // 2, margin + r * step + step // 2), str(r), fill=(60, 60, 60), font=font, anchor="mm")
    return canvas


def patch_sequence(image: Image.Image, patch_size: int, per_row: int | None = None, tile_px: int = 28) -> Image.Image:
    """The patches cut out and laid in the order the model reads them (row-major), index under every tenth."""
    rows, cols = image.height // patch_size, image.width // patch_size
    per_row = per_row or min(2 * cols, 32)
    patches = [
        image.crop((c * patch_size, r * patch_size, (c + 1) * patch_size, (r + 1) * patch_size))
        for r in range(rows)
        for c in range(cols)
    ]
    gap, label_px = 2, 12
    lines = -(-len(patches) // per_row)
    canvas = Image.new("RGB", (per_row * (tile_px + gap), lines * (tile_px + label_px + gap)), "white")
    draw, font = ImageDraw.Draw(canvas), label_font(9)
    for i, p in enumerate(patches):
        x, y = (i % per_row) * (tile_px + gap), (i // per_row) * (tile_px + label_px + gap)
        canvas.paste(p.resize((tile_px, tile_px), Image.Resampling.NEAREST), (x, y))
        if i % 10 == 0:
            draw.text(
                (x + tile_px // 2, y + tile_px + label_px // 2), str(i), fill=(60, 60, 60), font=font, anchor="mm"
            )
    return canvas
