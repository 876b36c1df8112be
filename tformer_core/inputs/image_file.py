"""Reading a user's image file safely: any common format and mode in, an RGB picture (or a clear message) out.

    loaded = read_image(data, name="photo.jpg")     # ImageError (a ValueError) with a message for the user
    loaded.image                                    # PIL RGB, upright (EXIF orientation applied)
    loaded.notes                                    # what was done to it: "rotated by its EXIF orientation", ...

What is accepted: PNG, JPEG, WebP, BMP, TIFF, GIF (its first frame), in any mode: grey (L, 1),
palette (P), with alpha (LA, PA, RGBA: laid over white), CMYK, 16-bit and 32-bit integer and
float grey (scaled to 0..255 from their value range). Limits: MAX_BYTES per file, MAX_PIXELS per
image and MAX_ASPECT between its sides (refused above, before its pixels are decoded), and pictures larger
than MAX_SIDE pixels on a side are downscaled (the models see 224 px or less anyway). SVG and other non-images are
refused with a message that says what the file looks like.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import InputError

__all__ = [
    "FORMATS",
    "MAX_ASPECT",
    "MAX_BYTES",
    "MAX_PIXELS",
    "MAX_SIDE",
    "ImageError",
    "LoadedImage",
    "check_aspect",
    "read_image",
]

MAX_BYTES = 25 * 2**20
MAX_PIXELS = 60_000_000  # refused above this (a 60-megapixel photo is already far beyond any phone's)
MAX_SIDE = 2048  # larger pictures are downscaled to this longest side
# The longer side at most this many times the shorter. The models read pictures near square (a ViT squeezes any
# picture to its own square; DETR keeps the ratio with its longer side at most 1,333 pixels and needs 32 on the
# shorter): a 60,000 x 1 strip became a 2,048 x 1 picture squeezed into 224 x 224, or a DETR input 0 pixels tall.
MAX_ASPECT = 20
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF", "MPO")  # MPO: JPEGs from some cameras

# What a refused file looks like, by its first bytes.
_SIGNATURES = (
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "a ZIP archive (or an Office document)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"ftypheic", "a HEIC photo (save it as JPEG or PNG first)"),
    (b"ftypmif1", "a HEIF photo (save it as JPEG or PNG first)"),
    (b"ftypavif", "an AVIF image (save it as JPEG or PNG first)"),
    (b"ID3", "an MP3 file"),
    (b"\x00\x00\x00\x18ftyp", "a video or HEIF file"),
)


class ImageError(InputError):
    """A file that cannot be used as an image; the message is meant for the user."""


@dataclass(frozen=True)
class LoadedImage:
    """An uploaded picture, ready for a model's preprocessing.

    image: RGB, upright. original_size: (width, height) as stored. notes: what was changed.
    """

    image: Image.Image
    format: str
    original_size: tuple[int, int]
    original_mode: str
    notes: tuple[str, ...]


def _describe(data: bytes) -> str:
    head = data[:512].lstrip()
    lowered = head.lower()
    if lowered.startswith((b"<?xml", b"<svg")) and b"<svg" in data[:4096].lower():
        return "an SVG drawing: it is made of shapes, not pixels. Export it as PNG first"
    for signature, what in _SIGNATURES:
        if signature in data[:16]:
            return what
    if lowered.startswith((b"<!doctype html", b"<html")):
        return "a web page (HTML), not an image"
    try:
        head.decode("utf-8")
        return "a text file, not an image"
    except UnicodeDecodeError:
        return "not an image this app can read"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Chunks that hold metadata only: colour profile, text, EXIF. Pillow refuses any whose content passes
# 1 MB (its guard against decompression bombs), and with it the whole picture.
_PNG_METADATA = {b"iCCP": "colour profile (ICC)", b"zTXt": "text", b"iTXt": "text", b"tEXt": "text", b"eXIf": "EXIF"}
_PNG_METADATA_LIMIT = 2**20


def _drop_big_png_metadata(data: bytes) -> tuple[bytes, list[str]]:
    """A PNG without its metadata chunks of more than 1 MB, and a note per chunk dropped; (data, []) for
    anything else. The pixels are untouched: each chunk keeps its own checksum."""
    if not data.startswith(_PNG_SIGNATURE):
        return data, []
    kept, dropped, at = [_PNG_SIGNATURE], [], len(_PNG_SIGNATURE)
    while at + 8 <= len(data):
        (length,), kind = struct.unpack(">I", data[at : at + 4]), data[at + 4 : at + 8]
        end = at + 12 + length  # length, type, content, CRC
        if kind in _PNG_METADATA and length > 1024:  # zlib inflates at most ~1000:1: smaller chunks are fine
            size = _inflated_size(data[at + 8 : at + 8 + length], kind)
            if size > _PNG_METADATA_LIMIT:
                dropped.append(
                    f"its {size / 2**20:.1f} MB {_PNG_METADATA[kind]} was left out (pictures may carry 1 MB)"
                )
                at = end
                continue
        kept.append(data[at:end])
        at = end
    return (b"".join(kept), dropped) if dropped else (data, [])


def _inflated_size(content: bytes, kind: bytes) -> int:
    """How big a metadata chunk's content is once decompressed (counted in steps, never all held at once)."""
    if kind in (b"tEXt", b"eXIf"):
        return len(content)
    keyword_end = content.find(b"\0")
    start = keyword_end + 2 if kind in (b"iCCP", b"zTXt") else keyword_end + 3
    if kind == b"iTXt":
        if len(content) <= keyword_end + 1 or content[keyword_end + 1] == 0:  # not compressed
            return len(content)
        start = content.find(b"\0", content.find(b"\0", keyword_end + 3) + 1) + 1
    inflater, total, pending = zlib.decompressobj(), 0, content[start:]
    while pending and total <= _PNG_METADATA_LIMIT * 64:
        try:
            total += len(inflater.decompress(pending, 2**20))
        except zlib.error:
            return len(content)
        pending = inflater.unconsumed_tail
    return total


def _to_rgb(image: Image.Image) -> tuple[Image.Image, list[str]]:
    """Any PIL mode -> RGB; notes say what a user might not expect."""
    notes: list[str] = []
    mode = image.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        if mode.startswith("I;16"):
            lo, hi = 0.0, 65535.0
        else:  # 32-bit integer or float grey: its own range
            finite = values[np.isfinite(values)]
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        scaled = np.clip((np.nan_to_num(values, nan=lo) - lo) / ((hi - lo) or 1.0), 0.0, 1.0)
        image = Image.fromarray(np.round(scaled * 255).astype(np.uint8), mode="L")
        notes.append(f"{'16-bit' if mode.startswith('I;16') else mode + '-mode'} grey values scaled to 8 bits")
        mode = "L"
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
    if mode in ("LA", "PA", "RGBA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        alpha = np.asarray(rgba)[..., 3]
        if alpha.min() < 255:
            notes.append("transparent parts laid over white")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba).convert("RGB")
    elif mode == "CMYK":
        image = image.convert("RGB")
        notes.append("CMYK colours converted to RGB")
    elif mode != "RGB":
        image = image.convert("RGB")  # L, 1, YCbCr, LAB, HSV
    return image, notes


def check_aspect(width: int, height: int, label: str = "") -> None:
    """ImageError when one side of a `width` x `height` picture is more than MAX_ASPECT times the other."""
    long, short = max(width, height), min(width, height)
    if long > MAX_ASPECT * short:
        raise ImageError(
            f"{label}the picture is {width:,} × {height:,} pixels: one side is {long / short:,.0f} times the other, "
            f"and the models here read pictures whose longer side is at most {MAX_ASPECT} times the shorter. "
            "Crop it to a less elongated part first."
        )


def read_image(
    data: bytes, name: str = "", max_bytes: int = MAX_BYTES, max_pixels: int = MAX_PIXELS, max_side: int = MAX_SIDE
) -> LoadedImage:
    """Decode an image file's bytes into an upright RGB picture; ImageError with a clear message otherwise."""
    label = f"{name}: " if name else ""
    if not data:
        raise ImageError(f"{label}the file is empty")
    if len(data) > max_bytes:
        raise ImageError(f"{label}the file is {len(data) / 2**20:.1f} MB; the limit is {max_bytes / 2**20:.0f} MB")
    data, notes = _drop_big_png_metadata(data)
    # Pillow warns about huge pictures when it reads the header; the size check below refuses them
    # with their numbers, before a single pixel is decoded.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image: Image.Image = Image.open(io.BytesIO(data))  # reads the header only
        except UnidentifiedImageError as error:
            raise ImageError(f"{label}this is {_describe(data)}") from error
        except Image.DecompressionBombError as error:
            raise ImageError(
                f"{label}the image claims more than {2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6:.0f} megapixels; "
                f"the limit is {max_pixels / 1e6:.0f} megapixels. Downscale it first."
            ) from error
        except (OSError, SyntaxError, ValueError) as error:
            raise ImageError(f"{label}the image data is damaged or cut short ({error})") from error
        fmt = image.format or "?"
        if fmt not in FORMATS:
            raise ImageError(f"{label}{fmt} images are not supported: use PNG, JPEG, WebP, BMP, TIFF or GIF")
        width, height = image.size
        if width < 1 or height < 1:
            raise ImageError(f"{label}the image has no pixels ({width} × {height})")
        check_aspect(width, height, label)
        if width * height > max_pixels:
            raise ImageError(
                f"{label}the image is {width:,} × {height:,} pixels ({width * height / 1e6:.0f} "
                f"megapixels); the limit is {max_pixels / 1e6:.0f} megapixels. Downscale it first."
            )
        frames = getattr(image, "n_frames", 1)
        if frames > 1:
            notes.append(f"{'animated ' if fmt == 'GIF' else ''}{fmt} with {frames} frames: the first is used")
        mode = image.mode
        try:
            if fmt == "JPEG" and max(width, height) > 2 * max_side:
                image.draft("RGB", (max_side, max_side))  # decode big JPEGs at a fraction of their size
            image.seek(0)
            image.load()
            oriented, turned = _upright(image)
        except (OSError, SyntaxError, ValueError, EOFError) as error:
            raise ImageError(f"{label}the image data is damaged or cut short ({error})") from error
    notes += turned
    image, mode_notes = _to_rgb(oriented)
    notes += mode_notes
    if max(image.size) > max_side:
        before = image.size
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        notes.append(f"downscaled from {before[0]:,} × {before[1]:,} to {image.size[0]:,} × {image.size[1]:,} pixels")
    return LoadedImage(image, fmt, (width, height), mode, tuple(notes))


# EXIF orientations 2 to 8 and what exif_transpose does for each; 1 is upright, anything else is not valid.
_TURNS = {
    2: "mirrored",
    3: "rotated by 180°",
    4: "flipped upside down",
    5: "mirrored and rotated by 90°",
    6: "rotated by 90°",
    7: "mirrored and rotated by 90°",
    8: "rotated by 90°",
}


def _upright(image: Image.Image) -> tuple[Image.Image, list[str]]:
    """The picture turned as its EXIF orientation says (2 to 8), and a note; a value that is not an orientation
    is said as such and the picture used as stored (it was once reported as "turned upright")."""
    orientation = _exif_orientation(image)
    if isinstance(orientation, int) and orientation in _TURNS:
        # exif_transpose copies the picture: only when it turns it (180 MB more for a 60-megapixel photo).
        return ImageOps.exif_transpose(image), [f"turned upright by its EXIF orientation ({_TURNS[orientation]})"]
    if orientation in (None, 1):
        return image, []
    shown = orientation if isinstance(orientation, int) and abs(orientation) < 10**6 else "a value that is not one"
    return image, [f"its EXIF orientation ({shown}) is not a valid one (1 to 8): the picture is used as stored"]


def _exif_orientation(image: Image.Image) -> object:
    try:
        return image.getexif().get(0x0112)
    except Exception:  # broken EXIF blocks are ignored, as exif_transpose does
        return None
