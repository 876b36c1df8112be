"""High-norm tokens of a Vision Transformer: the length of every token of the residual stream, per layer, over the
patch grid, and the patches whose length stands out (Darcet et al. 2024, "Vision Transformers Need Registers").

Darcet et al. found that large ViTs trained long enough (DINOv2, OpenCLIP, DeiT-III) recycle a few patches of
low information, mostly background, to hold global information: from the middle layers on those tokens have
norms far above the others' (DINOv2 ViT-L: above 150 where the bulk of the patches is under 100), and attention
maps show them as bright spots away from the object. Registers, extra tokens without a patch, take that role over.

    norms = token_norms(trace)           # every layer's resid_post: [layers, rows, cols] per patch, prefix apart
    norms.max_ratio                      # [layers]: the longest patch over the layer's median patch
    norms.artefacts(layer)               # the patches found by the rule below, longest first
    norms.prefix_norms                   # [layers, n_prefix]: [CLS] and the registers, not counted in the median

The rule: a patch is an artefact when its norm is more than ARTEFACT_RATIO (4) times the median patch norm of the
same layer. A ratio, not Darcet et al.'s absolute line at 150: norms grow with a model's width and depth, so a
cut-off that fits ViT-L says nothing about a tiny ViT. The median, not the mean: a few tokens many times longer
than the rest would pull a mean up; the median of hundreds of patches stays where the typical patch is. 4: well
above what a model without artefacts reaches (DeiT-Tiny's longest patch: 2.44 times its layer's median, layer 11
on assets/samples/coffee.jpg, the most over the bundled and shared photos; tests/core/test_artefacts.py), so the
line is crossed only by tokens of another kind, as Darcet et al.'s are (a mode of the histogram of its own, not
its tail). Whether 4 is where a real DINOv2's artefacts sit has not been measured here (no DINOv2 weights
offline); it is a parameter, so a notebook can move the line and see what changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import InputError
from .trace import Trace, to_host

__all__ = ["ARTEFACT_RATIO", "Artefact", "TokenNorms", "token_norms"]

ARTEFACT_RATIO = 4.0  # a patch longer than this many times its layer's median patch is an artefact


@dataclass(frozen=True)
class Artefact:
    """One high-norm patch: its layer, row and column in the grid, index among the patches (row-major), norm and
    norm over its layer's median patch norm."""

    layer: int
    row: int
    col: int
    patch: int
    norm: float
    ratio: float


@dataclass(frozen=True, eq=False)
class TokenNorms:
    """The L2 norm of every token of the residual stream after each layer (`{stack}.{layer}.resid_post`).

    patch_norms: [layers, rows, cols], float64, the patches in their place on the grid; prefix_norms: [layers,
    n_prefix] the tokens before the patches ([CLS], DeiT's [DIST], the registers), named by prefix_tokens;
    median: [layers] the median patch norm of each layer (prefix tokens left out); threshold: the ratio to the
    median above which a patch counts as an artefact.
    """

    stack: str
    patch_norms: np.ndarray
    prefix_norms: np.ndarray
    prefix_tokens: tuple[str, ...]
    median: np.ndarray
    threshold: float = ARTEFACT_RATIO

    @property
    def n_layers(self) -> int:
        return int(self.patch_norms.shape[0])

    @property
    def grid_hw(self) -> tuple[int, int]:
        return int(self.patch_norms.shape[1]), int(self.patch_norms.shape[2])

    @property
    def ratio(self) -> np.ndarray:
        """[layers, rows, cols]: each patch's norm over its layer's median patch norm (1 = a typical patch)."""
        return self.patch_norms / self.median[:, None, None]

    @property
    def prefix_ratio(self) -> np.ndarray:
        """[layers, n_prefix]: each prefix token's norm over its layer's median patch norm."""
        return self.prefix_norms / self.median[:, None]

    @property
    def max_ratio(self) -> np.ndarray:
        """[layers]: the longest patch of each layer over its median patch."""
        return self.ratio.reshape(self.n_layers, -1).max(axis=1)

    @property
    def mask(self) -> np.ndarray:
        """[layers, rows, cols] bool: True where a patch is an artefact (ratio > threshold)."""
        return self.ratio > self.threshold

    def artefacts(self, layer: int | None = None) -> list[Artefact]:
        """The artefact patches of one layer (every layer's with None), longest first (by ratio)."""
        layers = range(self.n_layers) if layer is None else [self.layer_index(layer)]
        cols = self.grid_hw[1]
        found = [
            Artefact(
                l, int(r), int(c), int(r) * cols + int(c), float(self.patch_norms[l, r, c]), float(self.ratio[l, r, c])
            )
            for l in layers
            for r, c in zip(*np.nonzero(self.mask[l]), strict=True)
        ]
        return sorted(found, key=lambda a: -a.ratio)

    def largest(self, layer: int | None = None) -> Artefact:
        """The patch with the largest ratio to its layer's median (an artefact or not), in `layer` or in any."""
        ratio = self.ratio if layer is None else self.ratio[self.layer_index(layer)][None]
        flat = int(np.argmax(ratio))
        per_layer = self.grid_hw[0] * self.grid_hw[1]
        found, rest = divmod(flat, per_layer)
        found = found if layer is None else self.layer_index(layer)
        row, col = divmod(rest, self.grid_hw[1])
        norm, share = float(self.patch_norms[found, row, col]), float(self.ratio[found, row, col])
        return Artefact(found, row, col, rest, norm, share)

    def layer_index(self, layer: int) -> int:
        """`layer` checked: InputError when the stack has no such layer."""
        if not 0 <= layer < self.n_layers:
            raise InputError(
                f"layer {layer} is out of range: the stack has {self.n_layers} layers (0..{self.n_layers - 1})"
            )
        return int(layer)


def token_norms(trace: Trace, stack: str = "encoder", threshold: float = ARTEFACT_RATIO) -> TokenNorms:
    """Every token's L2 norm after every layer of a vision trace's `stack` (its `resid_post`), computed where the
    trace is (float64, float32 on Apple's GPUs) and copied to the host once: [layers, tokens] numbers in all.
    InputError for a trace without a patch grid, or one made without the residual stream (`keep=`)."""
    if trace.grid_hw is None:
        raise InputError("token norms over the patch grid need a vision trace (a ViT's); this one has no patch grid")
    if not np.isfinite(threshold) or threshold <= 1:
        raise InputError(f"the artefact threshold is a ratio to the median norm above 1, got {threshold}")
    n_layers = trace.stack_layers.get(stack, 0)
    names = [f"{stack}.{layer}.resid_post" for layer in range(n_layers)]
    missing = [name for name in names if name not in trace]
    if not names or missing:
        raise InputError(
            f"this trace does not hold the residual stream ({(missing or [stack])[0]}): trace without keep="
        )
    exact = torch.float32 if trace.device.type == "mps" else torch.float64
    with torch.inference_mode():
        norms = torch.stack([torch.linalg.vector_norm(trace.tensor(n).to(exact), dim=-1) for n in names])  # [L, T]
    table = np.asarray(to_host([norms])[0], dtype=np.float64)
    prefix = trace.n_prefix_tokens
    rows, cols = trace.patch_grid
    patches = table[:, prefix:].reshape(n_layers, rows, cols)
    median = np.median(patches.reshape(n_layers, -1), axis=1)
    median = np.where(median > 0, median, np.finfo(np.float64).tiny)  # an all-zero stream: ratios are then huge
    return TokenNorms(stack, patches, table[:, :prefix], tuple(trace.tokens[:prefix]), median, float(threshold))
