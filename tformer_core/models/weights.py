"""A model's weights by meaning, in TransformerLens's shapes: what views read instead of module attributes.

    w = model.weights()                     # the main stack ("encoder", or "decoder" for a decoder-only model)
    w.W_Q                                   # [layers, heads, d_model, d_head], every layer stacked
    w.block(3).attn.W_K                     # [kv_heads, d_model, d_head] of one layer
    w.block(3).cross_attn.W_Q               # an encoder-decoder's decoder: cross-attention, queries from the decoder
    w.block(3).ln_mlp.w, .b, .eps           # a norm's gamma [d_model], beta [d_model] (None for RMSNorm)
    w.block(3).mlp.W_in                     # [d_model, d_ff], as the lecture writes y = x W + b
    w.W_E, w.W_pos                          # [vocab, d_model], [positions, d_model]
    model.weights().patch.W                 # a ViT's patch kernels [d_model, channels, P, P]

Shapes (h = heads, h_kv = key/value heads, D = d_model, dh = d_head, F = d_ff):
    W_Q [h, D, dh], b_Q [h, dh]; W_K, W_V [h_kv, D, dh], b_K, b_V [h_kv, dh]   q = x W_Q[i] + b_Q[i] per head i
    W_O [h, dh, D], b_O [D]                              out = sum_i z_i W_O[i] + b_O
    W_in, W_gate [D, F], b_in, b_gate [F]; W_out [F, D], b_out [D]
With grouped-query attention (h_kv < h), query head i reads key/value head i // (h / h_kv): W_K and W_V
hold one matrix per key/value head, as the trace's K and V do (TransformerLens repeats them per query head).
A missing bias is zeros (as in TransformerLens), except a norm's beta, which is None for RMSNorm.

The tensors are views of the model's parameters (detached, on its device, in its dtype): nothing is copied,
and writing to one changes the model. Only the core's own modules have them: a model that transformers
runs says `capabilities.weights` False and raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .layers import Block, FeedForward, MultiHeadAttention, PatchEmbedding, Stack, TextEmbedding
from .positional import LearnedPositions, SinusoidalPositions

__all__ = [
    "AttentionWeights",
    "BlockWeights",
    "FFNWeights",
    "NormWeights",
    "PatchWeights",
    "StackWeights",
    "attention_weights_of",
    "block_weights",
    "ffn_weights",
    "norm_weights",
    "stack_weights",
]


@dataclass(frozen=True, eq=False)
class NormWeights:
    """A LayerNorm's gamma w [D] and beta b [D], or an RMSNorm's gamma (b None); eps as the model adds it."""

    kind: str  # "layernorm" | "rmsnorm"
    w: torch.Tensor
    b: torch.Tensor | None
    eps: float


@dataclass(frozen=True, eq=False)
class AttentionWeights:
    """One attention layer (shapes in the module docstring). scale: what Q K^T is multiplied by (1/sqrt(dh),
    or 1 for T5); rotary: q and k are turned by position after the projections; q_norm, k_norm: Qwen3's
    RMSNorm of each head's q and k (over dh), before the rotation, else None."""

    W_Q: torch.Tensor
    b_Q: torch.Tensor
    W_K: torch.Tensor
    b_K: torch.Tensor
    W_V: torch.Tensor
    b_V: torch.Tensor
    W_O: torch.Tensor
    b_O: torch.Tensor
    scale: float
    rotary: bool
    q_norm: NormWeights | None = None
    k_norm: NormWeights | None = None

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.W_K.shape[0]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[2]

    def kv_head(self, head: int) -> int:
        """The key/value head query head `head` reads."""
        return head // (self.n_heads // self.n_kv_heads)


@dataclass(frozen=True, eq=False)
class FFNWeights:
    """The feed-forward network: act(x W_in + b_in) W_out + b_out; gated: act(x W_gate + b_gate) * (x W_in + b_in)."""

    W_in: torch.Tensor
    b_in: torch.Tensor
    W_out: torch.Tensor
    b_out: torch.Tensor
    activation: str
    W_gate: torch.Tensor | None = None
    b_gate: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class BlockWeights:
    """One block: self-attention, (cross-attention,) FFN, each with the norm placed before or after it."""

    attn: AttentionWeights
    ln_attn: NormWeights
    mlp: FFNWeights
    ln_mlp: NormWeights
    cross_attn: AttentionWeights | None = None
    ln_cross: NormWeights | None = None


@dataclass(frozen=True, eq=False)
class PatchWeights:
    """A ViT's patch embedding: kernels W [D, C, P, P] (a stride-P convolution), bias b [D], the class token
    [D], DeiT's distillation token [D] (None without) and DINOv2's registers [R, D] (None without)."""

    W: torch.Tensor
    b: torch.Tensor
    cls_token: torch.Tensor
    dist_token: torch.Tensor | None
    registers: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class StackWeights:
    """One stack: its input embedding and its blocks (`block(l)` reads one layer's, `blocks` every layer's).

    positional: "learned", "sinusoidal" or "none" (T5's relative bias, or rotary models). W_pos: what is added
    per position [n_positions, D] (learned: from the checkpoint's first used row; a ViT's covers the prefix
    tokens and then the patches), None for "none". W_E [vocab, D]: the token embedding, multiplied by
    `embed_scale` as it is added (None for a ViT); W_segment [token types, D] or None; embed_ln: the norm
    after the embedding sum (BERT) or None; ln_final: the norm after the last block (pre-norm) or None.
    """

    stack: str
    n_layers: int
    read_block: Callable[[int], BlockWeights] = field(repr=False)  # a layer's weights, read when asked for
    positional: str
    W_pos: torch.Tensor | None
    W_E: torch.Tensor | None = None
    embed_scale: float = 1.0
    W_segment: torch.Tensor | None = None
    embed_ln: NormWeights | None = None
    ln_final: NormWeights | None = None
    patch: PatchWeights | None = None

    def block(self, layer: int) -> BlockWeights:
        """Layer `layer`'s weights; ValueError outside 0..n_layers - 1."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} is out of range: the {self.stack} has {self.n_layers} layers")
        return self.read_block(layer)

    @property
    def blocks(self) -> tuple[BlockWeights, ...]:
        """Every layer's weights, in order."""
        return tuple(self.read_block(layer) for layer in range(self.n_layers))

    def _stacked(self, part: str) -> torch.Tensor:
        return torch.stack([getattr(b.attn, part) for b in self.blocks])  # a copy: one tensor per layer

    # TransformerLens's names, every layer stacked on a first axis (copies; `block(l)` reads one layer's views).
    @property
    def W_Q(self) -> torch.Tensor:
        return self._stacked("W_Q")  # [layers, h, D, dh]

    @property
    def W_K(self) -> torch.Tensor:
        return self._stacked("W_K")  # [layers, h_kv, D, dh]

    @property
    def W_V(self) -> torch.Tensor:
        return self._stacked("W_V")  # [layers, h_kv, D, dh]

    @property
    def W_O(self) -> torch.Tensor:
        return self._stacked("W_O")  # [layers, h, dh, D]

    @property
    def b_Q(self) -> torch.Tensor:
        return self._stacked("b_Q")  # [layers, h, dh]

    @property
    def b_K(self) -> torch.Tensor:
        return self._stacked("b_K")

    @property
    def b_V(self) -> torch.Tensor:
        return self._stacked("b_V")

    @property
    def b_O(self) -> torch.Tensor:
        return self._stacked("b_O")  # [layers, D]

    @property
    def W_in(self) -> torch.Tensor:
        return torch.stack([b.mlp.W_in for b in self.blocks])  # [layers, D, F]

    @property
    def W_out(self) -> torch.Tensor:
        return torch.stack([b.mlp.W_out for b in self.blocks])  # [layers, F, D]


# ---- reading them from the core's modules --------------------------------------------------------------
def _bias(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return linear.weight.new_zeros(linear.out_features).detach()


def norm_weights(norm: nn.Module) -> NormWeights:
    """A LayerNorm's or RMSNorm's parameters; RMSNorm without an eps adds its dtype's machine epsilon."""
    if isinstance(norm, nn.LayerNorm):
        return NormWeights("layernorm", norm.weight.detach(), norm.bias.detach(), float(norm.eps))
    if isinstance(norm, nn.RMSNorm):
        w = norm.weight.detach()
        eps = norm.eps if norm.eps is not None else torch.finfo(w.dtype).eps
        return NormWeights("rmsnorm", w, None, float(eps))
    raise TypeError(f"not a norm the core builds: {type(norm).__name__}")


def attention_weights_of(attn: MultiHeadAttention) -> AttentionWeights:
    h, h_kv, dh = attn.n_heads, attn.n_kv_heads, attn.d_head
    D = attn.W_q.in_features

    def per_head(linear: nn.Linear, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        # nn.Linear stores [heads*dh, D]; head i is rows i*dh .. (i+1)*dh.
        return linear.weight.detach().view(heads, dh, D).transpose(1, 2), _bias(linear).view(heads, dh)

    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = per_head(attn.W_q, h), per_head(attn.W_k, h_kv), per_head(attn.W_v, h_kv)
    W_O = attn.W_o.weight.detach().view(D, h, dh).permute(1, 2, 0)  # [h, dh, D]
    q_norm = norm_weights(attn.q_norm) if attn.q_norm is not None else None
    k_norm = norm_weights(attn.k_norm) if attn.k_norm is not None else None
    return AttentionWeights(
        W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, _bias(attn.W_o), float(attn.scale), bool(attn.rotary), q_norm, k_norm
    )


def ffn_weights(mlp: FeedForward, activation: str) -> FFNWeights:
    gate = mlp.W_gate
    return FFNWeights(
        mlp.W_in.weight.detach().T,
        _bias(mlp.W_in),
        mlp.W_out.weight.detach().T,
        _bias(mlp.W_out),
        activation,
        None if gate is None else gate.weight.detach().T,
        None if gate is None else _bias(gate),
    )


def block_weights(block: Block, activation: str) -> BlockWeights:
    cross = block.cross_attn
    return BlockWeights(
        attention_weights_of(block.attn),
        norm_weights(block.ln_attn),
        ffn_weights(block.mlp, activation),
        norm_weights(block.ln_mlp),
        None if cross is None else attention_weights_of(cross),
        None if block.ln_cross is None else norm_weights(block.ln_cross),
    )


def _positions(pos: nn.Module | None) -> tuple[str, torch.Tensor | None]:
    if isinstance(pos, LearnedPositions):
        return "learned", pos.weight.detach()[pos.first_row : pos.first_row + pos.max_positions]
    if isinstance(pos, SinusoidalPositions):
        return "sinusoidal", pos.table
    return "none", None


def stack_weights(name: str, stack: Stack, activation: str) -> StackWeights:
    """The weights of a stack the core built (its embedding: a TextEmbedding or a ViT's PatchEmbedding)."""
    modules = stack.block_list

    def read_block(layer: int) -> BlockWeights:
        return block_weights(modules[layer], activation)

    ln_final = norm_weights(stack.ln_final) if stack.ln_final is not None else None
    embed = stack.embed
    if isinstance(embed, TextEmbedding):
        positional, W_pos = _positions(embed.pos)
        return StackWeights(
            name,
            len(modules),
            read_block,
            positional,
            W_pos,
            embed.tok.weight.detach(),
            float(embed.scale),
            None if embed.segment is None else embed.segment.weight.detach(),
            None if embed.ln is None else norm_weights(embed.ln),
            ln_final,
        )
    if not isinstance(embed, PatchEmbedding):
        raise TypeError(f"not an embedding the core builds: {type(embed).__name__}")
    project = embed.project  # a Linear over channel-first flattened patches
    P = embed.patch_size
    kernels = project.weight.detach().view(project.out_features, -1, P, P)  # [D, C, P, P]
    dist = embed.dist_token
    registers = None if embed.registers is None else embed.registers.detach()[0]
    patch = PatchWeights(
        kernels,
        _bias(project),
        embed.cls_token.detach()[0, 0],
        None if dist is None else dist.detach()[0, 0],
        registers,
    )
    with torch.no_grad():  # what is added per token at the picture's size (a resized table, registers' zero rows)
        W_pos = embed.positions().detach()[0]
    return StackWeights(name, len(modules), read_block, "learned", W_pos, ln_final=ln_final, patch=patch)
