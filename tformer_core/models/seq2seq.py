"""Encoder-decoder models (the original Transformer, translation).

The encoder reads the whole source; each decoder block runs masked (causal) self-attention
over the target so far, then cross-attention whose queries come from the decoder and whose
keys and values come from the encoder output ("memory").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..capture import Edit, NameFilter, matching
from ..errors import InputError
from ..generation import Generation, GenerationSettings, choose_next, traced_steps
from ..tokenizers import Tokenizer
from ..trace import Trace, stored_by_default
from .base import LinearReadout, TokenInput, per_token
from .kinds import EncoderDecoderModel
from .layers import BlockConfig, LMHead, Stack, TextEmbedding, causal_mask, key_padding_mask, text_embedding

__all__ = ["EncoderDecoder", "Seq2SeqConfig"]


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
    share_embeddings: bool = False  # one token embedding for source and target (Marian, BART, T5)
    output_bias: bool = False  # a bias on the logits (BART's and Marian's final_logits_bias)
    output_scale: float = 1.0  # T5 multiplies the decoder output by d_model^-0.5 before the tied output layer
    pe_layout: str = "interleaved"
    position_first_row: int = 0  # BART: position p uses row p + 2


class EncoderDecoder(EncoderDecoderModel[Seq2SeqConfig]):
    """(src ids (B, S), tgt ids (B, T)) -> logits (B, T, tgt_vocab) for the token after each target position.

    Activations under `encoder.*`, `decoder.*` (self-attention `decoder.{l}.attn`, cross-attention
    `decoder.{l}.cross_attn`) and `head.logits`.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__(config)
        c = config

        def embedding(vocab_size: int) -> TextEmbedding:
            return text_embedding(c, vocab_size, scale=c.embed_scale, norm=c.embed_norm)

        if c.share_embeddings and c.src_vocab_size != c.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")
        self.encoder = Stack(c, c.n_encoder_layers, embedding(c.src_vocab_size))
        self.decoder = Stack(c, c.n_decoder_layers, embedding(c.tgt_vocab_size), cross_attention=True)
        if c.share_embeddings:
            self.decoder.embed.tok.weight = self.encoder.embed.tok.weight
        self.head = LMHead(c.d_model, c.tgt_vocab_size, bias=c.output_bias)
        if c.output_bias:
            nn.init.zeros_(self.head.unembed.bias)
        if c.tie_output:
            self.head.unembed.weight = self.decoder.embed.tok.weight
        self.target_tokenizer: Tokenizer | None = None
        self.generation = GenerationSettings(start_id=1, eos_id=2, pad_id=0)
        self._finish_init()

    @property
    def output_vocab_size(self) -> int:
        return self.config.tgt_vocab_size

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S) -> memory (B, S, D). src_mask (B, S): 1 real token, 0 padding."""
        mask = key_padding_mask(src_mask) if src_mask is not None else None
        return self.encoder(self.encoder.embed(src), self_mask=mask)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tgt (B, T), memory (B, S, D) -> logits (B, T, tgt_vocab)."""
        self_mask = causal_mask(tgt.shape[1], tgt.device)  # (T, T)
        cross_mask = key_padding_mask(src_mask) if src_mask is not None else None  # (B, 1, 1, S)
        x = self.decoder(self.decoder.embed(tgt), self_mask=self_mask, memory=memory, cross_mask=cross_mask)
        if self.config.output_scale != 1.0:
            x = x * self.config.output_scale
        return self.head(x)

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """A decoder residual stream (B, T, D) -> next-token logits (B, T, tgt_vocab): the decoder's final norm
        (pre-norm), T5's output scale, the output layer."""
        norm = self.decoder.ln_final
        x = norm(hidden) if norm is not None else hidden
        return self.head(x * self.config.output_scale if self.config.output_scale != 1.0 else x)

    def linear_readout(self, output: int, position: int) -> LinearReadout:
        """The logit of target token `output` after target `position`: the output layer's row, scaled as
        `read_out` scales the decoder's output."""
        unembed = self.head.unembed
        bias = float(unembed.bias.detach()[output]) if unembed.bias is not None else 0.0
        return LinearReadout(((position, unembed.weight.detach()[output] * self.config.output_scale),), bias)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask)

    def trace(
        self,
        source: TokenInput,
        target: TokenInput,
        source_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one pair with teacher forcing: `target` is the decoder's input (starting with BOS). edits: applied
        in this pass, their names checked first (`intervene`)."""
        c = self.config
        src, src_tokens = self._ids(source, c.src_vocab_size, c.max_positions, what="source")
        tgt, tgt_tokens = self._ids(target, c.tgt_vocab_size, c.max_positions, self.target_tokenizer, "target")
        mask = per_token(source_mask, src, "source_mask")
        return self._trace(
            lambda: self(src, tgt, mask),
            keep,
            meta={"predict_position": -1},
            edits=edits,
            tokens=src_tokens,
            target_tokens=tgt_tokens,
            stack_layers={"encoder": c.n_encoder_layers, "decoder": c.n_decoder_layers},
        )

    def generate(self, source: TokenInput, max_new_tokens: int | None = None) -> Generation:
        """Greedy translation of `source`: the encoder runs once, then one traced decoder pass per token.

        Step traces hold the decoder stack (`decoder.*`, its cross-attention included) and `head.logits`,
        and say so: their `stack_layers` name the decoder only. `Generation.trace` is a full
        teacher-forced pass over the result, encoder included.
        """
        c, settings = self.config, self.generation
        src, src_tokens = self._ids(source, c.src_vocab_size, c.max_positions, what="source")
        budget = max_new_tokens if max_new_tokens is not None else settings.max_new_tokens
        budget = min(budget, c.max_positions - 1)
        with torch.inference_mode():
            memory = self.encode(src)
        target_tokenizer = self.target_tokenizer or self.tokenizer
        decoder_part = matching("decoder.**", "head.**")
        decoder_only = lambda name: decoder_part(name) and stored_by_default(name)  # noqa: E731

        def trace_step(sequence: list[int]) -> Trace:
            tgt, tgt_tokens = self._ids(sequence, c.tgt_vocab_size, None, target_tokenizer, "target")
            return self._trace(
                lambda: self.decode(tgt, memory),
                decoder_only,
                meta={"predict_position": -1},
                tokens=src_tokens,
                target_tokens=tgt_tokens,
                stack_layers={"decoder": c.n_decoder_layers},
            )

        sequence, steps, finished = traced_steps(trace_step, [self._start_id()], settings, budget)
        final = self.trace(src[0].tolist(), sequence)
        return Generation(tuple(sequence), final.target_tokens or (), 1, steps, final, finished)

    def _start_id(self) -> int:
        settings = self.generation
        start = settings.start_id if settings.start_id is not None else settings.pad_id
        if start is None:
            raise InputError("this model's generation settings name no decoder start token")
        return int(start)

    @torch.inference_mode()
    def greedy_batch(
        self, src: torch.Tensor, src_mask: torch.Tensor, max_new_tokens: int | None = None
    ) -> list[list[int]]:
        """Batched greedy decoding without traces (evaluation over many sentences), by the same rules as
        `generate`: src (B, S) ids, src_mask (B, S) 1 real / 0 padding -> the generated ids of each row,
        up to (not including) the end token.

        The memory is computed once; the decoder re-reads the whole prefix at each step (no cache:
        sentences are short, and this keeps the decoder the plain traced module).
        """
        settings = self.generation
        budget = min(max_new_tokens or settings.max_new_tokens, self.config.max_positions - 1)
        src, src_mask = src.to(self.device), src_mask.to(self.device)
        memory = self.encode(src, src_mask)  # (B, S, D)
        out = torch.full((src.shape[0], 1), self._start_id(), dtype=torch.long, device=self.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=self.device)
        for t in range(budget):
            logits = self.decode(out, memory, src_mask)[:, -1]  # (B, V)
            nxt = choose_next(logits, settings, t, is_last_allowed=t == budget - 1)
            if settings.eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, settings.eos_id), nxt)
                done |= nxt == settings.eos_id
            out = torch.cat([out, nxt[:, None]], dim=1)
            if bool(done.all()):
                break
        rows = out[:, 1:].tolist()
        return [row[: row.index(settings.eos_id)] if settings.eos_id in row else row for row in rows]
