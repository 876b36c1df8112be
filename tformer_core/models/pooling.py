"""Attention pooling for classification, the lectures' first attention (before Transformers).

Each word j of a sentence is embedded (e_j) and turned into a vector h_j = tanh(e_j W_h + b_h); a small
network gives it one score s_j = v^T tanh(h_j W_s + b_s); a softmax over the words turns the scores into
weights alpha_j (tformer_core.attention's rule: padding masked, a row of no words 0); the sentence is
c = sum_j alpha_j h_j and a linear classifier reads c. With pooling="mean" every word gets alpha_j = 1/n
instead: the same model without attention, the baseline.

Hooks (batch first): encoder.embed.tok (B, T, E), encoder.words h (B, T, H), pool.word_scores s (B, T) (padding
at -inf), pool.weights alpha (B, T), pool.context c (B, H), head.logits (B, classes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import attention_logits, attention_weights
from ..capture import Edit, HookPoint, NameFilter
from ..trace import Trace
from .base import TokenInput
from .kinds import PoolingModel

__all__ = ["POOLINGS", "ClassifierHead", "Pool", "PoolingClassifier", "PoolingConfig", "WordEmbedding", "WordEncoder"]

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


class WordEmbedding(nn.Module):
    """Word ids (B, T) -> their vectors e (B, T, E). Hook: tok."""

    def __init__(self, c: PoolingConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab_size, c.d_embed)
        self.hook_tok = HookPoint()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hook_tok(self.tok(ids))


class WordEncoder(nn.Module):
    """Word ids (B, T) -> h (B, T, H) = tanh(e W_h + b_h). Hooks: embed.tok e (B, T, E), words h."""

    def __init__(self, c: PoolingConfig) -> None:
        super().__init__()
        self.embed = WordEmbedding(c)
        self.word = nn.Linear(c.d_embed, c.d_hidden)
        self.hook_words = HookPoint()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.hook_words(torch.tanh(self.word(self.embed(ids))))


class Pool(nn.Module):
    """h (B, T, H) and the words (B, T) True for a word -> c (B, H), by the attention rule of
    tformer_core.attention with one score per word (no query: the score network is the query).
    Hooks: word_scores s (B, T), -inf at padding; weights alpha (B, T); context c (B, H)."""

    def __init__(self, c: PoolingConfig) -> None:
        super().__init__()
        self.by_attention = c.pooling == "attention"
        self.W_s = nn.Linear(c.d_hidden, c.d_score)
        self.v = nn.Linear(c.d_score, 1, bias=False)
        self.hook_word_scores, self.hook_weights, self.hook_context = HookPoint(), HookPoint(), HookPoint()

    def forward(self, h: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        if self.by_attention:
            scores = self.v(torch.tanh(self.W_s(h))).squeeze(-1)  # s_j = v^T tanh(h_j W_s + b_s), (B, T)
        else:  # every word the same score: the softmax gives 1/n
            scores = h.new_zeros(words.shape)
        logits = self.hook_word_scores(attention_logits(scores, 1.0, allowed=words))
        alpha = self.hook_weights(attention_weights(logits, words))  # (B, T), sums to 1 over the words
        return self.hook_context(torch.einsum("bt,bth->bh", alpha, h))  # c = sum_j alpha_j h_j


class ClassifierHead(nn.Module):
    """c (B, H) -> class logits (B, classes). Hook: logits."""

    def __init__(self, c: PoolingConfig) -> None:
        super().__init__()
        self.classify = nn.Linear(c.d_hidden, c.n_classes)
        self.hook_logits = HookPoint()

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        return self.hook_logits(self.classify(context))


class PoolingClassifier(PoolingModel[PoolingConfig]):
    """ids (B, T), mask (B, T) 1 for words -> class logits (B, classes)."""

    def __init__(self, config: PoolingConfig) -> None:
        super().__init__(config)
        self.encoder = WordEncoder(config)
        self.pool = Pool(config)
        self.head = ClassifierHead(config)
        self.output_labels = config.labels or tuple(f"LABEL_{i}" for i in range(config.n_classes))
        self._finish_init()

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        words = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()  # (B, T)
        return self.head(self.pool(self.encoder(ids), words))  # (B, classes)

    def trace(self, inputs: TokenInput, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()) -> Trace:
        """Trace one sentence (text, or word ids): the weights over its words and the prediction; edits: applied in
        this pass, their names checked first (`intervene`)."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions, what="sentence")
        return self._trace(lambda: self(ids), keep, edits=edits, tokens=tokens, stack_layers={})
