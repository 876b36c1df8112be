"""The rest of a Transformer block as worked examples: LayerNorm, RMSNorm, the feed-forward network, and
the ViT's patch embedding, on numpy arrays in float64, keeping every intermediate.

    ln = layer_norm_steps(x, gamma, beta, eps=1e-5)    # ln.mean, ln.var, ln.normalized, ln.output
    rms = rms_norm_steps(x, gamma, eps=1e-6)           # rms.rms, rms.normalized, rms.output
    ffn = ffn_steps(x, W1, b1, W2, b2, "gelu")         # ffn.hidden_pre, ffn.hidden, ffn.output
    pe = patch_embedding_steps(image, kernels, 4)      # pe.patches, pe.weight, pe.output, pe.grid_hw

Weights are in the lecture's orientation: y = x W + b with W [d_in, d_out] (a torch `nn.Linear` stores
W^T). The pages "Inside a block" and "Vision Transformer" print these fields; the tests compare them
with torch.nn.LayerNorm, torch.nn.RMSNorm, the model's own FFN and torch.nn.functional.conv2d.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .errors import InputError

__all__ = [
    "FFN_ACTIVATIONS",
    "FFNSteps",
    "LayerNormSteps",
    "PatchEmbeddingSteps",
    "RMSNormSteps",
    "activate",
    "ffn_steps",
    "layer_norm_steps",
    "patch_embedding_steps",
    "rms_norm_steps",
    "unpatchify",
]

# The activations of the core's models (tformer_core.models.layers.ACTIVATIONS), computed in float64.
FFN_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def _array(name: str, value: object, ndims: tuple[int, ...]) -> np.ndarray:
    """`value` as a finite float64 array with one of the allowed numbers of dimensions; ValueError otherwise."""
    try:
        a = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must hold numbers only") from None
    if a.ndim not in ndims or 0 in a.shape:
        wanted = " or ".join(f"{n}-D" for n in ndims)
        raise InputError(f"{name} must be a non-empty {wanted} array, got shape {a.shape}")
    if not np.isfinite(a).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise InputError(f"{name}{list(where)} is not a finite number")
    return a


def _vector(name: str, value: object | None, size: int, default: float) -> np.ndarray:
    """A parameter vector of `size` numbers (all `default` when None)."""
    if value is None:
        return np.full(size, default)
    v = _array(name, value, (1, 2)).reshape(-1)
    if v.size != size:
        raise InputError(f"{name} has {v.size} numbers but x has {size} dimensions (d_model): give one per dimension")
    return v


def _eps(eps: float) -> float:
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise InputError(f"eps must be a number, got {eps!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise InputError(f"eps must be a positive number (it keeps the division away from 0), got {eps!r}")
    return value


# ---- normalisation ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LayerNormSteps:
    """LayerNorm of each row of x [n, d]: mean [n], var [n] (biased: divided by d, as LayerNorm does),
    std [n] = sqrt(var + eps), centred = x - mean [n, d], normalized = centred / std [n, d],
    gamma, beta [d], output = gamma * normalized + beta [n, d]."""

    x: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    std: np.ndarray
    centred: np.ndarray
    normalized: np.ndarray
    gamma: np.ndarray
    beta: np.ndarray
    eps: float
    output: np.ndarray


def layer_norm_steps(
    x: object, gamma: object | None = None, beta: object | None = None, eps: float = 1e-5
) -> LayerNormSteps:
    """LayerNorm over the last axis, in float64: mu = (1/d) sum_i x_i, sigma^2 = (1/d) sum_i (x_i - mu)^2,
    x_hat = (x - mu) / sqrt(sigma^2 + eps), y = gamma * x_hat + beta.

    x: [n, d] (one row per token) or [d] (one token, returned as [1, d]). gamma, beta: [d] (default 1 and 0).
    eps > 0. Raises ValueError naming what does not fit.
    """
    x = np.atleast_2d(_array("x", x, (1, 2)))
    d = x.shape[1]
    g, b, e = _vector("gamma", gamma, d, 1.0), _vector("beta", beta, d, 0.0), _eps(eps)
    mean = x.mean(axis=1)
    centred = x - mean[:, None]
    var = (centred**2).mean(axis=1)
    std = np.sqrt(var + e)
    normalized = centred / std[:, None]
    return LayerNormSteps(x, mean, var, std, centred, normalized, g, b, e, normalized * g + b)


@dataclass(frozen=True, eq=False)
class RMSNormSteps:
    """RMSNorm of each row of x [n, d]: mean_square [n], rms [n] = sqrt(mean_square + eps),
    normalized = x / rms [n, d], gamma [d], output = gamma * normalized [n, d]. No mean, no beta."""

    x: np.ndarray
    mean_square: np.ndarray
    rms: np.ndarray
    normalized: np.ndarray
    gamma: np.ndarray
    eps: float
    output: np.ndarray


def rms_norm_steps(x: object, gamma: object | None = None, eps: float = 1e-6) -> RMSNormSteps:
    """RMSNorm (T5, LLaMA) over the last axis, in float64: rms = sqrt((1/d) sum_i x_i^2 + eps), y = gamma * x / rms.

    x: [n, d] or [d] (returned as [1, d]). gamma: [d] (default 1). eps > 0, added inside the root as
    torch.nn.RMSNorm does.
    """
    x = np.atleast_2d(_array("x", x, (1, 2)))
    g, e = _vector("gamma", gamma, x.shape[1], 1.0), _eps(eps)
    mean_square = (x**2).mean(axis=1)
    rms = np.sqrt(mean_square + e)
    normalized = x / rms[:, None]
    return RMSNormSteps(x, mean_square, rms, normalized, g, e, normalized * g)


# ---- the feed-forward network -----------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FFNSteps:
    """FFN(x) = act(x W1 + b1) W2 + b2 on x [n, d_model]: hidden_pre [n, d_ff] (before the activation),
    gate [n, d_ff] (gated FFNs only: x W_gate + b_gate, hidden = act(gate) * hidden_pre), hidden [n, d_ff]
    (after it), output [n, d_model]; active [n]: hidden units with a positive input (act(h) > 0 there)."""

    x: np.ndarray
    hidden_pre: np.ndarray
    gate: np.ndarray | None
    hidden: np.ndarray
    output: np.ndarray
    activation: str

    @property
    def active(self) -> np.ndarray:
        """Hidden units per row whose activation input is positive (the units ReLU lets through)."""
        return ((self.hidden_pre if self.gate is None else self.gate) > 0).sum(axis=1)

    @property
    def activated(self) -> np.ndarray:
        """[n, d_ff]: the activation's output, act(hidden_pre), or act(gate) for a gated FFN (before ⊙)."""
        return self.hidden if self.gate is None else activate(self.gate, self.activation)


def activate(h: np.ndarray, activation: str) -> np.ndarray:
    """relu, gelu (exact, with erf: BERT, ViT), gelu_tanh (GPT-2's approximation) or silu, in float64."""
    if activation not in FFN_ACTIVATIONS:
        raise InputError(f"activation must be one of {FFN_ACTIVATIONS}, got {activation!r}")
    t = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float64))
    if activation == "relu":
        out = F.relu(t)
    elif activation == "gelu":
        out = F.gelu(t)
    elif activation == "gelu_tanh":
        out = F.gelu(t, approximate="tanh")
    else:
        out = F.silu(t)
    return out.numpy()


def _linear(name: str, W: object, b: object | None, d_in: int) -> tuple[np.ndarray, np.ndarray]:
    W = _array(name, W, (2,))
    if W.shape[0] != d_in:
        raise InputError(f"{name} is {W.shape[0]} × {W.shape[1]} but the input has {d_in} columns: needs {d_in} rows")
    bias_name = "b" + name[1:]
    if b is None:
        return W, np.zeros(W.shape[1])
    b = _array(bias_name, b, (1, 2)).reshape(-1)
    if b.size != W.shape[1]:
        raise InputError(f"{bias_name} has {b.size} numbers but {name} has {W.shape[1]} columns: one per column")
    return W, b


def ffn_steps(
    x: object,
    W1: object,
    b1: object | None,
    W2: object,
    b2: object | None,
    activation: str = "relu",
    *,
    W_gate: object | None = None,
    b_gate: object | None = None,
) -> FFNSteps:
    """The position-wise feed-forward network, in float64: hidden = act(x W1 + b1), output = hidden W2 + b2.

    x: [n, d_model] or [d_model] (returned as [1, d_model]). W1: [d_model, d_ff], b1: [d_ff] or None;
    W2: [d_ff, d_model], b2: [d_model] or None. activation: one of FFN_ACTIVATIONS. With W_gate
    [d_model, d_ff] (T5 v1.1's gated GELU): hidden = act(x W_gate + b_gate) * (x W1 + b1).
    """
    x = np.atleast_2d(_array("x", x, (1, 2)))
    W1, b1 = _linear("W1", W1, b1, x.shape[1])
    W2, b2 = _linear("W2", W2, b2, W1.shape[1])
    hidden_pre = x @ W1 + b1  # [n, d_ff]
    gate = None
    if W_gate is None:
        hidden = activate(hidden_pre, activation)
    else:
        Wg, bg = _linear("W_gate", W_gate, b_gate, x.shape[1])
        if Wg.shape != W1.shape:
            raise InputError(f"W_gate is {Wg.shape[0]} × {Wg.shape[1]} but W1 is {W1.shape[0]} × {W1.shape[1]}")
        gate = x @ Wg + bg
        hidden = activate(gate, activation) * hidden_pre
    return FFNSteps(x, hidden_pre, gate, hidden, hidden @ W2 + b2, activation)


# ---- the ViT's patch embedding ---------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PatchEmbeddingSteps:
    """A stride-P convolution written as a matrix product.

    image [C, H, W]; kernels [D, C, P, P]; grid_hw = (H/P, W/P); patches [N, C·P·P]: patch r·cols + c
    (row-major), flattened channel first, then row, then column; weight [C·P·P, D]: kernel k flattened
    the same way as column k; bias [D]; output [N, D] = patches @ weight + bias.
    """

    image: np.ndarray
    kernels: np.ndarray
    patch_size: int
    grid_hw: tuple[int, int]
    patches: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    output: np.ndarray

    def products(self, patch: int, kernel: int) -> np.ndarray:
        """[C·P·P]: each pixel of `patch` times the kernel's number laid over it (their sum + bias is output)."""
        return self.patches[patch] * self.weight[:, kernel]


def _patch_inputs(image: object, kernels: object, patch_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    image = _array("image", image, (2, 3))
    image = image[None] if image.ndim == 2 else image  # [C, H, W]
    kernels = _array("kernels", kernels, (3, 4))
    kernels = kernels[:, None] if kernels.ndim == 3 else kernels  # [D, C, P, P]
    if int(patch_size) != patch_size or patch_size < 1:
        raise InputError(f"the patch size must be a whole number ≥ 1, got {patch_size!r}")
    P = int(patch_size)
    C, H, W = image.shape
    if H % P or W % P:
        raise InputError(f"a patch size of {P} does not divide the {H} × {W} image: H and W must be multiples of {P}")
    if kernels.shape[2:] != (P, P):
        raise InputError(f"each kernel must be {P} × {P} (the patch size), got {kernels.shape[2]} × {kernels.shape[3]}")
    if kernels.shape[1] != C:
        raise InputError(f"the kernels have {kernels.shape[1]} channels but the image has {C}")
    return image, kernels, P


def patch_embedding_steps(
    image: object, kernels: object, patch_size: int, bias: object | None = None
) -> PatchEmbeddingSteps:
    """Cut the image into P x P patches, flatten each, and multiply by the flattened kernels, in float64.

    image: [H, W] (one channel) or [C, H, W]; kernels: [D, P, P] or [D, C, P, P]; bias: [D] or None.
    H and W must be multiples of P. The result equals a convolution with stride P
    (torch.nn.functional.conv2d(image, kernels, bias, stride=P)), read patch by patch, row-major.
    """
    image, kernels, P = _patch_inputs(image, kernels, patch_size)
    C, H, W = image.shape
    D = kernels.shape[0]
    b = np.zeros(D) if bias is None else _array("bias", bias, (1,))
    if b.size != D:
        raise InputError(f"the bias has {b.size} numbers but there are {D} kernels: one per kernel")
    rows, cols = H // P, W // P
    grid = image.reshape(C, rows, P, cols, P).transpose(1, 3, 0, 2, 4)  # [rows, cols, C, P, P]
    patches = grid.reshape(rows * cols, C * P * P)  # [N, C·P·P]
    weight = kernels.reshape(D, C * P * P).T  # [C·P·P, D]
    return PatchEmbeddingSteps(image, kernels, P, (rows, cols), patches, weight, b, patches @ weight + b)


def unpatchify(patches: object, grid_hw: tuple[int, int], patch_size: int, channels: int) -> np.ndarray:
    """The inverse of the core's `patchify` for one image: [N, C·P·P] (channel-first patches) -> [C, H, W]."""
    rows, cols = grid_hw
    P, C = int(patch_size), int(channels)
    a = _array("patches", patches, (2,))
    if a.shape != (rows * cols, C * P * P):
        raise InputError(f"expected {rows * cols} patches of {C * P * P} numbers, got shape {a.shape}")
    return a.reshape(rows, cols, C, P, P).transpose(2, 0, 3, 1, 4).reshape(C, rows * P, cols * P)
