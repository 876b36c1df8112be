"""Encoder-only text models: the original Transformer encoder and BERT-style encoders.

Every token attends to every other (bidirectional); a padding mask hides padded keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..capture import HookPoint, NameFilter
from ..tokenizers import Tokenizer
from ..trace import Trace
from .base import TracedModel, per_token
from .layers import ACTIVATIONS, BlockConfig, Stack, TextEmbedding, key_padding_mask


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
    pe_layout: str = "interleaved"
    position_first_row: int = 0  # RoBERTa: position p uses row p + 2
    mlm_head: bool = False  # masked-word prediction head (dense, activation, LayerNorm, tied output)


class Encoder(TracedModel):
    """ids (B, T) -> final hidden states (B, T, D). Activations under `encoder.*`."""

    kind = "encoder"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = TextEmbedding(
            c.vocab_size,
            c.d_model,
            c.max_positions,
            c.positional,
            c.pe_base,
            n_token_types=c.n_token_types,
            scale=c.embed_scale,
            norm=c.embed_norm,
            ln_eps=c.ln_eps,
            pe_layout=c.pe_layout,
            position_first_row=c.position_first_row,
        )
        self.encoder = Stack(c, c.n_layers, embed)
        if c.mlm_head:
            self.head = MaskedLMHead(c, embed.tok.weight)
        self.mask_token_id: int | None = None  # from a tokenizer that has [MASK] (see attach_tokenizer)
        self._finish_init()

    def attach_tokenizer(self, tokenizer: Tokenizer) -> None:
        super().attach_tokenizer(tokenizer)
        self.mask_token_id = tokenizer.mask_token_id

    @property
    def output_vocab_size(self) -> int:
        return self.config.vocab_size if self.config.mlm_head else 0

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        with_head: bool = False,
    ) -> torch.Tensor:
        """ids (B, T) long; attention_mask (B, T), 1 for real tokens and 0 for padding.

        Returns the final hidden states (B, T, D), or with `with_head` the masked-LM logits (B, T, vocab).
        """
        x = self.encoder.embed(ids, token_type_ids)
        mask = key_padding_mask(attention_mask) if attention_mask is not None else None
        hidden = self.encoder(x, self_mask=mask)  # (B, T, D)
        return self.head(hidden) if with_head and self.config.mlm_head else hidden

    def trace(
        self,
        inputs: str | Sequence[int] | np.ndarray | torch.Tensor,
        attention_mask: Sequence[int] | None = None,
        token_type_ids: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        pair: str | None = None,
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids.

        `pair`: a second text segment (BERT's sentence B): the tokenizer joins the two with its
        separator and numbers their segments 0 and 1.
        """
        if pair is not None:
            inputs, token_type_ids = self._encode_pair(inputs, pair)
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        types = per_token(token_type_ids, ids, "token_type_ids")
        masked = [i for i, t in enumerate(ids[0].tolist()) if t == self.mask_token_id]
        return self._trace(
            lambda: self(ids, mask, types, with_head=True),
            keep,
            meta={"predict_position": masked[0] if masked else None, "mask_positions": masked},
            tokens=tokens,
            stack_layers={"encoder": self.config.n_layers},
        )

    def _encode_pair(self, text: object, pair: str) -> tuple[list[int], list[int] | None]:
        if self.tokenizer is None or not isinstance(text, str):
            raise ValueError("a second segment needs text input and a model with a tokenizer")
        if not text.strip() or not pair.strip():
            raise ValueError("both segments need at least one word")
        ids, types = self.tokenizer.encode_pair(text, pair)
        return ids, types if self.config.n_token_types > 1 else None


class MaskedLMHead(nn.Module):
    """BERT's masked-word head: LN(act(h W_t + b_t)) E^T + b, with E the tied token embedding. Hook: logits."""

    def __init__(self, c: EncoderConfig, embedding: nn.Parameter) -> None:
        super().__init__()
        self.transform = nn.Linear(c.d_model, c.d_model)
        self.act = ACTIVATIONS[c.activation]
        self.ln = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.unembed = nn.Linear(c.d_model, c.vocab_size)
        self.unembed.weight = embedding
        self.hook_logits = HookPoint()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hook_logits(self.unembed(self.ln(self.act(self.transform(hidden)))))  # (B, T, vocab)
