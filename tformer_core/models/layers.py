"""The parts every model family is built from: attention, feed-forward, blocks, embeddings (of tokens and of
image patches), stacks.

Shapes use B = batch, T = tokens (Tq queries, Tk keys), D = d_model, h = heads,
dh = d_head, F = d_ff. Attention is written out step by step (no fused kernel) so that every
intermediate the lecture names exists as a tensor and passes through a `HookPoint`.

Mask convention (as `torch.nn.functional.scaled_dot_product_attention`): a boolean mask,
broadcastable to (B, h, Tq, Tk), True where a query MAY attend to a key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import HALF_PRECISION, attention_logits, attention_weights, grouped_matmul, widened
from ..capture import HookPoint
from .positional import RelativePositionBias, Rope, RotaryEmbedding, apply_rotary, make_positions

__all__ = [
    "ACTIVATIONS",
    "NORM_PLACEMENTS",
    "NORM_TYPES",
    "Block",
    "BlockConfig",
    "FeedForward",
    "KVCache",
    "LMHead",
    "LayerCache",
    "MultiHeadAttention",
    "PatchEmbedding",
    "PatchInputConfig",
    "RMSNorm",
    "Stack",
    "TextEmbedding",
    "TextInputConfig",
    "causal_mask",
    "causal_window_mask",
    "key_padding_mask",
    "make_norm",
    "patchify",
    "resized_positions",
    "text_embedding",
]

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
    ffn_gated: FFN hidden = act(x W_gate) * (x W_in), T5 v1.1's gated GELU, Llama's SwiGLU (act = SiLU).
    rel_pos_buckets: > 0 gives each stack T5's relative position bias with that many buckets.
    n_kv_heads: grouped-query attention (Llama 2 70B and later, Mistral, Qwen, SmolLM): K and V have this
        many heads, each read by n_heads / n_kv_heads query heads; None = n_heads (one K, V per query head).
    qkv_bias, out_bias: biases of W^Q, W^K, W^V and of W^O when they differ from `bias` (Qwen2: Q, K, V only).
    qk_norm: an RMSNorm over each head's q and k before the rotation (Qwen3).
    rope: rotary position embedding of self-attention (Q and K turned by position), or None.
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
    n_kv_heads: int | None = None
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    qk_norm: bool = False
    rope: Rope | None = None

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORM_PLACEMENTS:
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.norm_type not in NORM_TYPES:
            raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; set d_head")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.rope is not None and self.head_dim % 2:
            raise ValueError(f"rotary embedding turns pairs of dimensions: d_head={self.head_dim} must be even")

    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Heads of K and V: n_kv_heads with grouped-query attention, else n_heads."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads


class RMSNorm(nn.RMSNorm):
    """x / sqrt(mean(x^2) + eps) * gamma, computed as transformers' Llama, Qwen and T5 compute it: the mean square
    and the division in float32, the result rounded to the input's dtype, then times gamma in that dtype. For a
    bfloat16 model that is the reference's rounding (torch's own RMSNorm multiplies by gamma before rounding:
    a bit apart, which 30 layers turn into visible differences); for float32 it is the same computation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        wide = x.float() if x.dtype in HALF_PRECISION else x
        normalised = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return normalised if self.weight is None else self.weight * normalised


def make_norm(cfg: BlockConfig) -> nn.Module:
    """The block's norm. LayerNorm is torch's: for bfloat16 and float16 inputs its kernels compute in float32 and
    round once, as transformers' models (which use the same module) do; RMSNorm is `RMSNorm` above."""
    if cfg.norm_type == "rmsnorm":
        return RMSNorm(cfg.d_model, eps=cfg.ln_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)


class LayerCache:
    """One attention layer's keys and values of the positions already run (a key/value cache), in buffers
    allocated once for `capacity` positions: a generation step computes K and V of its new token only.

    `extend` writes the new positions after the old ones and returns views of everything so far. A view
    handed out earlier (a step's trace holds one) keeps its values: later steps write past its end.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity, self.length = capacity, 0
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, h_kv, T_new, dh) -> the layer's K and V (B, h_kv, T_old + T_new, dh)."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the key/value cache holds {self.capacity} positions; {end} were asked for")
        if self.keys is None or self.values is None:
            B, h, _, dh = k.shape
            self.keys = k.new_empty(B, h, self.capacity, dh)
            self.values = v.new_empty(B, v.shape[1], self.capacity, v.shape[3])
        keys, values = self.keys, self.values
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        self.length = end
        return keys[:, :, :end], values[:, :, :end]


class KVCache:
    """The key/value caches of a stack's layers, for one generation (one sequence or one batch)."""

    def __init__(self, n_layers: int, capacity: int) -> None:
        self.layers = [LayerCache(capacity) for _ in range(n_layers)]

    @property
    def length(self) -> int:
        """Positions already run: the position of the next token."""
        return self.layers[0].length


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + bias, masked) V per head, heads concatenated, times W^O.

    Hook points: q (B, h, Tq, dh); k, v (B, h_kv, Tk, dh), one per key/value head (h_kv = h unless the
    attention is grouped-query: query head i then reads K and V head i // (h / h_kv)); with rotary
    embedding, q and k are recorded after the rotation, as they are multiplied, and q_pre_rope, k_pre_rope
    before it; scores = Q K^T and scaled = the softmax input (scores * scale + bias, masked cells at -inf),
    weights (B, h, Tq, Tk); mask (B, 1, Tq, Tk), True where attending is allowed, only when there is a mask;
    z = weights V per head (B, h, Tq, dh); out = concat(z) W^O (B, Tq, D).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int,
        bias: bool = True,
        scaled: bool = True,
        *,
        n_kv_heads: int | None = None,
        out_bias: bool | None = None,
        rotary: bool = False,
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.n_kv_heads = n_kv_heads or n_heads
        self.group = n_heads // self.n_kv_heads  # query heads per key/value head
        # T5 folds the scale into its weights and multiplies by 1; every other family uses 1/sqrt(d_k).
        self.scale = 1.0 / math.sqrt(d_head) if scaled else 1.0
        self.W_q = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.W_k = nn.Linear(d_model, self.n_kv_heads * d_head, bias=bias)
        self.W_v = nn.Linear(d_model, self.n_kv_heads * d_head, bias=bias)
        self.W_o = nn.Linear(n_heads * d_head, d_model, bias=bias if out_bias is None else out_bias)
        # Qwen3 normalises each head's q and k (over d_head) before the rotation.
        self.q_norm = RMSNorm(d_head, eps=qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(d_head, eps=qk_norm_eps) if qk_norm_eps is not None else None
        if rotary:
            self.hook_q_pre_rope, self.hook_k_pre_rope = HookPoint(), HookPoint()
        self.rotary = rotary
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_scores, self.hook_scaled, self.hook_weights = HookPoint(), HookPoint(), HookPoint()
        self.hook_mask, self.hook_z, self.hook_out = HookPoint(), HookPoint(), HookPoint()

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads, self.d_head).transpose(1, 2)  # (B, heads, T, dh)

    def _qkv(
        self,
        x: torch.Tensor,
        k_input: torch.Tensor,
        v_input: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        cache: LayerCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (B, h, Tq, dh), K and V (B, h_kv, Tk, dh) as the scores use them: normalised, rotated, cached."""
        q = self._split_heads(self.W_q(x), self.n_heads)  # (B, h, Tq, dh)
        k = self._split_heads(self.W_k(k_input), self.n_kv_heads)  # (B, h_kv, Tk, dh)
        v = self._split_heads(self.W_v(v_input), self.n_kv_heads)  # (B, h_kv, Tk, dh)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            if rotary is None:
                raise ValueError("this attention layer rotates Q and K: it needs the positions' cos and sin")
            q, k = self.hook_q_pre_rope(q), self.hook_k_pre_rope(k)
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, h_kv, T_cached + Tk, dh)
        return self.hook_q(q), self.hook_k(k), self.hook_v(v)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: LayerCache | None = None,
        values: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: queries' input (B, Tq, D); memory: keys' and values' input (B, Tk, D), x when None.
        rotary: (cos, sin) of the new positions, (1, 1, Tq, dh); cache: this layer's keys and values of
        earlier positions (the mask then covers them: (.., Tq, T_cached + Tq)). values: the values' input
        when it is not the keys' (DETR adds its positions to the queries' and keys' inputs only)."""
        kv_input = x if memory is None else memory
        q, k, v = self._qkv(x, kv_input, kv_input if values is None else values, rotary, cache)
        # The rule of tformer_core.attention, step by step, each step through its hook point.
        scores = self.hook_scores(grouped_matmul(q, k.transpose(-2, -1)))  # (B, h, Tq, Tk)
        if mask is not None:
            self.hook_mask(mask.expand(q.shape[0], 1, q.shape[2], k.shape[2]))  # a view, for the trace
        scaled = self.hook_scaled(attention_logits(scores, self.scale, position_bias, mask))
        weights = self.hook_weights(attention_weights(scaled, mask))
        z = self.hook_z(grouped_matmul(weights, v))  # (B, h, Tq, dh)
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
        self.attn = MultiHeadAttention(
            D,
            h,
            dh,
            cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
            cfg.scale_attention,
            n_kv_heads=cfg.n_kv_heads,
            out_bias=cfg.bias if cfg.out_bias is None else cfg.out_bias,
            rotary=cfg.rope is not None,
            qk_norm_eps=cfg.ln_eps if cfg.qk_norm else None,
        )
        self.ln_attn = make_norm(cfg)
        self.hook_ln_attn = HookPoint()
        self.hook_resid_after_attn = HookPoint()
        self.cross_attn: MultiHeadAttention | None = None
        self.ln_cross: nn.Module | None = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(D, h, dh, cfg.bias, cfg.scale_attention)
            self.ln_cross = make_norm(cfg)
            self.hook_ln_cross = HookPoint()
            self.hook_resid_after_cross = HookPoint()
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
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self._residual(
            x,
            lambda y: self.attn(y, mask=self_mask, position_bias=position_bias, rotary=rotary, cache=cache),
            self.ln_attn,
            self.hook_ln_attn,
        )
        x = self.hook_resid_after_attn(x)
        if self.cross_attn is not None and self.ln_cross is not None:
            if memory is None:
                raise ValueError("a decoder block with cross-attention needs the encoder output")
            cross = self.cross_attn
            x = self._residual(x, lambda y: cross(y, memory=memory, mask=cross_mask), self.ln_cross, self.hook_ln_cross)
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
        pos = self.hook_pos(self.pos(T, offset).expand(B, T, -1)) if self.pos is not None else None  # a view
        # Segments are added before positions, as BERT adds them: in bfloat16 the order of the sums shows.
        if self.segment is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            x = x + self.hook_segment(self.segment(token_type_ids))
        if pos is not None:
            x = x + pos
        if self.ln is not None:
            x = self.ln(x)
        return self.hook_out(x)


class TextInputConfig(Protocol):
    """The fields of a text model's config that its token embedding reads (Encoder, Decoder, Seq2Seq configs)."""

    @property
    def d_model(self) -> int: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def positional(self) -> str: ...
    @property
    def pe_base(self) -> float: ...
    @property
    def ln_eps(self) -> float: ...
    @property
    def pe_layout(self) -> str: ...
    @property
    def position_first_row(self) -> int: ...


def text_embedding(
    c: TextInputConfig, vocab_size: int, *, n_token_types: int = 0, scale: bool = False, norm: bool = False
) -> TextEmbedding:
    """The token embedding (+ positions, + segments, LayerNorm) of a text model with config `c`: the one place
    the three text families build theirs. scale: * sqrt(d_model); norm: a LayerNorm after the sum (BERT)."""
    return TextEmbedding(
        vocab_size,
        c.d_model,
        c.max_positions,
        c.positional,
        c.pe_base,
        n_token_types=n_token_types,
        scale=scale,
        norm=norm,
        ln_eps=c.ln_eps,
        pe_layout=c.pe_layout,
        position_first_row=c.position_first_row,
    )


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C*P*P): patches in row-major order, each flattened channel-first.

    Channel-first flattening (c, py, px) makes the patch embedding the same linear map as a
    Conv2d with kernel = stride = P, so convolutional checkpoints load as they are.
    """
    B, C, H, W = images.shape
    P = patch_size
    x = images.reshape(B, C, H // P, P, W // P, P)  # (B, C, rows, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, rows, cols, C, P, P)
    return x.reshape(B, (H // P) * (W // P), C * P * P)  # (B, N, C*P*P)


class PatchInputConfig(Protocol):
    """The fields of a vision config that its patch embedding reads (ViTConfig)."""

    @property
    def patch_size(self) -> int: ...
    @property
    def n_channels(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def distilled(self) -> bool: ...
    @property
    def n_prefix_tokens(self) -> int: ...
    @property
    def n_registers(self) -> int: ...
    @property
    def n_patches(self) -> int: ...
    @property
    def grid_hw(self) -> tuple[int, int]: ...
    @property
    def position_grid(self) -> tuple[int, int]: ...
    @property
    def pos_antialias(self) -> bool: ...


class PatchEmbedding(nn.Module):
    """Hooks: patches (B, N, C*P*P), patch (B, N, D) the embedded patches, tokens (B, n_prefix+N, D)
    with the prefix tokens prepended ([CLS], DeiT's [DIST], then the registers), pos (B, n_prefix+N, D) the
    position embeddings as added (`positions`), out their sum.

    Registers (DINOv2 with registers, Darcet et al. 2024) are learned tokens after the class token that have no
    position: their rows of `pos` are zeros. The table `self.pos` holds a row for each token before the registers
    and one per cell of its own grid (`position_grid`); when that grid is not the picture's, its patch rows are
    resized to the picture's grid bicubically in every pass, as DINOv2 does (trained at 518 pixels, read at 224).
    """

    def __init__(self, c: PatchInputConfig) -> None:
        super().__init__()
        self.patch_size = c.patch_size
        self.grid_hw, self.position_grid, self.pos_antialias = c.grid_hw, c.position_grid, c.pos_antialias
        self.project = nn.Linear(c.n_channels * c.patch_size**2, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.distilled else None
        self.registers = nn.Parameter(torch.zeros(1, c.n_registers, c.d_model)) if c.n_registers else None
        self.n_positioned = c.n_prefix_tokens - c.n_registers  # prefix tokens with a row in the table
        rows, cols = c.position_grid
        self.pos = nn.Parameter(torch.zeros(1, self.n_positioned + rows * cols, c.d_model))
        for p in (self.cls_token, self.dist_token, self.pos):
            if p is not None:
                nn.init.normal_(p, std=0.02)
        self.hook_patches, self.hook_patch, self.hook_tokens = HookPoint(), HookPoint(), HookPoint()
        self.hook_pos, self.hook_out = HookPoint(), HookPoint()

    def positions(self) -> torch.Tensor:
        """(1, n_prefix+N, D): what is added to each token, the picture's grid (registers' rows zero)."""
        if self.registers is None and self.position_grid == self.grid_hw:
            return self.pos
        prefix, grid = self.pos[:, : self.n_positioned], self.pos[:, self.n_positioned :]
        if self.position_grid != self.grid_hw:
            grid = resized_positions(grid, self.position_grid, self.grid_hw, self.pos_antialias)
        parts = [prefix]
        if self.registers is not None:
            parts.append(torch.zeros_like(self.registers))
        return torch.cat([*parts, grid], dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        B = images.shape[0]
        patches = self.hook_patches(patchify(images, self.patch_size))  # (B, N, C*P*P)
        x = self.hook_patch(self.project(patches))  # (B, N, D)
        prefix = [self.cls_token] + [t for t in (self.dist_token, self.registers) if t is not None]
        x = torch.cat([p.expand(B, -1, -1) for p in prefix] + [x], dim=1)  # (B, n_prefix+N, D)
        x = self.hook_tokens(x)
        pos = self.hook_pos(self.positions().expand(B, -1, -1))
        return self.hook_out(x + pos)


def resized_positions(
    grid: torch.Tensor, from_hw: tuple[int, int], to_hw: tuple[int, int], antialias: bool = False
) -> torch.Tensor:
    """A grid's position embeddings (1, rows*cols, D) resized to another grid (1, rows'*cols', D): bicubic, in
    float32, corners not aligned, as DINOv2 (facebookresearch/dinov2 and transformers) resizes its table; DINOv2
    with registers also antialiases (which only changes a table that shrinks)."""
    D = grid.shape[-1]
    table = grid.reshape(1, *from_hw, D).permute(0, 3, 1, 2)  # (1, D, rows, cols)
    table = F.interpolate(table.float(), size=to_hw, mode="bicubic", align_corners=False, antialias=antialias)
    return table.to(grid.dtype).permute(0, 2, 3, 1).reshape(1, to_hw[0] * to_hw[1], D)  # (1, rows'*cols', D)


class LMHead(nn.Module):
    """Next-token logits from the final hidden states: h W_U (+ b), W_U often the token embedding itself.
    Hook: logits (B, T, vocab), float32 for a half-precision model (the product in the model's dtype, then
    widened, as transformers' generate and loss widen them: a softmax over 50,000 bfloat16 logits is coarse);
    a float32 or float64 model's own dtype otherwise."""

    def __init__(self, d_model: int, vocab_size: int, bias: bool = False) -> None:
        super().__init__()
        self.unembed = nn.Linear(d_model, vocab_size, bias=bias)
        self.hook_logits = HookPoint()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hook_logits(widened(self.unembed(hidden)))


EmbeddingT = TypeVar("EmbeddingT", bound=nn.Module)


class Stack(nn.Module, Generic[EmbeddingT]):
    """An embedding, N blocks and (for pre-norm) a final LayerNorm. Hook: out (B, T, D).

    With cfg.rel_pos_buckets, the stack owns T5's relative position bias, computed once and added
    to the self-attention logits of every layer. Hook: position_bias (1, h, T, T).
    With cfg.rope, it owns the rotary embedding: cos and sin of the positions, computed once per pass
    and used by every layer's self-attention to turn Q and K.
    """

    def __init__(self, cfg: BlockConfig, n_layers: int, embed: EmbeddingT, cross_attention: bool = False) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a stack needs at least one layer, got n_layers={n_layers}")
        self.embed: EmbeddingT = embed
        self.rel_pos: RelativePositionBias | None = None
        if cfg.rel_pos_buckets:
            # Decoder stacks (the ones with cross-attention) only look back.
            self.rel_pos = RelativePositionBias(
                cfg.rel_pos_buckets, cfg.rel_pos_max_distance, cfg.n_heads, bidirectional=not cross_attention
            )
            self.hook_position_bias = HookPoint()
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope) if cfg.rope is not None else None
        blocks = [Block(cfg, cross_attention) for _ in range(n_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.block_list = blocks  # the same modules, typed (a plain list registers nothing)
        self.ln_final = make_norm(cfg) if cfg.norm == "pre" else None
        self.hook_out = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor | Sequence[torch.Tensor | None] | None = None,
        memory: torch.Tensor | None = None,
        cross_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x: the embedded input (B, T, D) -> (B, T, D).

        self_mask: one mask for every layer, or one per layer (sliding-window layers differ). cache: the
        keys and values of earlier positions (x then holds the new positions only, after them).
        """
        bias = None
        if self.rel_pos is not None:
            bias = self.hook_position_bias(self.rel_pos(x.shape[1], x.shape[1]).to(x.dtype))
        offset = cache.length if cache is not None else 0
        rotary = self.rotary(x.shape[1], offset, x.dtype) if self.rotary is not None else None
        masks = self_mask if isinstance(self_mask, (list, tuple)) else [self_mask] * len(self.blocks)
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x = block(x, masks[i], memory, cross_mask, bias, rotary, layer_cache)
        if self.ln_final is not None:
            x = self.ln_final(x)
        return self.hook_out(x)


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) bool, True on and below the diagonal: position i may attend to j <= i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def causal_window_mask(
    n_q: int, n_k: int, window: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """(n_q, n_k) bool for the last n_q of n_k positions (the new ones after a cache): query at position
    p = n_k - n_q + i may attend to key j when j <= p and, with a sliding `window`, p - j < window
    (Mistral's and Qwen's sliding-window layers: each token sees itself and the window - 1 before it)."""
    query = torch.arange(n_k - n_q, n_k, device=device)[:, None]
    key = torch.arange(n_k, device=device)[None, :]
    allowed = key <= query
    if window is not None:
        allowed = allowed & (query - key < window)
    return allowed


def key_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, Tk) with 1 / True for real tokens -> (B, 1, 1, Tk) bool, broadcast over heads and queries."""
    return attention_mask.bool()[:, None, None, :]
