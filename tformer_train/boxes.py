"""Boxes for the bundled DETR: conversions, IoU and generalised IoU, and the exact one-to-one matching of
predictions to objects its loss and its evaluation use.

    xyxy = cxcywh_to_xyxy(boxes)             # (..., 4) centre x, centre y, width, height -> x0, y0, x1, y1
    iou, union = box_iou(a, b)               # (N, M) each, for boxes (N, 4) and (M, 4) as x0, y0, x1, y1
    generalized_iou(a, b)                    # (N, M): IoU minus the share of the enclosing box neither covers
                                             # (both take a batch: (B, N, 4), (B, M, 4) -> (B, N, M))
    rows, cols = assign(cost)                # cost (Q, T), T <= Q: the T distinct rows of least total cost

GIoU is Rezatofighi et al. 2019, as DETR's loss uses it. `assign` tries every way of giving each of the T
columns its own row (Q! / (Q - T)! of them, 5,040 for 10 queries and 4 objects): exact, and small enough at
this size that a Hungarian solver (scipy's, which the project does not depend on) is not needed.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np
import torch

MAX_ASSIGNMENTS = 200_000  # Q! / (Q - T)! above this is refused: brute force is meant for a few objects


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) centre x, centre y, width, height -> (..., 4) x0, y0, x1, y1 (same units)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) x0, y0, x1, y1 -> (..., 4) centre x, centre y, width, height (same units)."""
    x0, y0, x1, y1 = boxes.unbind(-1)
    return torch.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], dim=-1)


def _area(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairwise IoU and union area of boxes a (..., N, 4) and b (..., M, 4), x0, y0, x1, y1: ((..., N, M) each);
    leading dimensions (a batch) broadcast."""
    top_left = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])  # (..., N, M, 2)
    bottom_right = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)  # (..., N, M)
    union = _area(a)[..., :, None] + _area(b)[..., None, :] - inter
    return inter / union, union


def generalized_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise generalised IoU of boxes a (..., N, 4) and b (..., M, 4), x0, y0, x1, y1: (..., N, M) in [-1, 1].

    IoU - (C - union) / C, C the area of the smallest box enclosing both: unlike IoU it still says how far
    apart two boxes are when they do not overlap, so its gradient moves a box that misses its object.
    """
    iou, union = box_iou(a, b)
    top_left = torch.minimum(a[..., :, None, :2], b[..., None, :, :2])
    bottom_right = torch.maximum(a[..., :, None, 2:], b[..., None, :, 2:])
    enclosing = (bottom_right - top_left).clamp(min=0).prod(-1)
    return iou - (enclosing - union) / enclosing


@lru_cache(maxsize=64)
def _injections(n_rows: int, n_cols: int) -> np.ndarray:
    """(P, n_cols) every way of giving each column its own row, P = n_rows! / (n_rows - n_cols)!."""
    return np.array(list(itertools.permutations(range(n_rows), n_cols)), dtype=np.int64).reshape(-1, n_cols)


def assign(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-cost one-to-one matching of the T columns of `cost` (Q, T), T <= Q, to distinct rows.

    Returns (rows (T,), columns (T,) = 0..T-1): column j is matched to row rows[j]. Exact: every matching is
    tried; among equal totals, the first in lexicographic order of rows wins (deterministic). ValueError when
    T > Q or the matchings number more than MAX_ASSIGNMENTS.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2:
        raise ValueError(f"cost must be a (rows, columns) matrix, got shape {cost.shape}")
    n_rows, n_cols = cost.shape
    if n_cols > n_rows:
        raise ValueError(f"{n_cols} columns cannot each get their own row out of {n_rows}")
    if n_cols == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if math.perm(n_rows, n_cols) > MAX_ASSIGNMENTS:
        raise ValueError(f"{n_rows} x {n_cols} is too large for the exact search ({math.perm(n_rows, n_cols):,} ways)")
    ways = _injections(n_rows, n_cols)  # (P, T)
    totals = cost[ways, np.arange(n_cols)].sum(1)  # (P,)
    return ways[int(totals.argmin())].copy(), np.arange(n_cols)
