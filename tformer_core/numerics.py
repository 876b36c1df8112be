"""The softmax every part of the project uses (predictions, the lessons), and how a head's logits become the
scores shown."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["SCORINGS", "head_scores", "head_scores_tensor", "softmax", "top_k_scores"]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along `axis` in float64; a slice that is entirely -inf (nothing to attend to) becomes all 0.

    The slice's maximum is subtracted before exp (it cancels in the ratio), so large inputs do not overflow.
    """
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x, axis=axis, keepdims=True)
    empty = ~np.isfinite(top)
    e = np.exp(x - np.where(empty, 0.0, top))
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


SCORINGS = ("softmax", "sigmoid", "none")


def head_scores(logits: np.ndarray, how: str = "softmax") -> np.ndarray:
    """A head's logits as the scores shown, float64 (as transformers' pipelines turn them): "softmax" over the
    last axis (a vocabulary, or single-label classes), "sigmoid" of each (multi-label classes: they need not
    sum to 1), "none" (a regression head: the numbers themselves)."""
    if how not in SCORINGS:
        raise ValueError(f"scores are one of {SCORINGS}, not {how!r}")
    x = np.asarray(logits, dtype=np.float64)
    if how == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    return softmax(x) if how == "softmax" else x


def head_scores_tensor(logits: torch.Tensor, how: str = "softmax") -> torch.Tensor:
    """`head_scores` on a tensor, where it is (a GPU's logits stay there): float32, or float64 for float64 logits
    (half-precision logits are widened first, as transformers' pipelines do before their softmax)."""
    if how not in SCORINGS:
        raise ValueError(f"scores are one of {SCORINGS}, not {how!r}")
    x = logits if logits.dtype == torch.float64 else logits.float()
    if how == "sigmoid":
        return torch.sigmoid(x)
    return torch.softmax(x, dim=-1) if how == "softmax" else x


def top_k_scores(logits: torch.Tensor, k: int, how: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [..., k] long, scores [..., k]) of the k highest scores (`head_scores_tensor`) along the last axis,
    highest first, computed on the logits' device. Equal scores come in order of id, as a stable sort of the
    whole row orders them (bfloat16 logits tie often)."""
    scores = head_scores_tensor(logits, how)
    k = min(max(int(k), 0), scores.shape[-1])
    values, ids = torch.topk(scores, k, dim=-1)
    ids, by_id = ids.sort(dim=-1)
    values, by_score = values.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, by_score), values
