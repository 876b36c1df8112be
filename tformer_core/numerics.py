"""The softmax every part of the project uses: the model's weights recomputed, predictions, the lessons."""

from __future__ import annotations

import numpy as np


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
