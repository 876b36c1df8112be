"""The attention rule, written once: every part of the project that computes attention weights calls it.

    scores  = Q K^T                                    grouped_matmul(q, k.transpose(-2, -1))
    logits  = scores * scale (+ B), -inf where masked  attention_logits(scores, scale, position_bias, allowed)
    weights = softmax(logits), 0 for a query that may attend to nothing   attention_weights(logits, allowed)
    z       = weights V                                grouped_matmul(weights, v)

The model runs it in its own dtype (the softmax of a half-precision model in float32, as transformers does) with
a hook point between the steps (models/layers.py); a trace
recomputes dropped scores and weights with it from the stored Q and K (trace.py); the lessons run it in
float64 on small matrices (steps.py, tformer_views' why and lessons). So a change of the rule (a new
kind of bias, another mask convention) is made here, and the views cannot drift from the model.

Conventions: the head axis is third from the end (q [..., h, Tq, dh], k [..., h_kv, Tk, dh]); with grouped-
query attention h_kv divides h and query head i reads key/value head i // (h / h_kv). `allowed` is boolean,
broadcastable to the logits, True where a query MAY attend to a key (as F.scaled_dot_product_attention's
boolean mask). `position_bias` (T5's relative position bias) belongs to self-attention only: the caller
passes it for a self-attention block and never for cross-attention (`Trace.attention_bias` decides so for
traces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "HALF_PRECISION",
    "Attention",
    "ExactAttention",
    "attend",
    "attend_float64",
    "attention_logits",
    "attention_weights",
    "grouped_matmul",
    "widened",
]


def grouped_matmul(per_query_head: torch.Tensor, per_kv_head: torch.Tensor) -> torch.Tensor:
    """a [..., h, Tq, m] @ b [..., h_kv, m, n] -> [..., h, Tq, n], query head i using key/value head i // group.

    The query heads of a group are stacked as rows of one matrix, so K and V are never copied per query
    head (transformers' repeat_kv copies them): the same products, in fewer, larger multiplications.
    With as many heads on both sides (or no head axis) it is a plain batched matmul.
    """
    if per_query_head.dim() < 3 or per_query_head.shape[-3] == per_kv_head.shape[-3]:
        return per_query_head @ per_kv_head
    *batch, h, Tq, m = per_query_head.shape
    h_kv = per_kv_head.shape[-3]
    if h % h_kv:
        raise ValueError(f"{h} query heads cannot share {h_kv} key/value heads: {h_kv} must divide {h}")
    stacked = per_query_head.reshape(*batch, h_kv, (h // h_kv) * Tq, m)  # heads i*g .. i*g+g-1 together
    return (stacked @ per_kv_head).view(*batch, h, Tq, per_kv_head.shape[-1])


def attention_logits(
    scores: torch.Tensor, scale: float, position_bias: torch.Tensor | None = None, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """The softmax input: scores * scale (+ the position bias), -inf where `allowed` is False.

    scale: 1/sqrt(d_k), or 1 (T5, whose initialisation absorbs it: no multiplication at all then).
    """
    logits = scores * scale if scale != 1.0 else scores
    if position_bias is not None:
        logits = logits + position_bias
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


HALF_PRECISION = (torch.float16, torch.bfloat16)


def widened(logits: torch.Tensor) -> torch.Tensor:
    """A head's logits at least in float32: half-precision logits widened (as transformers widens them before a
    softmax over a vocabulary), float32 and float64 ones as they are."""
    return logits.float() if logits.dtype in HALF_PRECISION else logits


def attention_weights(logits: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Row-wise softmax of the logits, in the logits' dtype. Half-precision logits (bfloat16, float16) are
    exponentiated and summed in float32 and the weights rounded back once, as transformers' reference models do
    (Llama's, ViT's `softmax(..., dtype=torch.float32).to(query.dtype)`). A query that may attend to nothing (a
    padding query under a causal and padding mask) would get 0/0 = NaN; it gets 0 instead: it contributes nothing."""
    if logits.dtype in HALF_PRECISION:
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(logits.dtype)
    else:
        weights = torch.softmax(logits, dim=-1)
    if allowed is not None:
        attends_nothing = ~allowed.any(dim=-1, keepdim=True)
        # On the CPU, skip the pass when no row is empty (the usual case). Elsewhere always fill: asking would make
        # the host wait for the GPU in every layer (the whole pass then runs as slowly as its launches).
        if attends_nothing.device.type != "cpu" or bool(attends_nothing.any()):
            weights = weights.masked_fill(attends_nothing, 0.0)
    return weights


@dataclass(frozen=True, eq=False)
class Attention:
    """Every intermediate of one attention computation (shapes as `attend` documents)."""

    scores: torch.Tensor
    logits: torch.Tensor
    weights: torch.Tensor
    z: torch.Tensor


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    position_bias: torch.Tensor | None = None,
    allowed: torch.Tensor | None = None,
) -> Attention:
    """The whole rule at once, in the inputs' dtype: q [..., h, Tq, dh], k and v [..., h_kv, Tk, dh] ->
    scores, logits, weights [..., h, Tq, Tk] and z [..., h, Tq, dh_v]."""
    scores = grouped_matmul(q, k.transpose(-2, -1))
    logits = attention_logits(scores, scale, position_bias, allowed)
    weights = attention_weights(logits, allowed)
    return Attention(scores, logits, weights, grouped_matmul(weights, v))


@dataclass(frozen=True, eq=False)
class ExactAttention:
    """`attend`'s intermediates as float64 numpy arrays."""

    scores: np.ndarray
    logits: np.ndarray
    weights: np.ndarray
    z: np.ndarray


def attend_float64(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    position_bias: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
) -> ExactAttention:
    """`attend` in float64 on numpy arrays (copied, so the caller's stay untouched): the lessons' recomputation,
    which compares the model's float32 numbers with the exact ones by the same rule."""

    def exact(a: np.ndarray, dtype: type = np.float64) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=dtype))

    parts = attend(
        exact(q),
        exact(k),
        exact(v),
        float(scale),
        None if position_bias is None else exact(position_bias),
        None if allowed is None else exact(allowed, np.bool_),
    )
    return ExactAttention(parts.scores.numpy(), parts.logits.numpy(), parts.weights.numpy(), parts.z.numpy())
