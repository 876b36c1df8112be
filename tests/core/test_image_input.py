"""Reading users' image files: every format and mode the vision pages accept, EXIF orientation, the
size limits, and a clear message for everything else (SVG, PDF, text, damaged files)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from tformer_core.inputs.image_file import ImageError, read_image
from tformer_core.inputs.preprocessing import ImagePreprocessing
from tformer_core.models.detr import DetrPreprocessing

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def quadrants(size=(40, 30)) -> Image.Image:
    """Top-left red, top-right green, bottom blue: orientation and colours can be checked."""
    w, h = size
    a = np.zeros((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = RED
    a[: h // 2, w // 2 :] = GREEN
    a[h // 2 :] = BLUE
    return Image.fromarray(a)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "TIFF"])
def test_common_formats_read_as_rgb_with_their_colours(fmt):
    loaded = read_image(encode(quadrants(), fmt, **({"quality": 95} if fmt == "JPEG" else {})), f"x.{fmt.lower()}")
    a = np.asarray(loaded.image, dtype=int)
    assert loaded.image.mode == "RGB" and loaded.image.size == (40, 30) and loaded.format == fmt
    tolerance = 40 if fmt in ("JPEG", "WEBP") else 0  # lossy formats
    assert np.abs(a[3, 3] - RED).max() <= tolerance
    assert np.abs(a[3, 36] - GREEN).max() <= tolerance
    assert np.abs(a[26, 20] - BLUE).max() <= tolerance


def test_an_animated_gif_gives_its_first_frame_and_says_so():
    frames = [Image.new("P", (10, 10), i) for i in range(3)]
    for frame, colour in zip(frames, (RED, GREEN, BLUE)):
        frame.putpalette([*colour] * 256)
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    loaded = read_image(data)
    assert tuple(np.asarray(loaded.image)[5, 5]) == RED
    assert any("3 frames: the first is used" in n for n in loaded.notes)


def test_exif_orientation_turns_the_picture_upright():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display turned 90 degrees clockwise
    data = encode(quadrants((40, 30)), "JPEG", quality=95, exif=exif.tobytes())
    loaded = read_image(data)
    assert loaded.image.size == (30, 40) and loaded.original_size == (40, 30)
    a = np.asarray(loaded.image, dtype=int)
    # Turned clockwise: the stored top-left (red) is now top-right, the stored bottom (blue) is on the left.
    assert np.abs(a[3, 26] - RED).max() < 40 and np.abs(a[20, 3] - BLUE).max() < 40
    assert any("EXIF orientation" in n for n in loaded.notes)


@pytest.mark.parametrize("orientation", [0, 9, 65535])
def test_an_invalid_exif_orientation_is_said_as_such_and_the_picture_used_as_stored(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(quadrants((40, 30)), "JPEG", quality=95, exif=exif.tobytes())
    loaded = read_image(data, "photo.jpg")
    assert loaded.image.size == (40, 30)
    assert loaded.notes == (
        f"its EXIF orientation ({orientation}) is not a valid one (1 to 8): the picture is used as stored",
    )


def test_grey_palette_and_alpha_modes():
    grey = read_image(encode(Image.new("L", (4, 4), 200), "PNG")).image
    assert tuple(np.asarray(grey)[0, 0]) == (200, 200, 200)
    la = Image.new("LA", (4, 4), (0, 0))  # black, fully transparent: laid over white
    loaded = read_image(encode(la, "PNG"))
    assert tuple(np.asarray(loaded.image)[0, 0]) == (255, 255, 255) and any("white" in n for n in loaded.notes)
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 128))  # half-transparent red over white: pink
    assert tuple(np.asarray(read_image(encode(rgba, "PNG")).image)[0, 0]) == (255, 127, 127)
    p = Image.new("P", (4, 4), 1)
    p.putpalette([0, 0, 0, *BLUE] + [0] * 762)
    p.info["transparency"] = 0
    assert tuple(np.asarray(read_image(encode(p, "PNG")).image)[0, 0]) == BLUE


def test_cmyk_jpeg_becomes_rgb():
    cyan = Image.new("CMYK", (8, 8), (255, 0, 0, 0))
    loaded = read_image(encode(cyan, "JPEG", quality=95))
    assert np.abs(np.asarray(loaded.image, dtype=int)[4, 4] - (0, 255, 255)).max() < 10
    assert loaded.original_mode == "CMYK" and any("CMYK" in n for n in loaded.notes)


def test_sixteen_bit_and_float_grey_are_scaled_not_clipped():
    values = np.array([[0, 32768, 65535, 1000]], dtype=np.uint16)
    loaded = read_image(encode(Image.fromarray(values), "PNG"))
    assert list(np.asarray(loaded.image)[0, :, 0]) == [0, 128, 255, 4]  # Pillow's own convert would clip to 255
    assert loaded.original_mode == "I;16" and any("16-bit" in n for n in loaded.notes)
    floats = Image.fromarray(np.array([[-1.0, 0.0, 1.0]], dtype=np.float32))
    assert list(np.asarray(read_image(encode(floats, "TIFF")).image)[0, :, 0]) == [0, 128, 255]


def test_large_pictures_are_downscaled_with_a_note():
    loaded = read_image(encode(quadrants((300, 150)), "PNG"), max_side=100)
    assert loaded.image.size == (100, 50) and any("downscaled from 300 × 150 to 100 × 50" in n for n in loaded.notes)


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (its data is one tiny row): refused before any decoding."""
    data = bytearray(encode(Image.new("RGB", (1, 1)), "PNG"))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


def test_too_many_pixels_are_refused_before_decoding():
    with pytest.raises(ImageError, match=r"12,000 × 9,000 pixels \(108 megapixels\); the limit is 60 megapixels"):
        read_image(_png_claiming(12_000, 9_000))
    with pytest.raises(ImageError, match="claims more than 179 megapixels; the limit is 60"):
        read_image(_png_claiming(20_000, 20_000))  # Pillow itself refuses to open this one
    with pytest.raises(ImageError, match=r"^the image is 40 × 30 pixels \(0 megapixels\); the limit is 0 megapixels"):
        read_image(encode(quadrants(), "PNG"), max_pixels=100)


@pytest.mark.parametrize("size", [(60_000, 1), (1, 60_000), (2_100, 100)])
def test_a_picture_far_more_elongated_than_the_models_read_is_refused_before_decoding(size):
    """A 60,000 x 1 PNG became a 2,048 x 1 picture: squeezed into a ViT's 224 x 224, or a DETR input 0 px tall."""
    w, h = size
    ratio = max(w, h) / min(w, h)
    expected = f"the picture is {w:,} × {h:,} pixels: one side is {ratio:,.0f} times the other"
    with pytest.raises(ImageError, match=expected + ".* at most 20 times the shorter. Crop it"):
        read_image(_png_claiming(w, h), "strip.png")
    assert read_image(encode(Image.new("RGB", (2_000, 100)), "PNG")).image.size == (2_000, 100)  # 20:1 is read


def test_the_preprocessings_refuse_elongated_pictures_with_the_same_message():
    strip = Image.new("RGB", (1, 3_000))
    with pytest.raises(ImageError, match="1 × 3,000 pixels: one side is 3,000 times the other"):
        ImagePreprocessing(resize=("shortest_edge", 224), crop=(224, 224))(strip)  # a 224 x 672,000 resize
    with pytest.raises(ImageError, match="one side is 3,000 times the other"):
        DetrPreprocessing(800, 1333)(strip)
    # 10:1 fits the ratio, but DETR's longest edge of 200 leaves it 20 px tall: the backbone reads 32
    with pytest.raises(ImageError, match="its shorter side would be 20 pixels; DETR reads at least 32"):
        DetrPreprocessing(800, 200).size(400, 40)
    # 20:1 is read: 67 = round(1,333 * 65 / 1,300) px tall, 1,340 = int(67 * 20) wide, as transformers computes it
    assert DetrPreprocessing(800, 1333).size(1_300, 65) == (1_340, 67)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "the file is empty$"),
        (
            b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>',
            "this is an SVG drawing",
        ),
        (b"<svg width='10' height='10'></svg>", "this is an SVG drawing: it is made of shapes, not pixels"),
        (b"%PDF-1.7 ...", "this is a PDF document$"),
        (b"PK\x03\x04zipzipzip", r"this is a ZIP archive \(or an Office document\)$"),
        (b"hello, this is text", "this is a text file, not an image$"),
        (bytes(range(256)) * 4, "this is not an image this app can read$"),
        (encode(quadrants(), "JPEG")[:200], r"the image data is damaged or cut short \("),
    ],
)
def test_non_images_and_damaged_files_get_a_message(data, message):
    with pytest.raises(ImageError, match=r"^upload: " + message):  # the file's name, then what it is
        read_image(data, "upload")


def test_too_many_bytes_are_refused():
    with pytest.raises(ImageError, match=r"^the file is 2\.0 MB; the limit is 1 MB$"):
        read_image(b"\x89PNG" + bytes(2 * 2**20), max_bytes=2**20)


def test_a_png_with_a_huge_colour_profile_is_read_without_it_and_says_so():
    """Once refused as "damaged or cut short": Pillow refuses metadata chunks over 1 MB, and with them the picture."""
    import os

    from PIL import PngImagePlugin

    picture = Image.new("RGB", (16, 12), (10, 200, 30))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", icc_profile=os.urandom(15 * 2**20))
    loaded = read_image(buffer.getvalue(), "profile.png")
    assert loaded.notes == ("its 15.0 MB colour profile (ICC) was left out (pictures may carry 1 MB)",)
    assert np.array_equal(np.asarray(loaded.image), np.asarray(picture))  # the pixels, untouched
    # Compressed text that inflates to 20 MB (20 KB in the file) is treated the same way.
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "A" * (20 * 2**20), zip=True)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", pnginfo=info)
    assert len(buffer.getvalue()) < 100_000
    assert read_image(buffer.getvalue()).notes == ("its 20.0 MB text was left out (pictures may carry 1 MB)",)
    # A normal profile stays, with no note.
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", icc_profile=os.urandom(3000))
    assert read_image(buffer.getvalue()).notes == ()
