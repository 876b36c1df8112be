"""The logic behind "Patch embedding by hand" (Vision Transformer page): the lecture's worked example,
editable, and the same computation on one patch of a real ViT.

    steps = tc.patch_embedding_steps(LECTURE_IMAGE, LECTURE_KERNELS, 4)   # [[14, 10], [14, 12], [18, 17], [11, 9]]
    products_frame(steps)                    # every product sum written out, one row per (patch, kernel)
    real = real_patch(model, trace, patch=98)  # one patch of the user's picture through the model's own kernels

Numbering: patches from 0, row-major (patch r·cols + c), as everywhere in the app; kernels are the
components of the embedding, from 1 (kernel k gives e_k), as the lecture writes vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

from tformer_core.block_steps import PatchEmbeddingSteps, patch_embedding_steps, unpatchify
from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.trace import Trace, to_numpy

from ..pictures import tiles
from ..vision import require_vit
from .attention import dot_written_out, fmt

__all__ = [
    "LECTURE_IMAGE",
    "LECTURE_KERNELS",
    "LECTURE_PATCH",
    "MAX_KERNELS",
    "MAX_PATCH",
    "MAX_SIDE",
    "RealPatch",
    "default_image",
    "default_kernels",
    "embeddings_frame",
    "kernel_pictures",
    "patch_label",
    "patch_matrix",
    "patch_picture",
    "products_frame",
    "real_patch",
    "statement",
]

# The lecture's example: an 8 x 8 image with values 0..4, cut into four 4 x 4 patches, and two kernels.
LECTURE_IMAGE = np.array(
    [
        [1, 2, 4, 2, 2, 3, 3, 2],
        [1, 0, 2, 1, 2, 1, 1, 1],
        [2, 2, 3, 4, 3, 4, 1, 3],
        [2, 1, 3, 0, 0, 2, 3, 0],
        [3, 3, 4, 0, 2, 0, 2, 2],
        [1, 4, 4, 3, 4, 0, 4, 0],
        [1, 2, 0, 0, 0, 3, 2, 3],
        [4, 1, 4, 1, 0, 0, 0, 0],
    ],
    dtype=np.float64,
)
LECTURE_KERNELS = np.array(
    [
        [[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 0, 1], [1, 1, 0, 1]],
        [[1, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0]],
    ],
    dtype=np.float64,
)
LECTURE_PATCH = 4
MAX_SIDE = 16  # the example is read number by number: a 16 x 16 image is already 256 of them
MAX_PATCH = 8
MAX_KERNELS = 4


def default_image(height: int, width: int) -> np.ndarray:
    """The lecture's image cut to (or padded with zeros to) height x width."""
    out = np.zeros((int(height), int(width)))
    h, w = min(height, 8), min(width, 8)
    out[:h, :w] = LECTURE_IMAGE[:h, :w]
    return out


def default_kernels(n_kernels: int, patch_size: int) -> np.ndarray:
    """[n, P, P]: the lecture's two kernels where they fit (P = 4), else seeded 0/1 numbers (hand-checkable)."""
    P = int(patch_size)
    rng = np.random.default_rng(P)
    kernels = rng.integers(0, 2, size=(int(n_kernels), P, P)).astype(np.float64)
    if P == LECTURE_PATCH:
        k = min(n_kernels, len(LECTURE_KERNELS))
        kernels[:k] = LECTURE_KERNELS[:k]
    return kernels


def patch_label(patch: int, grid_hw: tuple[int, int]) -> str:
    """ "patch 5 (row 1, column 2)": patches numbered from 0, row by row."""
    cols = grid_hw[1]
    return f"patch {patch} (row {patch // cols}, column {patch % cols})"


def patch_matrix(steps: PatchEmbeddingSteps, patch: int, channel: int = 0) -> np.ndarray:
    """[P, P]: one channel of a patch as cut out of the image."""
    P = steps.patch_size
    r, c = divmod(patch, steps.grid_hw[1])
    return steps.image[channel, r * P : (r + 1) * P, c * P : (c + 1) * P]


def products_frame(steps: PatchEmbeddingSteps) -> pd.DataFrame:
    """One row per (patch, kernel): the kernel laid over the patch, every product written out, and the sum.

    Columns: "patch", "kernel", "products written out", "sum" (+ "bias" and "e_k" when there is a bias).
    """
    N, D = steps.output.shape
    rows = []
    for p in range(N):
        for k in range(D):
            written = dot_written_out(steps.patches[p], steps.weight[:, k])
            total = float(steps.products(p, k).sum())
            rows.append((p, k + 1, written, total, float(steps.bias[k]), float(steps.output[p, k])))
    frame = pd.DataFrame(rows, columns=["patch", "kernel", "products written out", "sum", "bias", "e_k"])
    return frame if np.any(steps.bias) else frame.drop(columns=["bias", "e_k"])


def embeddings_frame(steps: PatchEmbeddingSteps) -> pd.DataFrame:
    """[N, D]: row p = the embedding of patch p, column k = e_k (kernel k)."""
    D = steps.output.shape[1]
    index = pd.Index([f"patch {p}" for p in range(len(steps.output))], name="patch embeddings")
    return pd.DataFrame(steps.output, index=index, columns=[f"e{k + 1}" for k in range(D)])


def statement(steps: PatchEmbeddingSteps) -> str:
    """The equality the example shows, with its shapes (Markdown)."""
    N, CPP = steps.patches.shape
    D = steps.output.shape[1]
    P = steps.patch_size
    return (
        f"Laying each kernel over each patch and adding the products **is** a matrix product: flatten each "
        f"{P} × {P} patch row by row into {CPP} numbers (the rows of X_p, {N} × {CPP}), flatten each kernel the "
        f"same way (the columns of E, {CPP} × {D}), then **X_p E** ({N} × {D}) holds every embedding. "
        f"It is also a convolution with kernel size and stride {P}: the windows never overlap."
    )


# ---- one patch of a real model ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RealPatch:
    """Patch `patch` of a picture through a ViT's patch embedding, recomputed in float64.

    pixels [C·P·P]: the patch as the model reads it (normalised, channel first, then row, then column);
    weight [C·P·P, D]: the model's kernels flattened the same way; bias [D]; output [D] = pixels · weight
    + bias; model_output [D]: the trace's `encoder.embed.patch` row; max_difference: over every patch
    of the picture (the whole image recomputed, not only this patch).
    """

    patch: int
    grid_hw: tuple[int, int]
    patch_size: int
    channels: int
    pixels: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    output: np.ndarray
    model_output: np.ndarray
    max_difference: float

    def products(self, dim: int) -> np.ndarray:
        """[C·P·P]: each number of the patch times kernel `dim`'s number laid over it (0-based dim)."""
        return self.pixels * self.weight[:, dim]

    def sums_frame(self, n_dims: int) -> pd.DataFrame:
        """One row per output dimension (from 1): Σ products, the bias, e_k, the model's, their difference."""
        k = min(int(n_dims), len(self.output))
        sums = np.array([self.products(d).sum() for d in range(k)])
        return pd.DataFrame(
            {
                f"Σ of {len(self.pixels)} products": sums,
                "+ bias": self.bias[:k],
                "= e_k": self.output[:k],
                "the model's": self.model_output[:k],
                "difference": self.output[:k] - self.model_output[:k],
            },
            index=pd.Index([f"e{d + 1}" for d in range(k)], name=f"patch {self.patch}"),
        )

    def products_frame(self, n_dims: int) -> pd.DataFrame:
        """[C·P·P, k]: every product, one row per pixel ("R r0 c0"...), one column per output dimension."""
        k = min(int(n_dims), len(self.output))
        names = ("R", "G", "B") if self.channels == 3 else tuple(f"ch{c}" for c in range(self.channels))
        P = self.patch_size
        index = [f"{names[c]} r{r} c{q}" for c in range(self.channels) for r in range(P) for q in range(P)]
        products = np.stack([self.products(d) for d in range(k)], axis=1)
        return pd.DataFrame(products, index=pd.Index(index, name="pixel"), columns=[f"e{d + 1}" for d in range(k)])

    def first_products(self, dim: int, n: int = 4) -> str:
        """ "x1·w1 + x2·w2 + ... (+ 764 more)" for output dimension `dim` (0-based)."""
        shown = dot_written_out(self.pixels[:n], self.weight[:n, dim])
        rest = len(self.pixels) - n
        more = f" + … ({rest} more products)" if rest > 0 else ""
        bias = fmt(self.bias[dim])
        return f"{shown}{more} + {f'({bias})' if bias.startswith('-') else bias} (the bias b{dim + 1})"


def real_patch(model: TracedModel, trace: Trace, patch: int) -> RealPatch:
    """Patch `patch` (0-based, row-major) of the traced picture through the model's patch embedding.

    The picture is put back together from the trace's patches (`encoder.embed.patches`), cut and embedded
    again by `tc.patch_embedding_steps` with the model's kernels; ValueError for a patch out of range.
    """
    vit = require_vit(model)
    c = vit.config
    rows, cols = trace.patch_grid
    if not 0 <= patch < rows * cols:
        raise InputError(f"patch {patch} is out of range: the picture has {rows * cols} patches (0..{rows * cols - 1})")
    patch_weights = vit.weights().patch
    assert patch_weights is not None  # a ViT's stack embeds patches
    P, C = c.patch_size, c.n_channels
    kernels = np.array(to_numpy(patch_weights.W), dtype=np.float64)  # [D, C, P, P]
    bias = np.array(to_numpy(patch_weights.b), dtype=np.float64)
    image = unpatchify(trace["encoder.embed.patches"], (rows, cols), P, C)
    steps = patch_embedding_steps(image, kernels, P, bias)
    model_all = np.asarray(trace["encoder.embed.patch"], dtype=np.float64)
    return RealPatch(
        patch,
        (rows, cols),
        P,
        C,
        steps.patches[patch],
        steps.weight,
        bias,
        steps.output[patch],
        model_all[patch],
        float(np.max(np.abs(steps.output - model_all))),
    )


def patch_picture(image: Image.Image, grid_hw: tuple[int, int], patch: int, size: int = 160) -> Image.Image:
    """The patch cut out of the picture as the model sees it (before normalisation), enlarged pixel by pixel."""
    cols = grid_hw[1]
    P = image.width // cols
    r, c = divmod(patch, cols)
    crop = image.convert("RGB").crop((c * P, r * P, (c + 1) * P, (r + 1) * P))
    return crop.resize((size, size), Image.Resampling.NEAREST)


def kernel_pictures(real: RealPatch, n_dims: int, tile_px: int = 80) -> Image.Image:
    """The kernels of the first `n_dims` output dimensions as RGB tiles (each scaled to its own min..max)."""
    P, C = real.patch_size, real.channels
    pictures = []
    for d in range(min(int(n_dims), real.weight.shape[1])):
        kernel = real.weight[:, d].reshape(C, P, P).transpose(1, 2, 0)  # [P, P, C]
        lo, hi = kernel.min(), kernel.max()
        rgb = np.round((kernel - lo) / ((hi - lo) or 1.0) * 255).astype(np.uint8)
        rgb = np.repeat(rgb, 3, axis=-1) if C == 1 else rgb[..., :3]
        pictures.append(Image.fromarray(rgb).resize((tile_px, tile_px), Image.Resampling.NEAREST))
    return tiles(pictures, [f"e{d + 1}" for d in range(len(pictures))], 8, tile_px, gap=6)
