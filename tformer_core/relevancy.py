"""Gradient-weighted relevancy (Chefer, Gur & Wolf 2021, "Generic attention-model explainability"): which tokens
the probe's number depends on, through the attention, with the gradients saying which heads count.

    result = relevancy(probes.class_probe(vit, pixels))
    result.relevance[0, vit_trace.n_prefix_tokens:]        # the class token's relevance over the patches

For a stack of self-attention layers, starting from R = I (every token relevant to itself):

    per layer l:  Abar = mean over heads of max(dS/dA_l * A_l, 0)     [n, n]
                  R <- R + Abar R

S is the probe's score (a class's or next token's probability, two sentences' similarity), A_l the layer's
attention weights [heads, n, n] and dS/dA_l their gradient. Unlike attention rollout (which averages the raw
weights), a head whose weights do not move S, or move it down, adds nothing. The row of the token that makes
the prediction (a ViT's class token, a language model's last position) is the relevance map.

The gradient needs autograd, not inference mode: this runs one forward and one backward pass for the call,
holding that call's graph only. The gradient is taken with respect to the attention weights alone
(`torch.autograd.grad`), so nothing accumulates in the shared model's parameters (their .grad stays untouched).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .capture import Edit, Hook
from .probes import Probe

__all__ = ["Relevancy", "propagate", "relevancy"]


@dataclass(frozen=True, eq=False)
class Relevancy:
    """One pass's relevancy, float64. attention, gradients [layers, heads, n, n]: A_l and dS/dA_l; relevance [n, n]:
    R after the last layer (row i: how relevant each token is to token i's output); score: S."""

    stack: str
    attention: np.ndarray
    gradients: np.ndarray
    relevance: np.ndarray
    score: float


def propagate(attention: np.ndarray, gradients: np.ndarray) -> np.ndarray:
    """The rule, on arrays: attention and gradients [layers, heads, n, n] -> R [n, n] (module docstring)."""
    n = attention.shape[-1]
    R = np.eye(n)
    for A, G in zip(attention, gradients, strict=True):
        R = R + np.clip(G * A, 0.0, None).mean(axis=0) @ R
    return R


def relevancy(probe: Probe, stack: str | None = None) -> list[Relevancy]:
    """Relevancy of the self-attention of `stack` (default: the probe's only stack, or an encoder-decoder's
    decoder) for the probe's score; one `Relevancy` per sequence the probe runs (two for a similarity probe)."""
    stack = stack or ("decoder" if "decoder" in probe.heads else next(iter(probe.heads)))
    if stack not in probe.heads or stack == "cross":
        stacks = [s for s in probe.heads if s != "cross"]
        raise ValueError(f"relevancy follows a stack's self-attention: one of {stacks}")
    layers = probe.heads[stack][0]
    kept: list[torch.Tensor] = []

    def keep(a: torch.Tensor, hook: Hook) -> torch.Tensor:
        kept.append(a)
        return a

    def start_graph(
        x: torch.Tensor, hook: Hook
    ) -> torch.Tensor:  # the graph starts here, whether or not weights need grad
        return x.detach().requires_grad_(True)

    edits = [Edit(f"{stack}.embed.out", start_graph)]
    edits += [Edit(f"{stack}.{layer}.attn.weights", keep) for layer in range(layers)]
    with torch.inference_mode(False), torch.enable_grad(), probe.model.intervene([*probe.edits, *edits]):
        score = probe.score(probe.run())[0]
        grads = torch.autograd.grad(score, kept)
    out = []
    for start in range(0, len(kept), layers):
        A = np.stack([a[0].detach().double().cpu().numpy() for a in kept[start : start + layers]])
        G = np.stack([g[0].double().cpu().numpy() for g in grads[start : start + layers]])
        out.append(Relevancy(stack, A, G, propagate(A, G), float(score.detach())))
    return out
