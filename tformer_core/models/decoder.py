"""Decoder-only language models: causal self-attention, next-token logits.

GPT-2 style by default (learned positions, LayerNorm, GELU); with a `rope`, grouped-query attention,
RMSNorm and a gated FFN, the same module is a Llama-family model (see llama.py for those defaults).

Position i may attend only to positions j <= i: the causal mask sets scores above the diagonal
to -inf before the softmax, so their weights are exactly 0. Sliding-window layers (Mistral, some Qwen
layers) also hide the keys `sliding_window` or more positions back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from ..capture import Edit, NameFilter
from ..generation import Generation, GenerationSettings, Sampling, decode_steps
from ..trace import Trace
from .base import Capabilities, LinearReadout, TokenInput, per_token
from .kinds import CausalLM
from .layers import BlockConfig, KVCache, LMHead, Stack, causal_window_mask, key_padding_mask, text_embedding

__all__ = ["Decoder", "DecoderConfig"]


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(BlockConfig):
    """GPT-2 defaults: pre-norm, tanh-GELU, learned positions, output layer tied to the embedding.

    sliding_window: keys at least this many positions before the query are hidden, in `sliding_layers`
    (None: every layer), or None (full causal attention everywhere).
    """

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
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope is not None and self.positional != "none":
            raise ValueError(
                f"a rotary model adds no position vectors: positional must be 'none', not {self.positional!r}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be a whole number >= 1 or None, got {self.sliding_window!r}")
        if self.sliding_layers is not None and not all(0 <= i < self.n_layers for i in self.sliding_layers):
            raise ValueError(f"sliding_layers must name layers 0..{self.n_layers - 1}, got {self.sliding_layers}")

    def windowed(self, layer: int) -> bool:
        """Whether `layer` attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.sliding_layers is None or layer in self.sliding_layers


class Decoder(CausalLM[DecoderConfig]):
    """ids (B, T) -> next-token logits (B, T, vocab). Activations under `decoder.*` and `head.logits`."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = text_embedding(c, c.vocab_size)
        self.decoder = Stack(c, c.n_layers, embed)
        self.head = LMHead(c.d_model, c.vocab_size)
        if c.tie_embeddings:
            self.head.unembed.weight = embed.tok.weight
        self.generation = GenerationSettings()
        self._finish_init()

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, sampling=True, kv_cache=True)

    @property
    def output_vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def _self_masks(
        self, n_new: int, n_keys: int, device: torch.device, attention_mask: torch.Tensor | None
    ) -> torch.Tensor | list[torch.Tensor | None] | None:
        """The causal mask of the new positions over every key (n_new, n_keys), combined with the padding
        mask (B, 1, n_new, n_keys); one per layer when some layers slide a window. None where nothing is hidden
        (one new token after a cache sees every key): its step trace then has no attn.mask."""
        full = causal_window_mask(n_new, n_keys, device=device)
        if attention_mask is not None:
            full = full & key_padding_mask(attention_mask)
        causal = None if attention_mask is None and n_new == 1 else full
        c = self.config
        if c.sliding_window is None:
            return causal
        window = causal_window_mask(n_new, n_keys, c.sliding_window, device)
        if attention_mask is not None:
            window = window & key_padding_mask(attention_mask)
        return [window if c.windowed(i) else causal for i in range(c.n_layers)]

    def forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> torch.Tensor:
        """ids (B, T) long; attention_mask (B, T_keys) with 0 on padding keys, combined with the causal mask;
        cache: the keys and values of the positions before `ids` (extended with theirs)."""
        offset = cache.length if cache is not None else 0
        masks = self._self_masks(ids.shape[1], offset + ids.shape[1], ids.device, attention_mask)
        x = self.decoder.embed(ids, offset=offset)
        x = self.decoder(x, self_mask=masks, cache=cache)
        return self.head(x)  # (B, T, vocab)

    def _trace_meta(self) -> dict:
        return {**super()._trace_meta(), "n_kv_heads": self.config.kv_heads}

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, D) -> next-token logits (B, T, vocab): the final norm, then the unembedding."""
        norm = self.decoder.ln_final
        return self.head(norm(hidden) if norm is not None else hidden)

    def linear_readout(self, output: int, position: int) -> LinearReadout:
        """The logit of token `output` after `position`: row `output` of the unembedding W_U, + its bias."""
        unembed = self.head.unembed
        bias = float(unembed.bias.detach()[output]) if unembed.bias is not None else 0.0
        return LinearReadout(((position, unembed.weight.detach()[output]),), bias)

    def trace(
        self,
        inputs: TokenInput,
        attention_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids. head.logits [T, vocab] holds the
        next-token scores after every position (`generation.next_token_table` ranks them). edits: applied in
        this pass, their names checked first (`intervene`)."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        return self._trace(
            lambda: self(ids, mask),
            keep,
            meta={"predict_position": -1},
            edits=edits,
            tokens=tokens,
            stack_layers={"decoder": self.config.n_layers},
        )

    def _cached_step(self, cache: KVCache, keep: NameFilter | None):
        """trace_step for `decode_steps`: runs the tokens the cache has not seen yet, against the cache."""

        def trace_step(sequence: list[int]) -> Trace:
            start = cache.length
            ids = torch.tensor([sequence[start:]], dtype=torch.long, device=self.device)
            labels = self.tokenizer.convert_ids_to_tokens(sequence) if self.tokenizer else [str(i) for i in sequence]
            return self._trace(
                lambda: self(ids, cache=cache),
                keep,
                meta={"predict_position": -1, "query_start": start},
                tokens=tuple(labels),
                stack_layers={"decoder": self.config.n_layers},
            )

        return trace_step

    def generate(
        self,
        prompt: TokenInput,
        max_new_tokens: int | None = None,
        *,
        sampling: Sampling | None = None,
        keep: NameFilter | None = None,
        use_cache: bool = True,
        final_trace: bool = True,
    ) -> Generation:
        """Continue `prompt`, one traced pass per new token, until EOS or the limit (the model's
        generation.max_new_tokens by default, and never past max_positions).

        sampling: None for greedy decoding, else temperature / top-k sampling with a seed (reproducible).
        use_cache: keep every layer's keys and values, so a step runs the new token only (its trace holds
        that token's attention row); False reruns the whole prefix each step. keep: what the step traces and the
        final pass store (default: everything but what Q and K give again). See `Generation` for the steps.
        final_trace: False skips the teacher-forced pass over the final sequence (`Generation.trace` is then None):
        a caller that reads only the steps saves a pass and its memory (smollm2 at 270 tokens: 130 MB).
        """
        settings = self.generation
        budget = max_new_tokens if max_new_tokens is not None else settings.max_new_tokens
        ids, _ = self._ids(prompt, self.config.vocab_size, self.config.max_positions, what="prompt")
        prompt_ids = ids[0].tolist()
        budget = max(0, min(budget, self.config.max_positions - len(prompt_ids)))
        if use_cache:
            step = self._cached_step(KVCache(self.config.n_layers, len(prompt_ids) + budget), keep)
        else:
            step = lambda sequence: self.trace(sequence, keep=keep)  # noqa: E731
        decoded = decode_steps(step, prompt_ids, settings, budget, sampling)
        if final_trace:  # filtered too: unfiltered, it doubled a continuation's memory
            final = self.trace(decoded.sequence, keep=keep)
            tokens = final.tokens
        else:
            final = None
            _, tokens = self._ids(decoded.sequence, self.config.vocab_size, None, what="sequence")
        return Generation(
            tuple(decoded.sequence),
            tuple(tokens),
            len(prompt_ids),
            decoded.steps,
            final,
            decoded.finished,
            decoded.probabilities,
            sampling,
        )
