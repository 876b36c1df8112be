"""What the Masked autoencoder page shows (no Streamlit): the random mask on the user's picture, the
reconstruction of the masked patches and the error per patch.

    r = analyse(model, data, name, seed=0)     # one traced pass with the patches `seed` masks
    masked_picture(r.image, r.mask, r.patch_size), reconstruction(r), patch_errors(r)
    mask_only(data, name, seed)                 # the masking without a checkpoint (224 px, 16-px patches, 75 %)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.inputs.image_file import read_image
from tformer_core.inputs.preprocessing import ImagePreprocessing
from tformer_core.models.base import TracedModel
from tformer_core.models.mae import MAE, random_mask
from tformer_core.trace import Trace

__all__ = ["MASK_GREY", "MAEResult", "analyse", "mask_only", "masked_picture", "patch_errors", "reconstruction"]

MASK_GREY = 128


@dataclass(frozen=True, eq=False)
class MAEResult:
    """image: as the model sees it (224 x 224), before normalisation; pixels: the normalised input [C, H, W];
    mean, std: the normalisation; norm_pix_loss: the model was trained to predict each patch's pixels
    normalised by the patch's own mean and spread (its predictions are in those units)."""

    image: Image.Image
    pixels: np.ndarray
    trace: Trace
    mean: tuple[float, ...]
    std: tuple[float, ...]
    norm_pix_loss: bool

    @property
    def mask(self) -> np.ndarray:
        """[patches] 1 where a patch was masked, in the picture's order."""
        return np.asarray(self.trace["encoder.embed.mask"])

    @property
    def patch_size(self) -> int:
        return self.trace.patch_side


def analyse(model: TracedModel[Any], data: bytes, name: str, seed: int) -> MAEResult:
    if not isinstance(model, MAE) or model.preprocessing is None:
        raise InputError("this page shows masked autoencoders (ViT-MAE checkpoints, e.g. facebook/vit-mae-base)")
    loaded = read_image(data, name)
    pre = model.preprocessing
    pixels = pre(loaded.image)
    last = model.config.n_layers - 1
    keep = matching("head.pixels", f"encoder.{last}.attn.q", f"encoder.{last}.attn.k")
    trace = model.trace(pixels, seed=int(seed), keep=keep)
    image = pre.resized(loaded.image)
    return MAEResult(image, pixels.numpy(), trace, tuple(pre.mean), tuple(pre.std), model.config.norm_pix_loss)


def masked_picture(image: Image.Image, mask: np.ndarray, patch: int) -> Image.Image:
    """The picture with its masked patches grey: what the encoder does not see."""
    a = np.asarray(image.convert("RGB")).copy()
    cols = a.shape[1] // patch
    for i in np.flatnonzero(mask):
        r, c = divmod(int(i), cols)
        a[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = MASK_GREY
    return Image.fromarray(a)


def mask_only(
    data: bytes, name: str, seed: int, size: int = 224, patch: int = 16, ratio: float = 0.75
) -> tuple[Image.Image, np.ndarray]:
    """(picture resized to size x size, mask [patches]): the masking shown without a checkpoint."""
    image = ImagePreprocessing(resize=("exact", (size, size))).resized(read_image(data, name).image)
    return image, random_mask((size // patch) ** 2, ratio, seed)


def _patches(pixels: np.ndarray, patch: int) -> np.ndarray:
    """[C, H, W] -> [N, P*P*C] in MAE's (row, column, channel) order."""
    C, H, W = pixels.shape
    x = pixels.reshape(C, H // patch, patch, W // patch, patch).transpose(1, 3, 2, 4, 0)
    return x.reshape((H // patch) * (W // patch), patch * patch * C)


def _targets(r: MAEResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the loss's targets [N, P*P*C], each patch's mean and std in the input's units)."""
    target = _patches(r.pixels, r.patch_size).astype(np.float64)
    mean = target.mean(-1, keepdims=True)
    std = np.sqrt(target.var(-1, ddof=1, keepdims=True) + 1e-6)
    if r.norm_pix_loss:
        return (target - mean) / std, mean, std
    return target, np.zeros_like(mean), np.ones_like(std)


def patch_errors(r: MAEResult) -> np.ndarray:
    """Mean squared error of every masked patch, in the loss's units, [rows, cols] (NaN on the kept ones)."""
    target, _, _ = _targets(r)
    pixels, mask = r.trace.fetch("head.pixels", "encoder.embed.mask")  # one transfer from a GPU
    err = ((np.asarray(pixels, dtype=np.float64) - target) ** 2).mean(-1)
    rows, cols = r.trace.patch_grid
    return np.where(mask.astype(bool), err, np.nan).reshape(rows, cols)


def reconstruction(r: MAEResult, paste_visible: bool = True) -> Image.Image:
    """The predicted patches back in pixels (per-patch normalisation undone with the true patch's mean and
    spread when the model was trained so, as the MAE paper's figures do); the visible patches pasted in."""
    _, mean, std = _targets(r)
    pixels, mask = r.trace.fetch("head.pixels", "encoder.embed.mask")  # one transfer from a GPU
    predicted = np.asarray(pixels, dtype=np.float64) * std + mean  # [N, P*P*C], input units
    if paste_visible:
        keep = ~mask.astype(bool)
        predicted[keep] = _patches(r.pixels, r.patch_size)[keep]
    C, H, W = r.pixels.shape
    P, (rows, cols) = r.patch_size, r.trace.patch_grid
    x = predicted.reshape(rows, cols, P, P, C).transpose(4, 0, 2, 1, 3).reshape(C, H, W)
    x = x * np.asarray(r.std)[:, None, None] + np.asarray(r.mean)[:, None, None]
    return Image.fromarray((x.transpose(1, 2, 0).clip(0, 1) * 255).round().astype(np.uint8))
