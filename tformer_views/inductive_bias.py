"""Inductive bias: what shifting the picture does inside a ViT (no Streamlit).

The picture, as the model sees it (resized, normalised), is rolled sideways by k pixels (what leaves on the
right comes back on the left, so no patch is lost or made up). The patch embedding is a strided
convolution, so for k a multiple of the patch size P every patch's embedding is the same vector as before,
now k / P columns further; for other k the patches cut the picture elsewhere and the vectors change. The
position embeddings are learned and stay where they are: the token that carries a patch's content now gets
another position's embedding, and the attention and the class probabilities change even when the patch
embeddings only moved.

    s = shift_study(model, data, name, k)        # one shift, both pictures traced
    s.embedding_error                            # max |e_shifted(r, c + k/P) - e(r, c)| over every patch
    sweep(model, data, name, range(0, 33))       # the same figures for many shifts, one batched pass
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image

from tformer_core.capture import NameFilter, matching
from tformer_core.errors import InputError
from tformer_core.inputs.image_file import read_image
from tformer_core.models.base import TracedModel
from tformer_core.models.vit import ViT
from tformer_core.trace import Trace, to_host

from .vision import require_vit

__all__ = ["WANTED", "ShiftStudy", "embedding_error", "roll", "shift_study", "sweep"]

WANTED = ("encoder.embed.patch", "head.logits")


def _keep(last_layer: int) -> NameFilter:
    """The patch embeddings, the logits and the last layer's Q and K (its attention is recomputed from them)."""
    return matching(*WANTED, f"encoder.{last_layer}.attn.q", f"encoder.{last_layer}.attn.k")


@dataclass(frozen=True, eq=False)
class ShiftStudy:
    """The picture and its copy rolled k pixels to the right, with what the model computed for each."""

    k: int
    patch_size: int
    image: Image.Image  # as the model sees it, before normalisation
    shifted_image: Image.Image
    original: Trace
    shifted: Trace

    @property
    def moved_by_whole_patches(self) -> bool:
        return self.k % self.patch_size == 0

    @property
    def embedding_error(self) -> float:
        """max |e_shifted(r, c + k/P) - e(r, c)|: ~0 (rounding) when k is a multiple of P; for other k, the
        same comparison with the patch k/P (rounded down) columns further."""
        return embedding_error(self.original, self.shifted, self.k)

    @property
    def embedding_size(self) -> float:
        """max |e(r, c)|: the scale the error is measured against."""
        with torch.inference_mode():  # reduced where the trace is: one number crosses to the host
            largest = self.original.tensor("encoder.embed.patch").abs().amax()
        return float(to_host([largest])[0])

    def class_token_map(self, which: str) -> np.ndarray:
        """The class token's attention on the patches in the last layer, mean of the heads, [rows, cols]."""
        trace = self.original if which == "original" else self.shifted
        rows, cols = trace.patch_grid
        start = trace.n_prefix_tokens
        row = trace.block_tensor("weights", trace.n_layers - 1)[:, 0, start:]  # [heads, patches], picked there
        return to_host([row.float().mean(0)])[0].astype(np.float64).reshape(rows, cols)

    def attention_change(self) -> float:
        """Total variation between the class token's attention on the shifted picture and the original's moved
        by the same number of whole patches (0 if the attention followed the content exactly)."""
        moved = np.roll(self.class_token_map("original"), self.k // self.patch_size, axis=1)
        a, b = moved / moved.sum(), self.class_token_map("shifted") / self.class_token_map("shifted").sum()
        return float(0.5 * np.abs(a - b).sum())

    def predictions(self, k: int = 5) -> pd.DataFrame:
        """The top classes of the original with their probability before and after the shift."""
        before = dict(self.original.predictions(1000))
        after = dict(self.shifted.predictions(1000))
        top = [label for label, _ in self.original.predictions(k)]
        return pd.DataFrame(
            {"class": top, "original": [before[t] for t in top], "shifted": [after.get(t, 0.0) for t in top]}
        )


def embedding_error(original: Trace, shifted: Trace, k: int) -> float:
    P = original.patch_side
    rows, cols = original.patch_grid
    with torch.inference_mode():  # on the traces' device: one number crosses to the host
        e0 = original.tensor("encoder.embed.patch").reshape(rows, cols, -1)
        e1 = shifted.tensor("encoder.embed.patch").reshape(rows, cols, -1)
        largest = (e1.float() - torch.roll(e0, k // P, dims=1).float()).abs().amax()
    return float(to_host([largest])[0])


def roll(pixels: torch.Tensor, k: int) -> torch.Tensor:
    """(C, H, W) rolled k pixels to the right (wrapping around)."""
    return torch.roll(pixels, shifts=int(k), dims=-1)


def _inputs(model: TracedModel[Any], data: bytes, name: str) -> tuple[ViT, Image.Image, torch.Tensor]:
    """The ViT, the picture as it sees it and its input tensor."""
    vit = require_vit(model)
    preprocessing = vit.preprocessing
    if preprocessing is None:  # require_vit has refused it already
        raise InputError("this ViT has no image preprocessing")
    loaded = read_image(data, name)
    return vit, preprocessing.resized(loaded.image), preprocessing(loaded.image)


def shift_study(model: TracedModel[Any], data: bytes, name: str, k: int) -> ShiftStudy:
    """Both pictures traced (what the views read: patch embeddings, last layer's Q and K, logits)."""
    vit, image, pixels = _inputs(model, data, name)
    P = vit.config.patch_size
    if not 0 <= k <= 4 * P:
        raise InputError(f"the shift must be 0 to {4 * P} pixels, got {k}")
    keep = _keep(vit.config.n_layers - 1)
    traces = vit.trace_batch(torch.stack([pixels, roll(pixels, k)]), keep=keep)
    shifted_image = Image.fromarray(np.roll(np.asarray(image), k, axis=1))
    return ShiftStudy(k, P, image, shifted_image, traces[0].compact(), traces[1].compact())


def sweep(model: TracedModel[Any], data: bytes, name: str, shifts: Sequence[int]) -> pd.DataFrame:
    """For every shift k: the embedding error, the change of the top class's probability, whether the top class
    stays; one batched pass."""
    vit, _, pixels = _inputs(model, data, name)
    keep = matching(*WANTED)
    traces = vit.trace_batch(torch.stack([roll(pixels, k) for k in shifts]), keep=keep)
    base = traces[list(shifts).index(0)] if 0 in shifts else vit.trace(pixels, keep=keep)
    label, p0 = base.predictions(1)[0]
    rows = []
    for k, t in zip(shifts, traces):
        probs = dict(t.predictions(1000))
        rows.append(
            {
                "shift (px)": int(k),
                "embedding error": embedding_error(base, t, int(k)),
                f"p({label})": probs.get(label, 0.0),
                "top class": t.predictions(1)[0][0],
                "whole patches": int(k) % base.patch_side == 0,
            }
        )
    frame = pd.DataFrame(rows)
    frame.attrs["label"], frame.attrs["p0"] = label, p0
    return frame
