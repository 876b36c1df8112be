"""Sample pictures the vision pages offer, the same on every machine, and any configured image folders.

    samples()   # {"photo: cat": bytes, ..., "shapes: circle": bytes, ..., "scene: 3 shapes": bytes, ...,
                #  "<folder>/<file>": bytes}
    digit_samples()   # {"digit: 0": bytes, ...}: for a ViT trained on the Train page's digits (`reads_digits`)

Photos: `assets/samples/` (public-domain / CC0, see its README). Shapes: one generated scene per class
of the bundled vit-tiny (and mae-tiny), the kind of picture they were trained on. Scenes: generated scenes of
2, 3 and 4 shapes, the kind the bundled detr-tiny was trained on. Folders: TFORMER_IMAGE_DIRS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from tformer_core import settings
from tformer_core.bundled.loading import ASSETS_DIR
from tformer_core.inputs.image_file import MAX_BYTES
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import VisionModel
from tformer_train import classroom, corpora
from tformer_train.data import SHAPE_CLASSES, make_detection_scenes, make_scenes

from .pictures import to_png

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_FOLDER_IMAGES",
    "PHOTOS_DIR",
    "digit_samples",
    "first_digit",
    "image_dirs",
    "reads_digits",
    "samples",
]

PHOTOS_DIR = ASSETS_DIR / "samples"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
MAX_FOLDER_IMAGES = 64


def image_dirs() -> list[Path]:
    """Folders of extra sample pictures: TFORMER_IMAGE_DIRS (os.pathsep-separated), none by default."""
    return [folder.resolve() for folder in settings.image_dirs()]


def _photos() -> list[tuple[str, bytes]]:
    return [(f"photo: {p.stem}", p.read_bytes()) for p in sorted(PHOTOS_DIR.glob("*.jpg"))]


def _shape_samples() -> list[tuple[str, bytes]]:
    """One generated scene per class of the bundled vit-tiny (the kind of picture it was trained on)."""
    scenes = make_scenes(64, seed=2024)
    out = []
    for cls, name in enumerate(SHAPE_CLASSES):
        index = int((scenes.labels == cls).nonzero()[0, 0])
        pixels = (scenes.images[index].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        out.append((f"shapes: {name}", to_png(Image.fromarray(pixels))))
    return out


def _detection_samples() -> list[tuple[str, bytes]]:
    """Scenes of 3, 4 and 2 shapes of different classes (the kind of picture the bundled detr-tiny was trained on):
    for each count, the first such scene of a fixed draw."""
    scenes = make_detection_scenes(32, seed=2024)
    out = []
    for count in (3, 4, 2):
        index = next(
            i
            for i in range(len(scenes.counts))
            if int(scenes.counts[i]) == count and len(set(scenes.objects(i)[0].tolist())) == count
        )
        pixels = (scenes.images[index].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        out.append((f"scene: {count} shapes", to_png(Image.fromarray(pixels))))
    return out


def _folder_samples() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
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
    """Sample pictures by name: the bundled photos, the generated shapes and scenes, then any configured image
    folders."""
    return dict(_photos() + _shape_samples() + _detection_samples() + _folder_samples())


def reads_digits(model: TracedModel) -> bool:
    """True for a ViT trained on the Train page's handwritten digits (8 x 8 pictures, its own preprocessing)."""
    return isinstance(model, VisionModel) and model.preprocessing == classroom.DIGIT_PREPROCESSING


def digit_samples() -> dict[str, bytes]:
    """The first test picture of each digit of the Train page's data set, as such a model reads it: 8 x 8 PNG, ink
    white on black (grey value ink / 16), "digit: 0" to "digit: 9". The first of the test split (the picture the
    Train page follows while it trains) is among them: `first_digit` names it."""
    images, labels = corpora.digits("test")
    out = {}
    for digit in range(10):
        found = (labels == digit).nonzero()[0]
        if len(found):
            grey = (images[found[0]].astype(np.float32) * (255 / 16)).round().clip(0, 255).astype(np.uint8)
            out[f"digit: {digit}"] = to_png(Image.fromarray(grey, "L"))
    return out


def first_digit() -> str:
    """The name in `digit_samples` of the first test picture: the one the Train page kept the attention for."""
    _, labels = corpora.digits("test")
    return f"digit: {int(labels[0])}"
