"""Scaled dot-product attention on small numpy matrices, keeping every intermediate.

This is the lecture's worked example as a function: the page "Attention, step by step" prints
each field. Everything is computed in float64 so hand-checked numbers match to the last digit
shown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import attend_float64
from .errors import InputError

__all__ = ["AttentionSteps", "attention_from_qkv", "attention_steps"]


@dataclass(frozen=True)
class AttentionSteps:
    """Every intermediate of attention on X (n x d_model).

    Single head (n_heads == 1): Q, K [n, d_k]; V [n, d_v]; scores = Q K^T, scaled = scores / sqrt(d_k)
    with masked cells at -inf, weights = row-wise softmax (masked cells 0) [n, n]; output [n, d_v]
    (or [n, d_out] when W_o is given).

    Several heads: Q, K, V stay full width [n, h*d_k]; q_heads, k_heads, v_heads [h, n, d_k] are their
    column blocks; scores, scaled, weights [h, n, n]; z [h, n, d_v] per head; concat [n, h*d_v];
    output = concat W^O (concat itself without W_o).
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    q_heads: np.ndarray
    k_heads: np.ndarray
    v_heads: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    weights: np.ndarray
    z: np.ndarray
    concat: np.ndarray
    output: np.ndarray
    mask: np.ndarray | None
    n_heads: int
    d_k: int
    scale: float


def _matrix(name: str, value: object) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must hold numbers only") from None
    if a.ndim != 2 or 0 in a.shape:
        raise InputError(f"{name} must be a non-empty 2-D matrix, got shape {a.shape}")
    if not np.isfinite(a).all():
        r, c = np.argwhere(~np.isfinite(a))[0]
        raise InputError(f"{name}[{r}, {c}] is not a finite number")
    return a


def _mask(mask: object, n: int, n_k: int | None = None) -> np.ndarray | None:
    """None, "causal", a key-padding vector [n_k] (True = real token) or a full [n, n_k] mask (True = may attend).

    n queries, n_k keys (n_k = n for self-attention)."""
    n_k = n if n_k is None else n_k
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise InputError(f"mask must be None, 'causal' or a boolean array, got {mask!r}")
        return np.tril(np.ones((n, n_k), dtype=bool))
    m = np.asarray(mask)
    if m.dtype != bool:
        if not np.isin(m, (0, 1)).all():
            raise InputError("a mask holds True/False (or 1/0): True where a query may attend to a key")
        m = m.astype(bool)
    if m.shape == (n_k,):
        return np.broadcast_to(m[None, :], (n, n_k)).copy()
    if m.shape != (n, n_k):
        raise InputError(f"the mask must have shape ({n_k},) or ({n}, {n_k}) for {n} tokens, got {m.shape}")
    return m


def _checked_inputs(
    X: object, W_q: object, W_k: object, W_v: object, n_heads: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The inputs as float64 matrices whose shapes fit together, and the number of heads; ValueError otherwise."""
    X = _matrix("X", X)
    W_q, W_k, W_v = _matrix("W_q", W_q), _matrix("W_k", W_k), _matrix("W_v", W_v)
    d_model = X.shape[1]
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        if W.shape[0] != d_model:
            raise InputError(f"{name} has {W.shape[0]} rows but X has {d_model} columns (d_model)")
    if W_q.shape[1] != W_k.shape[1]:
        raise InputError(f"W_q and W_k must have the same number of columns (d_k): {W_q.shape[1]} vs {W_k.shape[1]}")
    if int(n_heads) != n_heads or n_heads < 1:
        raise InputError(f"n_heads must be a whole number >= 1, got {n_heads!r}")
    h = int(n_heads)
    for name, W in (("W_q", W_q), ("W_v", W_v)):
        if W.shape[1] % h:
            raise InputError(f"{name} has {W.shape[1]} columns, which do not split into {h} equal heads")
    return X, W_q, W_k, W_v, h


def _output_matrix(W_o: object, rows: int) -> np.ndarray:
    W_o = _matrix("W_o", W_o)
    if W_o.shape[0] != rows:
        raise InputError(f"W_o has {W_o.shape[0]} rows but the concatenated heads have {rows} columns")
    return W_o


def attention_steps(
    X: object,
    W_q: object,
    W_k: object,
    W_v: object,
    mask: object = None,
    *,
    n_heads: int = 1,
    W_o: object | None = None,
) -> AttentionSteps:
    """Z = softmax(Q K^T / sqrt(d_k) + M) V with Q = X W^Q, K = X W^K, V = X W^V, all in float64.

    X: [n, d_model]. W_q, W_k: [d_model, h*d_k]. W_v: [d_model, h*d_v]. With n_heads > 1 the
    columns of each W are split into h equal blocks, one per head (d_k is then the per-head
    width). mask: None, "causal", a key-padding vector [n] or a boolean [n, n]; True = may attend.
    M is 0 where allowed and -inf elsewhere. W_o: [h*d_v, d_out], applied to the concatenated heads.
    Raises ValueError naming the matrix or shape that does not fit.
    """
    X, W_q, W_k, W_v, h = _checked_inputs(X, W_q, W_k, W_v, n_heads)
    return _steps(X @ W_q, X @ W_k, X @ W_v, mask, h, W_o)  # Q, K [n, h*d_k]; V [n, h*d_v]


def attention_from_qkv(
    Q: object, K: object, V: object, mask: object = None, *, n_heads: int = 1, W_o: object | None = None
) -> AttentionSteps:
    """The same steps with Q, K and V given directly (as `F.scaled_dot_product_attention(Q, K, V)` takes them).

    Q: [n_q, h*d_k], K: [n_k, h*d_k], V: [n_k, h*d_v]: n_q queries may differ from n_k keys (cross-attention).
    mask: None, "causal", a key-padding vector [n_k] or a boolean [n_q, n_k]; True = may attend.
    """
    Q, K, V = _matrix("Q", Q), _matrix("K", K), _matrix("V", V)
    if Q.shape[1] != K.shape[1]:
        raise InputError(f"Q and K must have the same number of columns (d_k): {Q.shape[1]} vs {K.shape[1]}")
    if K.shape[0] != V.shape[0]:
        raise InputError(f"K and V need one row per key: K has {K.shape[0]} rows, V has {V.shape[0]}")
    if int(n_heads) != n_heads or n_heads < 1:
        raise InputError(f"n_heads must be a whole number >= 1, got {n_heads!r}")
    h = int(n_heads)
    for name, M in (("Q", Q), ("V", V)):
        if M.shape[1] % h:
            raise InputError(f"{name} has {M.shape[1]} columns, which do not split into {h} equal heads")
    return _steps(Q, K, V, mask, h, W_o)


def _steps(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: object, h: int, W_o: object | None) -> AttentionSteps:
    """softmax(Q K^T / sqrt(d_k) + M) V, head by head, every intermediate kept."""
    n, n_k = Q.shape[0], K.shape[0]
    d_k, d_v = Q.shape[1] // h, V.shape[1] // h
    allowed = _mask(mask, n, n_k)

    q_heads = Q.reshape(n, h, d_k).transpose(1, 0, 2)  # [h, n, d_k]
    k_heads = K.reshape(n_k, h, d_k).transpose(1, 0, 2)
    v_heads = V.reshape(n_k, h, d_v).transpose(1, 0, 2)  # [h, n_k, d_v]
    scale = 1.0 / np.sqrt(d_k)
    parts = attend_float64(q_heads, k_heads, v_heads, float(scale), allowed=allowed)  # the model's own rule
    scores, scaled, weights, z = parts.scores, parts.logits, parts.weights, parts.z
    concat = z.transpose(1, 0, 2).reshape(n, h * d_v)  # [n, h*d_v]
    output = concat if W_o is None else concat @ _output_matrix(W_o, h * d_v)

    squeeze = (lambda a: a[0]) if h == 1 else (lambda a: a)
    return AttentionSteps(
        Q=Q,
        K=K,
        V=V,
        q_heads=q_heads,
        k_heads=k_heads,
        v_heads=v_heads,
        scores=squeeze(scores),
        scaled=squeeze(scaled),
        weights=squeeze(weights),
        z=squeeze(z),
        concat=concat,
        output=output,
        mask=allowed,
        n_heads=h,
        d_k=d_k,
        scale=float(scale),
    )
