"""What one forward pass of a model asks of the server's memory, from its config alone: `pass_cost(config)`.

TFORMER_MAX_PARAMS bounds a model's weights; a pass allocates far more than its weights when its input is
large, and the input's size is the config's to choose: a ViT whose config.json says image_size 1536 reads
9,217 tokens, and each of its heads then holds a 9,217 x 9,217 attention matrix (340 MB) in every layer; a DETR
whose preprocessor_config.json asks for 1,024-pixel pictures runs its ResNet over a million pixels. The loaders
(tformer_core.checkpoints) call `pass_cost` on the config before any weight is read or downloaded, and refuse a
model whose pass at the largest input the server accepts would take more than TFORMER_PASS_MB.

What a pass holds at its peak, counted in numbers of the working dtype (float32, 4 bytes: how the core holds
every model on the CPU; half precision on a GPU needs half of it):

- every layer's captured activations, as a default trace keeps them until the result is cached and compacted:
  the attention weights [heads, queries, keys] (the scores and the softmax input are recomputed from Q and K,
  not kept), Q, K, V and Z, the FFN's hidden units, and about eight d_model-wide vectors per token (the residual
  stream before and after each sub-layer, the norms' outputs, the sub-layers' outputs);
- the largest layer's temporaries: the scores, the scaled scores and the masked (or position-biased) ones of one
  attention, alive with its softmax's output, and the FFN's pre-activation;
- the outputs: logits for every position (a vocabulary wide for a language model);
- for pictures: the picture the model reads (the resized picture in bytes and three float copies on its way to
  a normalised tensor); and a CNN backbone's largest feature maps (DETR's ResNet: the stem's and the first
  stage's, 16 numbers per pixel of the picture, three alive at once), freed before the Transformer runs: the
  peak is the larger of the backbone's and the Transformer's;
- and ALLOCATOR_SLACK (10 %) over all of it: what the allocator keeps of the freed temporaries.

The largest input: text at min(the model's positions, PASS_TOKENS) tokens (the core cuts and refuses longer
text at that, `fit_to_model` and `TracedModel._ids`), a ViT's or MAE's picture at its config's image_size, a
DETR's at its preprocessor's shortest x longest edge. One input per pass: a batch (the distance page's pictures,
an ablation's rows) multiplies it. benchmarks/memory.py measures the estimate against a real pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

BYTES_PER_NUMBER = 4  # float32: the core's models on the CPU
# The most tokens of text one pass reads (the Text attention page's cut, tformer_views.text.PAGE_MAX_TOKENS):
# models with more positions (GPT-2 1,024, SmolLM2 8,192) read at most this many at once, and their pass is
# estimated at it. A notebook may raise it (tformer_core.pass_memory.PASS_TOKENS = 2048) for a model it loads after.
PASS_TOKENS = 512
_VECTORS_PER_TOKEN = 8  # d_model-wide activations a block keeps per token besides Q, K, V, Z and the FFN's
_ATTENTION_TEMPORARIES = 3  # the scores, the scaled scores and the masked (or biased) ones, beside the softmax's
# output (counted as kept): tformer_core.attention's steps each make a new [heads, queries, keys] tensor
# What the allocator holds beyond the bytes counted: freed temporaries it keeps between layers, and the pieces of
# its heap they leave. Measured (benchmarks/memory.py --largest-configs): ViT-B/16 at 400 px and t5-small at 512
# tokens took 7 to 8 % more than the kept tensors and the temporaries counted here.
ALLOCATOR_SLACK = 1.10
_PICTURE_COPIES = 3.25  # resized picture (1 byte a value) and three float copies: array, transposed, normalised
_BACKBONE_MAPS = 3  # a ResNet block's input, its output and the shortcut's, at the largest resolution


@dataclass(frozen=True)
class Stack:
    """One stack of blocks as a pass runs it: `tokens` queries attending to themselves (and, with `memory`
    > 0, to that many encoder tokens through cross-attention)."""

    name: str
    layers: int
    tokens: int
    d_model: int
    heads: int
    d_head: int
    d_ff: int
    kv_heads: int | None = None  # grouped-query attention: K and V heads (None: one per query head)
    gated: bool = False  # a gated FFN keeps its gate's activations too (SwiGLU, gated GELU)
    memory: int = 0  # cross-attention keys: the encoder's tokens (0: no cross-attention)
    position_bias: bool = False  # T5's relative position bias [heads, tokens, tokens], recomputed per stack


@dataclass(frozen=True)
class PassShape:
    """What one pass computes: the input in words, its stacks, its outputs (numbers), the picture it reads
    (values: channels x height x width) and a CNN backbone's largest feature map (numbers)."""

    input: str
    stacks: tuple[Stack, ...]
    outputs: int = 0
    picture: int = 0
    backbone: int = 0


@dataclass(frozen=True)
class PassCost:
    """Bytes one pass holds at its peak (`total`), with the parts a message names: the largest attention of one
    layer (all its heads) and the input it was computed for."""

    total: int
    attention: int
    input: str

    @property
    def mb(self) -> float:
        return self.total / 2**20


def _attention_cells(s: Stack) -> int:
    """[heads, queries, keys] of one layer, self- and cross-attention together."""
    return s.heads * s.tokens * (s.tokens + s.memory)


def _kept(s: Stack) -> int:
    """Numbers a default trace keeps of one stack."""
    kv = (s.kv_heads or s.heads) * s.d_head
    per_token = _VECTORS_PER_TOKEN * s.d_model + 2 * s.heads * s.d_head + 2 * kv + s.d_ff * (2 if s.gated else 1)
    if s.memory:  # cross-attention: its q, z, output and norm per query; its k and v per encoder token
        per_token += 2 * s.heads * s.d_head + 2 * s.d_model
    per_layer = _attention_cells(s) + s.tokens * per_token + s.memory * 2 * kv
    return s.layers * per_layer + 4 * s.tokens * s.d_model  # embeddings and the stack's output


def _temporary(s: Stack) -> int:
    """Numbers alive only while the largest layer of a stack runs."""
    attention = _ATTENTION_TEMPORARIES * s.heads * s.tokens * max(s.tokens, s.memory)
    if s.position_bias:
        attention += s.heads * s.tokens * s.tokens
    return attention + 2 * s.tokens * s.d_ff * (2 if s.gated else 1)


def estimate(shape: PassShape) -> PassCost:
    """The peak bytes of a pass of `shape` (see the module's docstring for what is counted)."""
    transformer = sum(_kept(s) for s in shape.stacks) + shape.outputs
    transformer += max((_temporary(s) for s in shape.stacks), default=0)
    numbers = max(transformer, _BACKBONE_MAPS * shape.backbone)
    counted = BYTES_PER_NUMBER * numbers + _PICTURE_COPIES * BYTES_PER_NUMBER * shape.picture
    total = int(ALLOCATOR_SLACK * counted)
    attention = max((_attention_cells(s) for s in shape.stacks), default=0) * BYTES_PER_NUMBER
    return PassCost(total, attention, shape.input)


def text_tokens(max_positions: int | None) -> int:
    """The most tokens a pass of a text model with `max_positions` positions reads (at most PASS_TOKENS)."""
    return PASS_TOKENS if max_positions is None else min(max_positions, PASS_TOKENS)


def pass_cost(config: Any, preprocessing: Any = None, tokens: int | None = None) -> PassCost:
    """The peak bytes of one pass of the core model `config` describes, at the largest input the server accepts:
    `tokens` of text (default: `text_tokens` of its positions), a ViT's picture at its image size, a DETR's at
    the size its `preprocessing` gives. ValueError for a config of another kind."""
    return estimate(pass_shape(config, preprocessing, tokens))


def reads_text(config: Any) -> bool:
    """Whether a pass of `config`'s model reads text (its size then follows the tokens, not the config)."""
    from .models.detr import DETRConfig
    from .models.vit import ViTConfig

    return not isinstance(config, (ViTConfig, DETRConfig))


def tokens_within(config: Any, budget: int) -> int:
    """The most tokens (up to `text_tokens` of the model's positions) whose pass of a text model `config` takes at
    most `budget` bytes; 0 when not even one token's does. The cost grows with the tokens: a binary search."""
    lo, hi = 0, text_tokens(getattr(config, "max_positions", None))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pass_cost(config, tokens=mid).total <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pass_shape(config: Any, preprocessing: Any = None, tokens: int | None = None) -> PassShape:
    """The stacks, outputs and picture of one pass of the core model `config` describes (see `pass_cost`)."""
    # Imported here: the model modules import torch and transformers' pieces; this module stays light.
    from .models.decoder import DecoderConfig
    from .models.detr import DETRConfig, DetrPreprocessing
    from .models.encoder import EncoderConfig
    from .models.fallback import TransformersConfig
    from .models.mae import MAEConfig
    from .models.seq2seq import Seq2SeqConfig
    from .models.vit import ViTConfig

    if isinstance(config, MAEConfig):
        return _mae(config)
    if isinstance(config, ViTConfig):
        return _vit(config)
    if isinstance(config, DETRConfig):
        return _detr(config, preprocessing if isinstance(preprocessing, DetrPreprocessing) else DetrPreprocessing())
    T = tokens if tokens is not None else text_tokens(getattr(config, "max_positions", None))
    if isinstance(config, EncoderConfig):
        outputs = T * config.vocab_size if config.mlm_head else config.n_labels
        return PassShape(f"{T:,} tokens", (_stack("encoder", config, config.n_layers, T),), outputs)
    if isinstance(config, DecoderConfig):  # GPT-2, and Llama's family (a DecoderConfig too)
        return PassShape(f"{T:,} tokens", (_stack("decoder", config, config.n_layers, T),), T * config.vocab_size)
    if isinstance(config, Seq2SeqConfig):
        encoder = _stack("encoder", config, config.n_encoder_layers, T)
        decoder = _stack("decoder", config, config.n_decoder_layers, T, memory=T)
        return PassShape(f"{T:,} source and {T:,} target tokens", (encoder, decoder), T * config.tgt_vocab_size)
    if isinstance(config, TransformersConfig):  # transformers runs it: its attention weights are kept, every layer
        stacks = [_stack("encoder", config, config.n_layers, T)]
        if config.n_decoder_layers:
            stacks.append(_stack("decoder", config, config.n_decoder_layers, T, memory=T))
        return PassShape(f"{T:,} tokens", tuple(stacks), T * max(config.n_outputs, config.vocab_size))
    raise ValueError(f"no pass estimate for a {type(config).__name__}")


def _stack(name: str, c: Any, layers: int, tokens: int, memory: int = 0) -> Stack:
    """A stack of blocks of a BlockConfig `c`."""
    return Stack(
        name,
        layers,
        tokens,
        c.d_model,
        c.n_heads,
        c.head_dim,
        c.d_ff,
        kv_heads=c.n_kv_heads,
        gated=c.ffn_gated,
        memory=memory,
        position_bias=c.rel_pos_buckets > 0,
    )


def _picture(channels: int, height: int, width: int) -> str:
    return f"a {width:,} x {height:,} picture" + ("" if channels == 3 else f" of {channels} channels")


def _vit(c: Any) -> PassShape:
    (H, W), (rows, cols) = c.image_hw, c.grid_hw
    T = rows * cols + c.n_prefix_tokens
    outputs = c.n_classes * (2 if c.distilled else 1)
    return PassShape(
        f"{_picture(c.n_channels, H, W)} ({T:,} tokens)",
        (_stack("encoder", c, c.n_layers, T),),
        outputs,
        picture=c.n_channels * H * W,
    )


def _mae(c: Any) -> PassShape:
    (H, W), (rows, cols) = c.image_hw, c.grid_hw
    N = rows * cols
    encoder = _stack("encoder", c, c.n_layers, c.n_kept + 1)
    decoder = _stack("decoder", c.decoder_block(), c.decoder_n_layers, N + 1)
    return PassShape(
        f"{_picture(c.n_channels, H, W)} ({N:,} patches)",
        (encoder, decoder),
        outputs=N * c.patch_size**2 * c.n_channels,
        picture=c.n_channels * H * W,
    )


def detr_picture_size(preprocessing: Any) -> tuple[int, int]:
    """(width, height) of the largest picture (in pixels) a DETR's preprocessing hands the model: the shortest
    edge times the longest (a picture of that aspect ratio), or a square when the longest is the smaller."""
    from .errors import InputError

    candidates = []
    for width, height in ((preprocessing.longest, preprocessing.shortest), (100, 100)):
        try:
            candidates.append(preprocessing.size(width, height))
        except InputError:  # a shape it refuses (too elongated, or too small for the backbone) is never read
            continue
    return max(candidates, key=lambda wh: wh[0] * wh[1], default=(preprocessing.longest, preprocessing.longest))


def _detr(c: Any, preprocessing: Any) -> PassShape:
    W, H = detr_picture_size(preprocessing)
    # transformers' ResNet halves the picture in its stem and its pooling, then in every stage after the first:
    # ResNet-50's last stage has one cell per 32 x 32 pixels.
    stride = 4 * 2 ** (len(c.backbone_depths) - 1)
    cells = math.ceil(H / stride) * math.ceil(W / stride)
    stem = c.backbone_embedding_size * math.ceil(H / 2) * math.ceil(W / 2)
    first_stage = c.backbone_hidden_sizes[0] * math.ceil(H / 4) * math.ceil(W / 4)
    encoder = _stack("encoder", c, c.n_encoder_layers, cells)
    decoder = _stack("decoder", c, c.n_decoder_layers, c.n_queries, memory=cells)
    return PassShape(
        f"{_picture(c.n_channels, H, W)} ({cells:,} feature cells)",
        (encoder, decoder),
        outputs=c.n_queries * (c.n_classes + 5),
        picture=c.n_channels * H * W,
        backbone=max(stem, first_stage),
    )
