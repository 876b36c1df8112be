"""Summaries of attention: how far heads look, in pixels (ViT) or in tokens (text)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "mean_attention_distance",
    "mean_attention_distance_tensor",
    "mean_token_distance",
    "mean_token_distance_tensor",
    "patch_centre_distances",
    "uniform_attention",
]


def patch_centre_distances(grid_hw: tuple[int, int], patch_size: float) -> np.ndarray:
    """Euclidean distance in pixels between the centres of every pair of patches, [N, N], row-major order."""
    rows, cols = (int(v) for v in grid_hw)
    if rows < 1 or cols < 1:
        raise ValueError(f"grid_hw must be two positive whole numbers, got {grid_hw!r}")
    r, c = np.divmod(np.arange(rows * cols), cols)
    return np.hypot(r[:, None] - r[None, :], c[:, None] - c[None, :]) * float(patch_size)


def mean_attention_distance(
    weights: np.ndarray, grid_hw: tuple[int, int], patch_size: float, n_prefix_tokens: int = 1, renormalize: bool = True
) -> np.ndarray:
    """Mean attention distance in pixels (ViT paper, Fig. 7), for every leading index of `weights`.

    weights: [..., n, n] attention over (prefix tokens + patches), n = n_prefix_tokens + rows*cols,
    patches in row-major order. For each query patch: sum_j w_ij * dist(i, j), the distance between
    patch centres in pixels; then the mean over query patches. Prefix tokens (class, distillation)
    are dropped as queries and as keys. renormalize=True rescales each query's weights over the
    patches to sum to 1, so the result is a true average distance; renormalize=False keeps the
    weights as they are (the mass on prefix tokens counts as distance 0), the common recipe.
    Returns float64 with shape weights.shape[:-2] (a 0-d array for one matrix).
    """
    w = np.asarray(weights)
    if not np.issubdtype(w.dtype, np.floating):
        w = w.astype(np.float64)
    if w.ndim < 2 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [..., n, n], got shape {w.shape}")
    n_patches = int(grid_hw[0]) * int(grid_hw[1])
    if w.shape[-1] != n_prefix_tokens + n_patches:
        raise ValueError(
            f"weights cover {w.shape[-1]} tokens but a {grid_hw[0]}x{grid_hw[1]} grid plus "
            f"{n_prefix_tokens} prefix token(s) makes {n_prefix_tokens + n_patches}"
        )
    w = w[..., n_prefix_tokens:, n_prefix_tokens:]  # [..., N, N] patches only (a view)
    # In the weights' own precision, summed in float64: float32 attention of 128 pictures is
    # hundreds of MB, and a float64 copy of it costs more than the forward pass that made it.
    distances = patch_centre_distances(grid_hw, patch_size).astype(w.dtype)  # [N, N]
    per_query = np.einsum("...ij,ij->...i", w, distances, dtype=np.float64)  # [..., N]
    if renormalize:  # dividing each row's sum by its mass on the patches = renormalising the row first
        total = w.sum(axis=-1, dtype=np.float64)
        per_query = np.divide(per_query, total, out=np.zeros_like(per_query), where=total > 0)
    return per_query.mean(axis=-1)


def mean_attention_distance_tensor(
    weights: torch.Tensor,
    grid_hw: tuple[int, int],
    patch_size: float,
    n_prefix_tokens: int = 1,
    renormalize: bool = True,
) -> torch.Tensor:
    """`mean_attention_distance` computed where the weights are (a batch of pictures' attention stays on the GPU;
    only [..., heads] figures leave it): weights [..., n, n] -> [...], float32 (float64 for float64 weights).

    Half-precision weights are widened to float32 first; the products are summed in that precision.
    """
    if weights.dim() < 2 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be [..., n, n], got shape {tuple(weights.shape)}")
    n_patches = int(grid_hw[0]) * int(grid_hw[1])
    if weights.shape[-1] != n_prefix_tokens + n_patches:
        raise ValueError(
            f"weights cover {weights.shape[-1]} tokens but a {grid_hw[0]}x{grid_hw[1]} grid plus "
            f"{n_prefix_tokens} prefix token(s) makes {n_prefix_tokens + n_patches}"
        )
    dtype = torch.float64 if weights.dtype == torch.float64 else torch.float32
    w = weights[..., n_prefix_tokens:, n_prefix_tokens:].to(dtype)  # [..., N, N] patches only
    distances = torch.from_numpy(patch_centre_distances(grid_hw, patch_size)).to(device=w.device, dtype=dtype)
    per_query = (w * distances).sum(-1)  # [..., N]
    if renormalize:  # dividing each row's sum by its mass on the patches = renormalising the row first
        total = w.sum(-1)
        per_query = torch.where(total > 0, per_query / total.clamp_min(torch.finfo(dtype).tiny), 0.0)
    return per_query.mean(-1)


def mean_token_distance_tensor(weights: torch.Tensor) -> torch.Tensor:
    """`mean_token_distance` where the weights are: [..., n_q, n_k] -> [...], float32 (float64 for float64)."""
    if weights.dim() < 2:
        raise ValueError(f"weights must be [..., n_q, n_k], got shape {tuple(weights.shape)}")
    dtype = torch.float64 if weights.dtype == torch.float64 else torch.float32
    i = torch.arange(weights.shape[-2], device=weights.device, dtype=dtype)[:, None]
    j = torch.arange(weights.shape[-1], device=weights.device, dtype=dtype)[None, :]
    return (weights.to(dtype) * (i - j).abs()).sum(-1).mean(-1)


def mean_token_distance(weights: np.ndarray) -> np.ndarray:
    """Attention-weighted mean |i - j| in tokens, averaged over queries: weights [..., n_q, n_k] -> [...].

    Query i and key j are positions in the same sequence (self-attention).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim < 2:
        raise ValueError(f"weights must be [..., n_q, n_k], got shape {w.shape}")
    i = np.arange(w.shape[-2])[:, None]
    j = np.arange(w.shape[-1])[None, :]
    return (w * np.abs(i - j)).sum(axis=-1).mean(axis=-1)


def uniform_attention(allowed: np.ndarray) -> np.ndarray:
    """The baseline the distance plots draw: each query spreads its attention evenly over the keys it may
    see. allowed: bool [..., n_q, n_k] (True = may attend) -> float64 weights of the same shape; a query
    that may see nothing gets a row of zeros."""
    allowed = np.asarray(allowed, dtype=bool)
    counts = allowed.sum(-1, keepdims=True)
    return np.divide(allowed, counts, out=np.zeros(allowed.shape), where=counts > 0)
