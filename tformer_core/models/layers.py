"""The parts every model family is built from: attention, feed-forward, blocks, stacks.

Shapes use B = batch, T = tokens (Tq queries, Tk keys), D = d_model, h = heads,
dh = d_head, F = d_ff. Attention is written out step by step (no fused kernel) so that every
intermediate the lecture names exists as a tensor and passes through a `HookPoint`.

Mask convention (as `torch.nn.functional.scaled_dot_product_attention`): a boolean mask,
broadcastable to (B, h, Tq, Tk), True where a query MAY attend to a key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..capture import HookPoint
from .positional import RelativePositionBias, make_positions

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf) GELU: BERT, ViT
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's and T5 v1.1's "gelu_new"
    "silu": F.silu,  # "swish": Marian
}
NORM_PLACEMENTS = ("post", "pre")
NORM_TYPES = ("layernorm", "rmsnorm")


@dataclass(frozen=True, kw_only=True)
class BlockConfig:
    """What a Transformer block needs; each family's config extends it.

    norm: "post" = x <- LN(x + f(x)) (original Transformer, BERT);
          "pre"  = x <- x + f(LN(x)) (GPT-2, ViT, T5), with a final LayerNorm after the stack.
    norm_type: "layernorm", or "rmsnorm" (T5: no mean subtraction, no bias).
    scale_attention: divide Q K^T by sqrt(d_k); T5 does not (its initialisation absorbs it).
    ffn_gated: FFN hidden = act(x W_gate) * (x W_in), T5 v1.1's gated GELU.
    rel_pos_buckets: > 0 gives each stack T5's relative position bias with that many buckets.
    """

    d_model: int = 64
    n_heads: int = 4
    d_head: int | None = None  # default d_model // n_heads
    d_ff: int = 256
    activation: str = "gelu"
    norm: str = "post"
    ln_eps: float = 1e-5
    bias: bool = True  # biases of W^Q, W^K, W^V, W^O and the FFN
    norm_type: str = "layernorm"
    scale_attention: bool = True
    ffn_gated: bool = False
    rel_pos_buckets: int = 0
    rel_pos_max_distance: int = 128

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORM_PLACEMENTS:
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.norm_type not in NORM_TYPES:
            raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set d_head")

    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads


def make_norm(cfg: BlockConfig) -> nn.Module:
    if cfg.norm_type == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.ln_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + bias, masked) V per head, heads concatenated, times W^O.

    Hook points: q, k, v (B, h, T, dh); scores = Q K^T and scaled = the softmax input
    (scores * scale + bias, masked cells at -inf), weights (B, h, Tq, Tk); mask (B, 1, Tq, Tk),
    True where attending is allowed, only when there is a mask; z = weights V per head
    (B, h, Tq, dh); out = concat(z) W^O (B, Tq, D).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, bias: bool = True, scaled: bool = True) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        # T5 folds the scale into its weights and multiplies by 1; every other family uses 1/sqrt(d_k).
        self.scale = 1.0 / math.sqrt(d_head) if scaled else 1.0
        inner = n_heads * d_head
        self.W_q = nn.Linear(d_model, inner, bias=bias)
        self.W_k = nn.Linear(d_model, inner, bias=bias)
        self.W_v = nn.Linear(d_model, inner, bias=bias)
        self.W_o = nn.Linear(inner, d_model, bias=bias)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_scores, self.hook_scaled, self.hook_weights = HookPoint(), HookPoint(), HookPoint()
        self.hook_mask, self.hook_z, self.hook_out = HookPoint(), HookPoint(), HookPoint()

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, dh)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: queries' input (B, Tq, D); memory: keys' and values' input (B, Tk, D), x when None."""
        kv_input = x if memory is None else memory
        q = self.hook_q(self._split_heads(self.W_q(x)))  # (B, h, Tq, dh)
        k = self.hook_k(self._split_heads(self.W_k(kv_input)))  # (B, h, Tk, dh)
        v = self.hook_v(self._split_heads(self.W_v(kv_input)))  # (B, h, Tk, dh)

        scores = self.hook_scores(q @ k.transpose(-2, -1))  # (B, h, Tq, Tk)
        scaled = scores * self.scale if self.scale != 1.0 else scores
        if position_bias is not None:
            scaled = scaled + position_bias
        if mask is not None:
            scaled = scaled.masked_fill(~mask, float("-inf"))
            self.hook_mask(mask.expand(q.shape[0], 1, q.shape[2], k.shape[2]))  # a view, for the trace
        scaled = self.hook_scaled(scaled)
        weights = torch.softmax(scaled, dim=-1)
        if mask is not None:
            # A query that may attend to nothing (e.g. a padding query under a causal+padding mask)
            # would get 0/0 = NaN; it contributes nothing instead.
            attends_nothing = ~mask.any(dim=-1, keepdim=True)
            if bool(attends_nothing.any()):
                weights = weights.masked_fill(attends_nothing, 0.0)
        weights = self.hook_weights(weights)

        z = self.hook_z(weights @ v)  # (B, h, Tq, dh)
        B, _, Tq, _ = z.shape
        concat = z.transpose(1, 2).reshape(B, Tq, self.n_heads * self.d_head)  # (B, Tq, h*dh)
        return self.hook_out(self.W_o(concat))  # (B, Tq, D)


class FeedForward(nn.Module):
    """Position-wise FFN: act(x W_1 + b_1) W_2 + b_2 (gated: act(x W_gate) * (x W_1), then W_2).

    Hooks: hidden (B, T, F), out (B, T, D).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool = True, gated: bool = False) -> None:
        super().__init__()
        self.W_in = nn.Linear(d_model, d_ff, bias=bias)
        self.W_gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.W_out = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.hook_hidden, self.hook_out = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.W_gate is None:
            hidden = self.act(self.W_in(x))
        else:
            hidden = self.act(self.W_gate(x)) * self.W_in(x)
        hidden = self.hook_hidden(hidden)
        return self.hook_out(self.W_out(hidden))


class Block(nn.Module):
    """Self-attention, optional cross-attention, FFN, each with a residual connection and LayerNorm.

    Residual stream hooks: resid_pre (block input), resid_after_attn, resid_after_cross (decoder
    blocks with cross-attention), resid_post (block output). ln_attn / ln_cross / ln_mlp record
    each LayerNorm's output: with pre-norm that is the sub-layer's input, with post-norm it is
    the new residual stream.
    """

    def __init__(self, cfg: BlockConfig, cross_attention: bool = False) -> None:
        super().__init__()
        self.pre_norm = cfg.norm == "pre"
        D, h, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.hook_resid_pre = HookPoint()
        self.attn = MultiHeadAttention(D, h, dh, cfg.bias, cfg.scale_attention)
        self.ln_attn = make_norm(cfg)
        self.hook_ln_attn = HookPoint()
        self.hook_resid_after_attn = HookPoint()
        if cross_attention:
            self.cross_attn = MultiHeadAttention(D, h, dh, cfg.bias, cfg.scale_attention)
            self.ln_cross = make_norm(cfg)
            self.hook_ln_cross = HookPoint()
            self.hook_resid_after_cross = HookPoint()
        else:
            self.cross_attn = None
        self.mlp = FeedForward(D, cfg.d_ff, cfg.activation, cfg.bias, cfg.ffn_gated)
        self.ln_mlp = make_norm(cfg)
        self.hook_ln_mlp = HookPoint()
        self.hook_resid_post = HookPoint()

    def _residual(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor], ln: nn.Module, hook_ln: HookPoint
    ) -> torch.Tensor:
        if self.pre_norm:
            return x + sublayer(hook_ln(ln(x)))
        return hook_ln(ln(x + sublayer(x)))

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        cross_mask: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self._residual(
            x, lambda y: self.attn(y, mask=self_mask, position_bias=position_bias), self.ln_attn, self.hook_ln_attn
        )
        x = self.hook_resid_after_attn(x)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("a decoder block with cross-attention needs the encoder output")
            x = self._residual(
                x, lambda y: self.cross_attn(y, memory=memory, mask=cross_mask), self.ln_cross, self.hook_ln_cross
            )
            x = self.hook_resid_after_cross(x)
        x = self._residual(x, self.mlp, self.ln_mlp, self.hook_ln_mlp)
        return self.hook_resid_post(x)


class TextEmbedding(nn.Module):
    """Token embedding (* sqrt(D) when scaled) + positional encoding (+ segment), optional LayerNorm.

    Hooks: tok (B, T, D) the token embeddings as added; pos (B, T, D) the positional encodings
    (absent with positional="none"); segment (B, T, D) when the model has token types;
    out (B, T, D) the input of layer 0.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        max_positions: int,
        positional: str = "learned",
        pe_base: float = 10000.0,
        n_token_types: int = 0,
        scale: bool = False,
        norm: bool = False,
        ln_eps: float = 1e-5,
        pe_layout: str = "interleaved",
        position_first_row: int = 0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = make_positions(positional, max_positions, d_model, pe_base, pe_layout, position_first_row)
        self.segment = nn.Embedding(n_token_types, d_model) if n_token_types else None
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.ln = nn.LayerNorm(d_model, eps=ln_eps) if norm else None
        self.hook_tok, self.hook_out = HookPoint(), HookPoint()
        if self.pos is not None:
            self.hook_pos = HookPoint()
        if self.segment is not None:
            self.hook_segment = HookPoint()
        self.max_positions = max_positions

    def forward(self, ids: torch.Tensor, token_type_ids: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        B, T = ids.shape
        tok = self.tok(ids)
        if self.scale != 1.0:
            tok = tok * self.scale
        x = self.hook_tok(tok)
        if self.pos is not None:
            x = x + self.hook_pos(self.pos(T, offset).expand(B, T, -1))  # a view: no copy per batch row
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            x = x + self.hook_segment(self.segment(token_type_ids))
        if self.ln is not None:
            x = self.ln(x)
        return self.hook_out(x)


class Stack(nn.Module):
    """An embedding, N blocks and (for pre-norm) a final LayerNorm. Hook: out (B, T, D).

    With cfg.rel_pos_buckets, the stack owns T5's relative position bias, computed once and added
    to the self-attention logits of every layer. Hook: position_bias (1, h, T, T).
    """

    def __init__(self, cfg: BlockConfig, n_layers: int, embed: nn.Module, cross_attention: bool = False) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a stack needs at least one layer, got n_layers={n_layers}")
        self.embed = embed
        if cfg.rel_pos_buckets:
            # Decoder stacks (the ones with cross-attention) only look back.
            self.rel_pos = RelativePositionBias(
                cfg.rel_pos_buckets, cfg.rel_pos_max_distance, cfg.n_heads, bidirectional=not cross_attention
            )
            self.hook_position_bias = HookPoint()
        else:
            self.rel_pos = None
        self.blocks = nn.ModuleList(Block(cfg, cross_attention) for _ in range(n_layers))
        self.ln_final = make_norm(cfg) if cfg.norm == "pre" else None
        self.hook_out = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        cross_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: the embedded input (B, T, D) -> (B, T, D)."""
        bias = None
        if self.rel_pos is not None:
            bias = self.hook_position_bias(self.rel_pos(x.shape[1], x.shape[1]).to(x.dtype))
        for block in self.blocks:
            x = block(x, self_mask, memory, cross_mask, bias)
        if self.ln_final is not None:
            x = self.ln_final(x)
        return self.hook_out(x)


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) bool, True on and below the diagonal: position i may attend to j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def key_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, Tk) with 1 / True for real tokens -> (B, 1, 1, Tk) bool, broadcast over heads and queries."""
    return attention_mask.bool()[:, None, None, :]
