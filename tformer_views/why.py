"""Why a weight has its value: row `query` of one head recomputed from the trace's Q, K and V, every number kept.

why = why_this_weight(trace, layer=2, head=5, query=7)
why.table()            # one row per key: q·k_j, scaled, + bias, softmax input, exp, weight, |v_j|, |w_j v_j|
why.max_errors()       # how far the recomputation is from what the model stored (float32)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core.attention import attend_float64
from tformer_core.errors import InputError
from tformer_core.trace import Trace, to_host

from .text import mask_tensor
from .tokens import display_token, display_tokens

__all__ = ["WhyWeight", "why_this_weight"]


@dataclass(frozen=True)
class WhyWeight:
    """Every number behind row `query` of one head's attention, from the trace's own Q, K and V.

    q: [d_head]; k, v: [n_k, d_head]; dots = k q: [n_k] (q . k_j); scale: 1/sqrt(d_k) (1 for T5);
    bias: [n_k] added to the scaled scores (T5's relative position bias) or None; allowed: [n_k],
    False where the mask forbids, or None; logits: the softmax input, -inf where masked; weights:
    softmax(logits) in float64; z = sum_j weights_j v_j: [d_head]. stored_weights and stored_z
    are what the model computed (float32), to compare with.
    """

    query: int
    query_label: str
    key_labels: tuple[str, ...]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dots: np.ndarray
    scale: float
    bias: np.ndarray | None
    allowed: np.ndarray | None
    logits: np.ndarray
    weights: np.ndarray
    z: np.ndarray
    stored_weights: np.ndarray
    stored_z: np.ndarray

    @property
    def exps(self) -> np.ndarray:
        """exp(logit_j - max logit): the softmax numerators (the shift cancels in the ratio)."""
        finite = np.isfinite(self.logits)
        top = self.logits[finite].max() if finite.any() else 0.0
        return np.where(finite, np.exp(np.where(finite, self.logits, top) - top), 0.0)

    def table(self) -> pd.DataFrame:
        """One row per key: token, q.k_j, times the scale, + bias, softmax input, exp, weight, |v_j|, |w_j v_j|."""
        frame = {"key": list(self.key_labels), "q·k": self.dots, "× 1/√d_k": self.dots * self.scale}
        if self.bias is not None:
            frame["+ bias"] = self.bias
        frame["softmax input"] = self.logits
        frame["exp(input − max)"] = self.exps
        frame["weight"] = self.weights
        frame["‖v_j‖"] = np.linalg.norm(self.v, axis=1)
        frame["‖w_j·v_j‖"] = self.weights * frame["‖v_j‖"]
        out = pd.DataFrame(frame)
        if self.allowed is not None:
            out.insert(1, "allowed", self.allowed)
        return out

    def products(self, key: int) -> pd.DataFrame:
        """q, k_j and their elementwise product per dimension: the terms of q . k_j."""
        return pd.DataFrame(
            {"q": self.q, "k_j": self.k[key], "q × k_j": self.q * self.k[key]},
            index=[f"d{i + 1}" for i in range(len(self.q))],
        )

    def max_errors(self) -> tuple[float, float]:
        """(max |weights - stored weights|, max |z - stored z|): how well the recomputation matches."""
        weights = float(np.max(np.abs(self.weights - self.stored_weights)))
        return weights, float(np.max(np.abs(self.z - self.stored_z)))


def why_this_weight(trace: Trace, layer: int, head: int, query: int, stack: str | None = None) -> WhyWeight:
    """Recompute row `query` of (layer, head) from the trace's Q, K, V in float64: see WhyWeight."""
    stack = stack or trace.main_stack
    q_tokens, k_tokens = trace.tokens_for(stack)
    if not 0 <= query < len(q_tokens):
        n = len(q_tokens)
        raise InputError(f"query position {query} is out of range: the input has {n} tokens (0..{n - 1})")
    # Everything the explanation reads, picked on the trace's device and copied to the host in one transfer.
    parts = [trace.block_tensor(part, layer, head, stack) for part in ("q", "k", "v", "weights", "z")]
    parts = [parts[0][query], parts[1], parts[2], parts[3][query], parts[4][query]]
    bias_tensor = trace.attention_bias_tensor(layer, head, stack)  # T5's, for self-attention only
    mask = mask_tensor(trace, layer, stack)
    extra = [t[query] for t in (bias_tensor, mask) if t is not None]
    host = [np.asarray(a, dtype=np.float64) for a in to_host(parts + extra)]
    q, k, v, stored_weights, stored_z = host[:5]
    bias = host[5] if bias_tensor is not None else None
    allowed = None if mask is None else host[-1].astype(bool)
    dots = k @ q
    scale = trace.meta.attention_scale
    exact = attend_float64(q[None], k, v, scale, bias, allowed)  # the model's own rule, in float64
    logits, weights = exact.logits[0], exact.weights[0]
    return WhyWeight(
        query,
        display_token(q_tokens[query]),
        tuple(display_tokens(k_tokens)),
        q,
        k,
        v,
        dots,
        scale,
        bias,
        allowed,
        logits,
        weights,
        weights @ v,
        stored_weights,
        stored_z,
    )
