"""What the DETR page shows (no Streamlit): the objects found, each object query's box and its
cross-attention over the picture, and the self-attention between the queries.

    r = analyse(model, data, name)
    found = detections(r, threshold=0.7)          # [(query, label, probability, box in pixels)]
    boxes_picture(r, found); cross_map(r, query, layer, head); query_attention(r, layer, head, queries)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.inputs.image_file import read_image
from tformer_core.models.base import TracedModel
from tformer_core.models.detr import DETR
from tformer_core.numerics import softmax
from tformer_core.trace import Trace, to_host

from .pictures import enlarged, label_font

__all__ = [
    "COLOURS",
    "KEEP",
    "Detection",
    "DetrResult",
    "analyse",
    "boxes_picture",
    "class_probabilities",
    "cross_map",
    "detections",
    "query_attention",
]

COLOURS = (
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (0, 128, 128),
    (170, 110, 40),
)


@dataclass(frozen=True, eq=False)
class DetrResult:
    image: Image.Image  # as the model sees it (resized), before normalisation
    trace: Trace

    @property
    def n_queries(self) -> int:
        return len(self.trace.target_tokens or ())


@dataclass(frozen=True)
class Detection:
    query: int
    label: str
    probability: float
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels of DetrResult.image


# What the page reads: the heads' outputs, and the decoder's queries and keys (its attention is recomputed).
KEEP = matching("head.*", "decoder.*.attn.q", "decoder.*.attn.k", "decoder.*.cross_attn.q", "decoder.*.cross_attn.k")


def analyse(model: TracedModel[Any], data: bytes, name: str) -> DetrResult:
    if not isinstance(model, DETR) or model.preprocessing is None:
        raise InputError("this page shows DETR object detectors (e.g. facebook/detr-resnet-50)")
    loaded = read_image(data, name)
    pixels = model.preprocessing(loaded.image)
    return DetrResult(model.preprocessing.resized(loaded.image), model.trace(pixels, keep=KEEP))


def class_probabilities(r: DetrResult) -> np.ndarray:
    """[queries, classes + 1]: each query's softmax over the classes and "no object" (the last)."""
    return softmax(np.asarray(r.trace["head.logits"], dtype=np.float64))


def _probabilities_and_boxes(r: DetrResult) -> tuple[np.ndarray, np.ndarray]:
    logits, boxes = r.trace.fetch("head.logits", "head.boxes")  # one transfer from a GPU
    return softmax(np.asarray(logits, dtype=np.float64)), boxes


def detections(r: DetrResult, threshold: float) -> list[Detection]:
    """The queries whose most likely real class has at least `threshold` (transformers' post-processing)."""
    all_probs, boxes = _probabilities_and_boxes(r)
    probs = all_probs[:, :-1]
    labels = r.trace.meta.labels or [str(i) for i in range(probs.shape[1])]
    W, H = r.image.size
    found = []
    for q in np.flatnonzero(probs.max(-1) >= threshold):
        cx, cy, w, h = (float(v) for v in boxes[q])
        box = ((cx - w / 2) * W, (cy - h / 2) * H, (cx + w / 2) * W, (cy + h / 2) * H)
        c = int(probs[q].argmax())
        found.append(Detection(int(q), str(labels[c]), float(probs[q, c]), box))
    return sorted(found, key=lambda d: -d.probability)


def boxes_picture(r: DetrResult, found: list[Detection], chosen: int | None = None) -> Image.Image:
    """The picture with a box per detection (the chosen query's drawn thicker), labelled query: class. A small
    picture (the bundled DETR's 64 px) is enlarged first, pixel-exact, so that lines and labels stay thin."""
    image = enlarged(r.image.convert("RGB"))  # convert: a new picture (the cached result's is shared, never drawn on)
    k = image.width / r.image.width
    draw, font = ImageDraw.Draw(image), label_font(max(12, image.width // 60))
    for i, d in enumerate(found):
        colour = COLOURS[i % len(COLOURS)]
        box = tuple(v * k for v in d.box)
        draw.rectangle(box, outline=colour, width=6 if d.query == chosen else 3)
        text = f"q{d.query}: {d.label} {d.probability:.2f}"
        draw.text((box[0] + 4, box[1] + 2), text, fill=colour, font=font, stroke_width=2, stroke_fill="white")
    return image


def cross_map(r: DetrResult, query: int, layer: int, head: int | None) -> np.ndarray:
    """One object query's cross-attention over the feature grid [rows, cols] (mean of the heads when None)."""
    w = r.trace.block_tensor("weights", layer, None, "cross")[:, query]  # [heads, cells], picked where it is
    rows, cols = r.trace.patch_grid
    return to_host([w.float().mean(0) if head is None else w[head]])[0].reshape(rows, cols)


def query_attention(r: DetrResult, layer: int, head: int | None, queries: list[int]) -> np.ndarray:
    """The decoder's self-attention between the given object queries [len, len] (rows renormalised to them)."""
    w = r.trace.attention(layer, None, "decoder")  # [heads, Q, Q]
    w = w.mean(0) if head is None else w[head]
    sub = w[np.ix_(queries, queries)]
    return sub / sub.sum(-1, keepdims=True)
