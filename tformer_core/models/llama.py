"""Llama-family decoders (Llama 2 and 3, Mistral, Qwen2, Qwen3, SmolLM): the GPT-2 `Decoder` with the parts
that replaced GPT-2's since 2023, each a switch of the shared layers.

- Rotary position embedding (`Rope`): no position vector is added to the input; each layer turns every
  head's q and k by an angle proportional to the position, so q . k depends on the offset only.
- Grouped-query attention (`n_kv_heads`): several query heads share one K and V head (SmolLM2: 9 query
  heads, 3 key/value heads), which shrinks the key/value cache.
- RMSNorm (no mean subtraction, no bias) before each sub-layer and after the stack.
- SwiGLU feed-forward: W_out (SiLU(x W_gate) * (x W_in)), no biases.
- Optional: a sliding window on some layers (Mistral, Qwen2), an RMSNorm of q and k per head (Qwen3),
  biases on Q, K and V (Qwen2), the output layer tied to the embedding (SmolLM, small Qwen and Llama 3.2).

Why a configuration of `Decoder` rather than a module of its own: the forward pass is the same block
(pre-norm, attention, residual, FFN, residual) with different parts plugged in, and generation, the key/value
cache and the trace format are shared with GPT-2; the parts live in layers.py and positional.py, where the
encoder and the other families can use them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .decoder import Decoder, DecoderConfig
from .positional import Rope, rope_attention_factor, rope_frequencies

__all__ = ["Llama", "LlamaConfig"]


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    """Llama defaults: pre-norm RMSNorm, SwiGLU (SiLU-gated FFN), rotary positions, no biases, an output
    layer of its own. Set n_kv_heads for grouped-query attention, qk_norm for Qwen3, sliding_window for
    Mistral."""

    positional: str = "none"  # positions enter through the rotation of q and k
    rope: Rope | None = field(default_factory=Rope)
    norm: str = "pre"
    norm_type: str = "rmsnorm"
    activation: str = "silu"
    ffn_gated: bool = True
    bias: bool = False
    tie_embeddings: bool = False
    ln_eps: float = 1e-6


class Llama(Decoder):
    """A Llama-family decoder: ids (B, T) -> next-token logits (B, T, vocab), traced like every `Decoder`.

    Rotary models record q and k after the rotation (`decoder.{l}.attn.q`, `.k`: what the scores
    multiply) and before it (`attn.q_pre_rope`, `attn.k_pre_rope`). With grouped-query attention, K and V
    are [kv_heads, tokens, d_head] and `trace.kv_head(h)` names the one query head h reads.
    """

    config: LlamaConfig

    def rope_frequencies(self) -> np.ndarray:
        """This model's rotation speeds, float64 [d_head / 2] in radians per position, its scaling applied:
        pair i (dimensions i and i + d_head / 2 of every head's q and k) turns by position * frequency[i]."""
        return rope_frequencies(self.config.head_dim, self.config.rope)

    @property
    def rope_attention_factor(self) -> float:
        """What cos and sin are multiplied by (1 except with YaRN scaling)."""
        rope = self.config.rope
        return 1.0 if rope is None else rope_attention_factor(rope)
