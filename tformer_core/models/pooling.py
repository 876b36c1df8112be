"""Attention pooling for classification, the lectures' first attention (before Transformers).

Each word j of a sentence is embedded (e_j) and turned into a vector h_j = tanh(e_j W_h + b_h); a small
network gives it one score s_j = v^T tanh(h_j W_s + b_s); a softmax over the words turns the scores into
weights alpha_j; the sentence is c = sum_j alpha_j h_j and a linear classifier reads c. With
pooling="mean" every word gets alpha_j = 1/n instead: the same model without attention, the baseline.

Hooks (batch first): encoder.embed.tok (B, T, E), encoder.words h (B, T, H), pool.word_scores s (B, T) (padding
at -inf), pool.weights alpha (B, T), pool.context c (B, H), head.logits (B, classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..capture import HookPoint, NameFilter
from ..trace import Trace
from .base import TracedModel

POOLINGS = ("attention", "mean")


@dataclass(frozen=True, kw_only=True)
class PoolingConfig:
    vocab_size: int
    d_embed: int = 32
    d_hidden: int = 32  # h_j, and so c
    d_score: int = 32  # the score network's hidden layer
    n_classes: int = 2
    pooling: str = "attention"
    max_positions: int = 64  # longest sentence read, in words
    labels: tuple[str, ...] = ()
    n_heads: int = 1  # one set of weights over the words (what the trace format counts as heads)

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.labels and len(self.labels) != self.n_classes:
            raise ValueError(f"{len(self.labels)} labels for {self.n_classes} classes")
        for name in ("vocab_size", "d_embed", "d_hidden", "d_score", "n_classes", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class PoolingClassifier(TracedModel):
    """ids (B, T), mask (B, T) 1 for words -> class logits (B, classes)."""

    kind = "pooling"

    def __init__(self, config: PoolingConfig) -> None:
        super().__init__(config)  # type: ignore[arg-type]  (no Transformer block: TracedModel's config is a record)
        c = config
        self.encoder = nn.Module()
        self.encoder.embed = nn.Module()
        self.encoder.embed.tok = nn.Embedding(c.vocab_size, c.d_embed)
        self.encoder.embed.hook_tok = HookPoint()
        self.encoder.word = nn.Linear(c.d_embed, c.d_hidden)
        self.encoder.hook_words = HookPoint()
        self.pool = nn.Module()
        self.pool.W_s = nn.Linear(c.d_hidden, c.d_score)
        self.pool.v = nn.Linear(c.d_score, 1, bias=False)
        self.pool.hook_word_scores, self.pool.hook_weights, self.pool.hook_context = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )
        self.head = nn.Module()
        self.head.classify = nn.Linear(c.d_hidden, c.n_classes)
        self.head.hook_logits = HookPoint()
        self.output_labels = c.labels or tuple(f"LABEL_{i}" for i in range(c.n_classes))
        self._finish_init()

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            mask = torch.ones_like(ids)
        words = mask.bool()  # (B, T)
        e = self.encoder.embed.hook_tok(self.encoder.embed.tok(ids))  # (B, T, E)
        h = self.encoder.hook_words(torch.tanh(self.encoder.word(e)))  # (B, T, H)
        if self.config.pooling == "attention":
            scores = self.pool.v(torch.tanh(self.pool.W_s(h))).squeeze(-1)  # (B, T)
        else:  # every word the same score: softmax gives 1/n
            scores = torch.zeros(ids.shape, dtype=h.dtype, device=h.device)
        scores = self.pool.hook_word_scores(scores.masked_fill(~words, float("-inf")))
        alpha = self.pool.hook_weights(torch.softmax(scores, dim=-1))  # (B, T), sums to 1 over the words
        context = self.pool.hook_context(torch.einsum("bt,bth->bh", alpha, h))  # c = sum_j alpha_j h_j
        return self.head.hook_logits(self.head.classify(context))  # (B, classes)

    def _trace_meta(self) -> dict:
        return {"labels": self.output_labels, "path": self.path, "pooling": self.config.pooling}

    def trace(self, inputs: str | Sequence[int] | np.ndarray | torch.Tensor, keep: NameFilter | None = None) -> Trace:
        """Trace one sentence (text, or word ids): the weights over its words and the prediction."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions, what="sentence")
        return self._trace(lambda: self(ids), keep, tokens=tokens, stack_layers={})
