"""Encoder-only text models: the original Transformer encoder and BERT-style encoders.

Every token attends to every other (bidirectional); a padding mask hides padded keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .base import TracedModel, per_token
from .capture import NameFilter
from .layers import BlockConfig, Stack, TextEmbedding, key_padding_mask
from .trace import Trace


@dataclass(frozen=True, kw_only=True)
class EncoderConfig(BlockConfig):
    """BERT-style defaults: learned positions, LayerNorm after the embedding sum, post-norm blocks."""

    vocab_size: int = 1000
    max_positions: int = 512
    n_layers: int = 2
    positional: str = "learned"  # or "sinusoidal"
    pe_base: float = 10000.0
    n_token_types: int = 0  # BERT segments A/B: 2
    embed_norm: bool = True  # LayerNorm on token + position (+ segment) embeddings, as BERT
    embed_scale: bool = False  # token embedding * sqrt(d_model), as the original Transformer


class Encoder(TracedModel):
    """ids (B, T) -> final hidden states (B, T, D). Activations under `encoder.*`."""

    kind = "encoder"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = TextEmbedding(
            c.vocab_size, c.d_model, c.max_positions, c.positional, c.pe_base,
            n_token_types=c.n_token_types, scale=c.embed_scale, norm=c.embed_norm, ln_eps=c.ln_eps,
        )  # fmt: skip
        self.encoder = Stack(c, c.n_layers, embed)
        self._finish_init()

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ids (B, T) long; attention_mask (B, T), 1 for real tokens and 0 for padding."""
        x = self.encoder.embed(ids, token_type_ids)
        mask = key_padding_mask(attention_mask) if attention_mask is not None else None
        return self.encoder(x, self_mask=mask)  # (B, T, D)

    def trace(
        self,
        inputs: str | Sequence[int] | np.ndarray | torch.Tensor,
        attention_mask: Sequence[int] | None = None,
        token_type_ids: Sequence[int] | None = None,
        keep: NameFilter | None = None,
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        types = per_token(token_type_ids, ids, "token_type_ids")
        return self._trace(
            lambda: self(ids, mask, types), keep, tokens=tokens, stack_layers={"encoder": self.config.n_layers}
        )

