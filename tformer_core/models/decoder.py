"""Decoder-only language models (GPT-2 style): causal self-attention, next-token logits.

Position i may attend only to positions j <= i: the causal mask sets scores above the diagonal
to -inf before the softmax, so their weights are exactly 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..capture import HookPoint, NameFilter
from ..generation import Generation, GenerationSettings, traced_steps
from ..trace import Trace
from .base import TracedModel, per_token
from .layers import BlockConfig, Stack, TextEmbedding, causal_mask, key_padding_mask


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
    pe_layout: str = "interleaved"
    position_first_row: int = 0


class Decoder(TracedModel):
    """ids (B, T) -> next-token logits (B, T, vocab). Activations under `decoder.*` and `head.logits`."""

    kind = "decoder"
    main_stack = "decoder"

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = TextEmbedding(
            c.vocab_size,
            c.d_model,
            c.max_positions,
            c.positional,
            c.pe_base,
            ln_eps=c.ln_eps,
            pe_layout=c.pe_layout,
            position_first_row=c.position_first_row,
        )
        self.decoder = Stack(c, c.n_layers, embed)
        self.head = nn.Module()
        self.head.unembed = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.head.unembed.weight = embed.tok.weight
        self.head.hook_logits = HookPoint()
        self.generation = GenerationSettings()
        self._finish_init()

    @property
    def output_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

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
        return self._trace(
            lambda: self(ids, mask),
            keep,
            meta={"predict_position": -1},
            tokens=tokens,
            stack_layers={"decoder": self.config.n_layers},
        )

    def generate(
        self, prompt: str | Sequence[int] | np.ndarray | torch.Tensor, max_new_tokens: int | None = None
    ) -> Generation:
        """Greedy continuation of `prompt`, one traced pass per new token, until EOS or the limit."""
        settings = self.generation
        budget = max_new_tokens if max_new_tokens is not None else settings.max_new_tokens
        ids, _ = self._ids(prompt, self.config.vocab_size, self.config.max_positions, what="prompt")
        sequence = ids[0].tolist()
        budget = min(budget, self.config.max_positions - len(sequence))
        sequence, steps, finished = traced_steps(self.trace, sequence, settings, budget)
        final = self.trace(sequence)
        n_prompt = ids.shape[1]
        return Generation(tuple(sequence), final.tokens, n_prompt, steps, final, finished)
