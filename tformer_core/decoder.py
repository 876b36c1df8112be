"""Decoder-only language models (GPT-2 style): causal self-attention, next-token logits.

Position i may attend only to positions j <= i: the causal mask sets scores above the diagonal
to -inf before the softmax, so their weights are exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .base import TracedModel, per_token
from .capture import HookPoint, NameFilter
from .layers import BlockConfig, Stack, TextEmbedding, causal_mask, key_padding_mask
from .trace import Trace


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(BlockConfig):
    """GPT-2 defaults: pre-norm, tanh-GELU, learned positions, output layer tied to the embedding."""

    vocab_size: int = 1000
    max_positions: int = 1024
    n_layers: int = 2
    positional: str = "learned"
    pe_base: float = 10000.0
    norm: str = "pre"
    activation: str = "gelu_tanh"
    tie_embeddings: bool = True


class Decoder(TracedModel):
    """ids (B, T) -> next-token logits (B, T, vocab). Activations under `decoder.*` and `head.logits`."""

    kind = "decoder"

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = TextEmbedding(c.vocab_size, c.d_model, c.max_positions, c.positional, c.pe_base, ln_eps=c.ln_eps)
        self.decoder = Stack(c, c.n_layers, embed)
        self.head = nn.Module()
        self.head.unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.unembed.weight = embed.tok.weight
        self.head.hook_logits = HookPoint()
        self._finish_init()

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids (B, T) long; attention_mask (B, T) with 0 on padding keys, combined with the causal mask."""
        T = ids.shape[1]
        mask = causal_mask(T, ids.device)  # (T, T), broadcast over batch and heads
        if attention_mask is not None:
            mask = mask & key_padding_mask(attention_mask)  # (B, 1, T, T)
        x = self.decoder.embed(ids)
        x = self.decoder(x, self_mask=mask)
        return self.head.hook_logits(self.head.unembed(x))  # (B, T, vocab)

    def trace(
        self,
        inputs: str | Sequence[int] | np.ndarray | torch.Tensor,
        attention_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        return self._trace(lambda: self(ids, mask), keep, tokens=tokens, stack_layers={"decoder": self.config.n_layers})
