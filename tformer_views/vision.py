"""What the Vision Transformer and Mean attention distance pages show, from ViT traces: no Streamlit here.

    result = analyse(model, image_bytes, "photo.jpg")          # the picture as the model sees it, and its trace
    attention_map(result.trace, layer=5, head=None)             # [rows, cols]: the class token's attention, mean of heads
    overlay(result.image, that_map)                             # PIL: the map as heat over the picture
    rollout(result.trace, "max", 0.9)                           # attention rollout (Abnar & Zuidema 2020)
    embedding_filter_pcs(model), position_similarity_maps(model)   # ViT paper, Fig. 7, left and centre
    mean_attention_distances(model, images)                     # [images, layers, heads] in pixels (Fig. 7, right)

Pictures are returned as PIL images (the pages send them as PNG), never as tensors: an overlay
for a 224-px image is a few tens of kilobytes, its attention weights would be megabytes.
"""

from __future__ import annotations

import base64
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from PIL import Image, ImageDraw, ImageFont

from tformer_core.inputs.image_file import MAX_BYTES, ImageError, LoadedImage, read_image, to_jpeg, to_png
from tformer_core.metrics import mean_attention_distance
from tformer_core.trace import Trace

from .charts.spec import channel, layered, named_data

FUSIONS = ("mean", "max", "min")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
MAX_FOLDER_IMAGES = 64
DISPLAY_PX = 448  # pictures smaller than this are enlarged (pixel-exact) for the screen

# Colour maps as ten stops each, interpolated (numbers from matplotlib's tables).
_CMAPS = {
    "inferno": (
        "#000004",
        "#1b0c41",
        "#4a0c6b",
        "#781c6d",
        "#a52c60",
        "#cf4446",
        "#ed6925",
        "#fb9b06",
        "#f7d13d",
        "#fcffa4",
    ),
    "viridis": (
        "#440154",
        "#482878",
        "#3e4989",
        "#31688e",
        "#26828e",
        "#1f9e89",
        "#35b779",
        "#6ece58",
        "#b5de2b",
        "#fde725",
    ),
    "coolwarm": (
        "#3b4cc0",
        "#5977e3",
        "#7b9ff9",
        "#9ebeff",
        "#c0d4f5",
        "#dddcdc",
        "#f2cbb7",
        "#f7ac8e",
        "#ee8468",
        "#b40426",
    ),
}


# ---- one image -----------------------------------------------------------------------------------
def require_vit(model: Any) -> None:
    if getattr(model, "kind", "") != "vit":
        raise ValueError("this page shows Vision Transformers (ViT, DeiT); this model reads text")
    if getattr(model, "preprocessing", None) is None:
        raise ValueError("this ViT has no image preprocessing (no preprocessor_config.json in its folder)")


@dataclass(frozen=True, eq=False)
class VisionResult:
    """A picture and what the model computed for it.

    image: RGB as the model sees it (resized, cropped), before normalisation; trace: its trace;
    loaded: the picture as uploaded (size, format, notes on what was changed).
    """

    image: Image.Image
    trace: Trace
    loaded: LoadedImage

    @property
    def grid_hw(self) -> tuple[int, int]:
        return self.trace.grid_hw  # type: ignore[return-value]

    @property
    def patch_size(self) -> int:
        return int(self.trace.patch_size)  # type: ignore[arg-type]


def analyse(model: Any, data: bytes, name: str = "") -> VisionResult:
    """Read an image file, preprocess it as the checkpoint does, trace it. ImageError / ValueError for bad input."""
    require_vit(model)
    loaded = read_image(data, name)
    seen = model.preprocessing.resized(loaded.image)
    trace = model.trace(model.preprocessing(loaded.image))
    return VisionResult(seen, trace, loaded)


def query_token(trace: Trace, patch: int | None) -> int:
    """Token index of a query: the class token (patch None) or patch `patch` (row-major) after the prefix tokens."""
    if patch is None:
        return 0
    n = trace.grid_hw[0] * trace.grid_hw[1]
    if not 0 <= patch < n:
        raise ValueError(f"patch {patch} is out of range: the grid has {n} patches (0..{n - 1})")
    return trace.n_prefix_tokens + int(patch)


def attention_map(trace: Trace, layer: int, head: int | None, patch: int | None = None) -> np.ndarray:
    """[rows, cols]: how much the query (class token, or a patch) attends to each patch; head None: mean of heads.

    Not renormalised: the share the query gives the prefix tokens is `1 - map.sum()`.
    """
    w = trace.attention(layer)  # [heads, n, n]
    row = w[:, query_token(trace, patch), trace.n_prefix_tokens :]  # [heads, N]
    row = row.mean(0) if head is None else row[head]
    return np.asarray(row, dtype=np.float64).reshape(trace.grid_hw)


def rollout(trace: Trace, head_fusion: str = "mean", discard_ratio: float = 0.9) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020), as vit-explain computes it: [n_tokens, n_tokens].

    Per layer: fuse the heads (mean / max / min), set the lowest `discard_ratio` of the fused weights
    to 0 (the class token's attention to itself is always kept), add the identity for the residual
    connection, (A + I) / 2, renormalise the rows, and multiply the layers from the first up.
    """
    if head_fusion not in FUSIONS:
        raise ValueError(f"head fusion must be one of {FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"the discard ratio must be in [0, 1), got {discard_ratio}")
    n = len(trace.tokens)
    result = np.eye(n)
    for layer in range(trace.n_layers):
        w = np.asarray(trace.attention(layer), dtype=np.float64)  # [heads, n, n]
        fused = getattr(w, head_fusion)(axis=0)
        flat = fused.ravel().copy()
        drop = np.argsort(flat, kind="stable")[: int(flat.size * discard_ratio)]
        flat[drop[drop != 0]] = 0.0
        a = (flat.reshape(n, n) + np.eye(n)) / 2
        a /= a.sum(-1, keepdims=True)
        result = a @ result
    return result


def rollout_map(trace: Trace, head_fusion: str = "mean", discard_ratio: float = 0.9) -> np.ndarray:
    """[rows, cols]: the class token's row of the rollout over the patches."""
    return rollout(trace, head_fusion, discard_ratio)[0, trace.n_prefix_tokens :].reshape(trace.grid_hw)


# ---- pictures -------------------------------------------------------------------------------------
def _lut(name: str) -> np.ndarray:
    stops = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in _CMAPS[name]], dtype=np.float64)
    x, t = np.linspace(0, 1, len(stops)), np.linspace(0, 1, 256)
    return np.stack([np.interp(t, x, stops[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


_LUTS = {name: _lut(name) for name in _CMAPS}


def colourise(
    values: np.ndarray, cmap: str = "inferno", lo: float | None = None, hi: float | None = None
) -> np.ndarray:
    """[h, w] numbers -> [h, w, 3] uint8 colours, lo..hi (default: the values' own range) over the map."""
    v = np.asarray(values, dtype=np.float64)
    lo = float(v.min()) if lo is None else lo
    hi = float(v.max()) if hi is None else hi
    scaled = (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)
    return _LUTS[cmap][np.clip(np.rint(scaled * 255), 0, 255).astype(np.int64)]


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


def _font(size: int = 12) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()


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
    draw, font = ImageDraw.Draw(canvas), _font(12)
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
    draw, font = ImageDraw.Draw(canvas), _font(10)
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
    draw, font = ImageDraw.Draw(canvas), _font(9)
    for i, p in enumerate(patches):
        x, y = (i % per_row) * (tile_px + gap), (i // per_row) * (tile_px + label_px + gap)
        canvas.paste(p.resize((tile_px, tile_px), Image.Resampling.NEAREST), (x, y))
        if i % 10 == 0:
            draw.text(
                (x + tile_px // 2, y + tile_px + label_px // 2), str(i), fill=(60, 60, 60), font=font, anchor="mm"
            )
    return canvas


def data_uri(image: Image.Image) -> str:
    """The picture as a JPEG data URI (an overlay on a photo: a few tens of KB)."""
    return "data:image/jpeg;base64," + base64.b64encode(to_jpeg(image)).decode("ascii")


def patch_picker(picture: Image.Image, grid_hw: tuple[int, int], selected: int | None, title: str = "") -> dict:
    """A Vega-Lite chart: `picture` (e.g. an overlay) with its patch grid; clicking a patch selects it.

    Selection parameter "patch" with the field "patch" (row-major index). The picture travels as a
    PNG inside the spec, the grid as rows x cols small records.
    """
    rows, cols = grid_hw
    r, c = np.divmod(np.arange(rows * cols), cols)
    cells = pd.DataFrame({"patch": np.arange(rows * cols), "row": r, "col": c})
    datasets: dict[str, Any] = {}
    x = channel("col", "ordinal", axis=None, scale={"paddingInner": 0, "paddingOuter": 0})
    y = channel("row", "ordinal", axis=None, scale={"paddingInner": 0, "paddingOuter": 0})
    background = {
        "data": named_data(pd.DataFrame({"url": [data_uri(picture)]}), datasets),
        "mark": {
            "type": "image",
            "width": picture.width,
            "height": picture.height,
            "align": "left",
            "baseline": "top",
            "aspect": False,
        },
        "encoding": {"url": channel("url", "nominal"), "x": {"value": 0}, "y": {"value": 0}},
    }
    grid = {
        "name": "cells",
        "data": named_data(cells, datasets),
        "mark": {
            "type": "rect",
            "fill": "white",
            "stroke": "white",
            "strokeOpacity": 0.35,
            "strokeWidth": 0.5,
            "cursor": "pointer",
        },
        "encoding": {
            "x": x,
            "y": y,
            "fillOpacity": {"condition": {"param": "hover", "empty": False, "value": 0.3}, "value": 0.001},
            "tooltip": [
                channel("patch", "quantitative", title="patch"),
                channel("row", "quantitative", title="row"),
                channel("col", "quantitative", title="column"),
            ],
        },
    }
    layers = [background, grid]
    if selected is not None:
        chosen = cells[cells["patch"] == selected].reset_index(drop=True)
        layers.append(
            {
                "data": named_data(chosen, datasets),
                "mark": {"type": "rect", "fill": None, "stroke": "#00e5ff", "strokeWidth": 2.5},
                "encoding": {"x": x, "y": y},
            }
        )
    params = [
        {"name": "patch", "views": ["cells"], "select": {"type": "point", "fields": ["patch"], "on": "click"}},
        {
            "name": "hover",
            "views": ["cells"],
            "select": {"type": "point", "fields": ["patch"], "on": "pointerover", "clear": "pointerout"},
        },
    ]
    spec = layered(layers, datasets, title, width=picture.width, height=picture.height, params=params)
    spec["config"] = {"view": {"stroke": None}}
    return spec


def clicked_patch(event: Any) -> int | None:
    """The patch index from a patch_picker selection event, or None."""
    try:
        points = event["selection"]["patch"]
    except (KeyError, TypeError):
        return None
    for point in points or []:
        try:
            value = point["patch"]
            return int(value[0] if isinstance(value, (list, tuple)) else value)
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return None


# ---- the model's own pictures (ViT paper, Fig. 7) --------------------------------------------------
def embedding_filter_pcs(
    model: Any, n: int = 28, tile_px: int = 32, columns: int = 7
) -> tuple[Image.Image, np.ndarray]:
    """The first `n` principal components of the patch-embedding filters as RGB P x P tiles (Fig. 7, left).

    The filters are the D rows of the linear patch embedding, each P*P*C numbers (channel-first);
    they are centred and the principal directions found by SVD. Each component is shown min-max
    scaled to 0..255. Returns (picture, share of the variance of each component shown).
    """
    require_vit(model)
    c = model.config
    w = model.encoder.embed.project.weight.detach().float().cpu().numpy()  # [D, C*P*P]
    centred = w - w.mean(0, keepdims=True)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    n = min(n, vt.shape[0])
    variance = (s**2) / (s**2).sum()
    pictures = []
    for i in range(n):
        comp = vt[i].reshape(c.n_channels, c.patch_size, c.patch_size).transpose(1, 2, 0)  # [P, P, C]
        lo, hi = comp.min(), comp.max()
        rgb = np.round((comp - lo) / (hi - lo or 1.0) * 255).astype(np.uint8)
        if rgb.shape[-1] == 1:
            rgb = np.repeat(rgb, 3, axis=-1)
        pictures.append(Image.fromarray(rgb[..., :3]).resize((tile_px, tile_px), Image.Resampling.NEAREST))
    return tiles(pictures, [str(i + 1) for i in range(n)], columns, tile_px, gap=4, label_px=12), variance[:n]


def position_similarity(model: Any) -> np.ndarray:
    """[N, N] cosine similarity between the position embeddings of the patches (prefix tokens left out)."""
    require_vit(model)
    pos = model.encoder.embed.pos.detach().float().cpu().numpy()[0, model.config.n_prefix_tokens :]  # [N, D]
    unit = pos / np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def position_similarity_maps(model: Any, cell_px: int = 2, gap: int = 2) -> Image.Image:
    """Fig. 7, centre: for each patch (placed at its spot in the grid), a small map of its position
    embedding's cosine similarity with every patch's (-1 blue .. 1 red)."""
    sim = position_similarity(model)
    rows, cols = model.config.grid_hw
    k = max(cell_px, 42 // max(rows, cols))  # small grids get larger maps
    map_h, map_w = rows * k, cols * k
    canvas = Image.new("RGB", (cols * (map_w + gap) - gap, rows * (map_h + gap) - gap), "white")
    for i in range(rows * cols):
        colours = colourise(sim[i].reshape(rows, cols), "coolwarm", lo=-1.0, hi=1.0)
        tile = Image.fromarray(colours).resize((map_w, map_h), Image.Resampling.NEAREST)
        r, c = divmod(i, cols)
        canvas.paste(tile, (c * (map_w + gap), r * (map_h + gap)))
    return canvas


# ---- mean attention distance -----------------------------------------------------------------------
def image_mad(trace: Trace, renormalize: bool = False) -> np.ndarray:
    """[layers, heads] mean attention distance in pixels of one traced image."""
    return mean_attention_distance(
        trace.all_attention(), trace.grid_hw, trace.patch_size, trace.n_prefix_tokens, renormalize
    )


def uniform_mad(grid_hw: tuple[int, int], patch_size: int, n_prefix_tokens: int, renormalize: bool = False) -> float:
    """The mean attention distance of uniform attention over every token (the dashed baseline)."""
    n = n_prefix_tokens + grid_hw[0] * grid_hw[1]
    return float(mean_attention_distance(np.full((n, n), 1.0 / n), grid_hw, patch_size, n_prefix_tokens, renormalize))


def mean_attention_distances(
    model: Any,
    images: Sequence[Image.Image],
    renormalize: bool = False,
    batch_size: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """[images, layers, heads] mean attention distance in pixels, the images preprocessed as the model's
    checkpoint does and traced in batches (on the model's device), keeping only the attention weights.

    progress(done, total) is called after every batch.
    """
    require_vit(model)
    if not images:
        raise ValueError("no images: choose or upload at least one")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    c = model.config
    out = []
    for start in range(0, len(images), batch_size):
        batch = torch.stack([model.preprocessing(im) for im in images[start : start + batch_size]])
        traces = model.trace_batch(batch, keep=lambda name: name.endswith(".weights"))
        per_layer = [
            mean_attention_distance(
                np.stack([t.attention(layer) for t in traces]), c.grid_hw, c.patch_size, c.n_prefix_tokens, renormalize
            )
            for layer in range(c.n_layers)
        ]
        out.append(np.stack(per_layer, axis=1))  # [batch, layers, heads]
        if progress is not None:
            progress(min(start + batch_size, len(images)), len(images))
    return np.concatenate(out)  # [images, layers, heads]


def mad_frame(values: np.ndarray) -> pd.DataFrame:
    """[layers, heads] -> long DataFrame (layer, head, distance) for text_views.distance_chart."""
    layers, heads = np.meshgrid(np.arange(values.shape[0]), np.arange(values.shape[1]), indexing="ij")
    return pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "distance": np.asarray(values).ravel()})


# ---- sample pictures ------------------------------------------------------------------------------
def image_dirs() -> list[Path]:
    """Folders of extra sample pictures: TFORMER_IMAGE_DIRS (os.pathsep-separated), none by default."""
    configured = os.environ.get("TFORMER_IMAGE_DIRS", "")
    return [Path(p).expanduser().resolve() for p in configured.split(os.pathsep) if p.strip()]


def _shape_samples() -> list[tuple[str, bytes]]:
    """One generated scene per class of the bundled vit-tiny (the kind of picture it was trained on)."""
    from tformer_core.bundled.data import SHAPE_CLASSES, make_scenes

    scenes = make_scenes(64, seed=2024)
    out = []
    for cls, name in enumerate(SHAPE_CLASSES):
        index = int((scenes.labels == cls).nonzero()[0, 0])
        pixels = (scenes.images[index].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        out.append((f"shapes: {name}", to_png(Image.fromarray(pixels))))
    return out


def _sklearn_samples() -> list[tuple[str, bytes]]:
    """scikit-learn's two bundled photos (china.jpg, flower.jpg), read as files, when it is installed."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "images"
    return [(f"photo: {p.stem} (scikit-learn)", p.read_bytes()) for p in sorted(folder.glob("*.jpg"))]


def _folder_samples() -> list[tuple[str, bytes]]:
    out = []
    for folder in image_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if (
                path.suffix.lower() in IMAGE_SUFFIXES
                and path.is_file()
                and path.stat().st_size <= MAX_BYTES
                and len(out) < MAX_FOLDER_IMAGES
            ):
                out.append((f"{folder.name}/{path.name}", path.read_bytes()))
    return out


def samples() -> dict[str, bytes]:
    """Sample pictures by name: the scikit-learn photos, any configured image folders, the generated shapes."""
    return dict(_sklearn_samples() + _folder_samples() + _shape_samples())


def read_images(files: Sequence[tuple[str, bytes]]) -> tuple[list[Image.Image], list[str], list[str]]:
    """Decode many files: (pictures, their names, messages for the files refused)."""
    pictures, names, refused = [], [], []
    for name, data in files:
        try:
            pictures.append(read_image(data, name).image)
            names.append(name)
        except ImageError as error:
            refused.append(str(error))
    return pictures, names, refused
