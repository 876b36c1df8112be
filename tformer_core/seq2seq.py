"""Encoder-decoder models (the original Transformer, translation).

The encoder reads the whole source; each decoder block runs masked (causal) self-attention
over the target so far, then cross-attention whose queries come from the decoder and whose
keys and values come from the encoder output ("memory").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from .base import Tokenizer, TracedModel, per_token
from .capture import HookPoint, NameFilter
from .layers import BlockConfig, Stack, TextEmbedding, causal_mask, key_padding_mask
from .trace import Trace


@dataclass(frozen=True, kw_only=True)
class Seq2SeqConfig(BlockConfig):
    """Original-Transformer defaults: post-norm, ReLU, sinusoidal positions, embeddings * sqrt(d_model)."""

    src_vocab_size: int = 1000
    tgt_vocab_size: int = 1000
    max_positions: int = 512
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    positional: str = "sinusoidal"
    pe_base: float = 10000.0
    activation: str = "relu"
    embed_scale: bool = True
    embed_norm: bool = False
    tie_output: bool = True  # output layer shares the target embedding matrix


class EncoderDecoder(TracedModel):
    """(src ids (B, S), tgt ids (B, T)) -> logits (B, T, tgt_vocab) for the token after each target position.

    Activations under `encoder.*`, `decoder.*` (self-attention `decoder.{l}.attn`, cross-attention
    `decoder.{l}.cross_attn`) and `head.logits`.
    """

    kind = "encoder-decoder"

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__(config)
        c = config

        def embedding(vocab_size: int) -> TextEmbedding:
            return TextEmbedding(
                vocab_size, c.d_model, c.max_positions, c.positional, c.pe_base,
                scale=c.embed_scale, norm=c.embed_norm, ln_eps=c.ln_eps,
            )  # fmt: skip

        self.encoder = Stack(c, c.n_encoder_layers, embedding(c.src_vocab_size))
        self.decoder = Stack(c, c.n_decoder_layers, embedding(c.tgt_vocab_size), cross_attention=True)
        self.head = nn.Module()
        self.head.unembed = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        if c.tie_output:
            self.head.unembed.weight = self.decoder.embed.tok.weight
        self.head.hook_logits = HookPoint()
        self.target_tokenizer: Tokenizer | None = None
        self._finish_init()

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S) -> memory (B, S, D). src_mask (B, S): 1 real token, 0 padding."""
        mask = key_padding_mask(src_mask) if src_mask is not None else None
        return self.encoder(self.encoder.embed(src), self_mask=mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tgt (B, T), memory (B, S, D) -> logits (B, T, tgt_vocab)."""
        self_mask = causal_mask(tgt.shape[1], tgt.device)  # (T, T)
        cross_mask = key_padding_mask(src_mask) if src_mask is not None else None  # (B, 1, 1, S)
        x = self.decoder(self.decoder.embed(tgt), self_mask=self_mask, memory=memory, cross_mask=cross_mask)
        return self.head.hook_logits(self.head.unembed(x))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask)

    def trace(
        self,
        source: str | Sequence[int] | np.ndarray | torch.Tensor,
        target: str | Sequence[int] | np.ndarray | torch.Tensor,
        source_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
    ) -> Trace:
        """Trace one pair with teacher forcing: `target` is the decoder's input (starting with BOS)."""
        c = self.config
        src, src_tokens = self._ids(source, c.src_vocab_size, c.max_positions, what="source")
        tgt, tgt_tokens = self._ids(target, c.tgt_vocab_size, c.max_positions, self.target_tokenizer, "target")
        mask = per_token(source_mask, src, "source_mask")
        return self._trace(
            lambda: self(src, tgt, mask),
            keep,
            tokens=src_tokens,
            target_tokens=tgt_tokens,
            stack_layers={"encoder": c.n_encoder_layers, "decoder": c.n_decoder_layers},
        )
