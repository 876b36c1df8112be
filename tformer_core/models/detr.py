"""DETR (Carion et al. 2020): a CNN reads the picture, a Transformer encoder-decoder turns its features into
a fixed set of object predictions.

The backbone (a ResNet, run through transformers' own `ResNetBackbone`) gives a feature map (B, C, h, w),
one cell per 32 x 32 pixels; a 1 x 1 convolution brings it to d_model and it is flattened into h * w
tokens. Fixed 2-D sine positions (half the numbers for the row, half for the column) are added to the
queries and keys of every attention over those tokens, never to the values. The encoder is post-norm
(x <- LN(x + attention), x <- LN(x + FFN)). The decoder starts from zeros at each of num_queries object
queries, whose learned embeddings play the positions' part: added to the queries and keys of the
self-attention between object queries and to the queries of the cross-attention (whose keys are the
encoder's output plus the feature positions). After a final LayerNorm, each query predicts a class
(n_classes + 1 logits: the last is "no object") and a box (an MLP: centre x, centre y, width, height,
as fractions of the picture after a sigmoid).

The trace is an encoder-decoder trace (kind "encoder-decoder", meta["model"] = "detr"): tokens name the
feature cells ("r{row}c{col}", grid_hw = (h, w)), target_tokens the object queries ("q0", ...):
`trace.attention(layer, head, "cross")` is [queries, cells], `trace.attention(layer, head, "decoder")`
[queries, queries]. Hooks of its own: backbone.features (B, C, h, w), encoder.pos (B, hw, D),
head.logits (B, Q, classes + 1), head.boxes (B, Q, 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..capture import HookPoint, NameFilter
from ..inputs.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from ..trace import Trace, stored_by_default
from .base import TracedModel
from .layers import BlockConfig, FeedForward, MultiHeadAttention


@dataclass(frozen=True, kw_only=True)
class DETRConfig(BlockConfig):
    """DETR's transformer (post-norm, ReLU) and the ResNet backbone transformers builds."""

    norm: str = "post"
    activation: str = "relu"
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    n_queries: int = 100
    n_classes: int = 91  # without "no object"
    n_channels: int = 3
    backbone_layer_type: str = "bottleneck"  # transformers' ResNetConfig.layer_type
    backbone_embedding_size: int = 64
    backbone_hidden_sizes: tuple[int, ...] = (256, 512, 1024, 2048)
    backbone_depths: tuple[int, ...] = (3, 4, 6, 3)
    labels: tuple[str, ...] = ()

    def resnet_config(self):  # -> transformers.ResNetConfig
        from transformers import ResNetConfig

        n = len(self.backbone_depths)
        return ResNetConfig(
            num_channels=self.n_channels,
            embedding_size=self.backbone_embedding_size,
            hidden_sizes=list(self.backbone_hidden_sizes),
            depths=list(self.backbone_depths),
            layer_type=self.backbone_layer_type,
            out_features=[f"stage{n}"],
        )


def sine_positions(h: int, w: int, d_model: int, temperature: float = 10000.0) -> torch.Tensor:
    """DETR's positions of an h x w feature map: (h * w, d_model), rows then columns, each half of the numbers
    sin / cos pairs of (row or column, 1-based, normalised to (0, 2 pi]) over geometric frequencies."""
    half = d_model // 2
    eps, scale = 1e-6, 2 * math.pi
    y = torch.arange(1, h + 1, dtype=torch.float32)[:, None].expand(h, w) / (h + eps) * scale
    x = torch.arange(1, w + 1, dtype=torch.float32)[None, :].expand(h, w) / (w + eps) * scale
    dim_t = temperature ** (2 * torch.div(torch.arange(half), 2, rounding_mode="floor").float() / half)

    def pairs(v: torch.Tensor) -> torch.Tensor:
        angles = v[..., None] / dim_t  # (h, w, half)
        return torch.stack((angles[..., 0::2].sin(), angles[..., 1::2].cos()), dim=3).flatten(2)

    return torch.cat([pairs(y), pairs(x)], dim=2).reshape(h * w, d_model)


class PositionalAttention(MultiHeadAttention):
    """Multi-head attention whose queries, keys and values come from three inputs (DETR adds positions to
    queries and keys only). The same hook points and steps as MultiHeadAttention, no mask."""

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        q = self.hook_q(self._split_heads(self.W_q(queries), self.n_heads))  # (B, h, Tq, dh)
        k = self.hook_k(self._split_heads(self.W_k(keys), self.n_heads))  # (B, h, Tk, dh)
        v = self.hook_v(self._split_heads(self.W_v(values), self.n_heads))  # (B, h, Tk, dh)
        scores = self.hook_scores(q @ k.transpose(-2, -1))  # (B, h, Tq, Tk)
        weights = self.hook_weights(torch.softmax(self.hook_scaled(scores * self.scale), dim=-1))
        z = self.hook_z(weights @ v)  # (B, h, Tq, dh)
        B, _, Tq, _ = z.shape
        return self.hook_out(self.W_o(z.transpose(1, 2).reshape(B, Tq, self.n_heads * self.d_head)))


class DetrBlock(nn.Module):
    """A post-norm block: self-attention (positions on queries and keys), cross-attention (decoder), FFN."""

    def __init__(self, c: DETRConfig, cross: bool) -> None:
        super().__init__()
        D, h, dh = c.d_model, c.n_heads, c.head_dim
        self.hook_resid_pre, self.hook_resid_post = HookPoint(), HookPoint()
        self.attn, self.ln_attn, self.hook_ln_attn = (
            PositionalAttention(D, h, dh),
            nn.LayerNorm(D, c.ln_eps),
            HookPoint(),
        )
        self.cross_attn = PositionalAttention(D, h, dh) if cross else None
        if cross:
            self.ln_cross, self.hook_ln_cross = nn.LayerNorm(D, c.ln_eps), HookPoint()
        self.mlp, self.ln_mlp, self.hook_ln_mlp = (
            FeedForward(D, c.d_ff, c.activation),
            nn.LayerNorm(D, c.ln_eps),
            HookPoint(),
        )

    def forward(self, x, pos, memory=None, memory_pos=None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        qk = x + pos
        x = self.hook_ln_attn(self.ln_attn(x + self.attn(qk, qk, x)))
        if self.cross_attn is not None:
            x = self.hook_ln_cross(self.ln_cross(x + self.cross_attn(x + pos, memory + memory_pos, memory)))
        return self.hook_resid_post(self.hook_ln_mlp(self.ln_mlp(x + self.mlp(x))))


class Backbone(nn.Module):
    """transformers' ResNetBackbone (BatchNorm in eval: DETR's frozen batch norm); hook: features (B, C, h, w)."""

    def __init__(self, c: DETRConfig) -> None:
        super().__init__()
        from transformers import ResNetBackbone  # imported when a DETR is built: the core needs it for no other model

        self.model = ResNetBackbone(c.resnet_config())
        self.hook_features = HookPoint()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.hook_features(self.model(images).feature_maps[-1])


class DETR(TracedModel):
    """images (B, C, H, W), normalised -> (class logits (B, Q, classes + 1), boxes (B, Q, 4) as cx, cy, w, h)."""

    kind = "detr"

    def __init__(self, config: DETRConfig) -> None:
        super().__init__(config)
        c = config
        self.backbone = Backbone(c)
        self.encoder = nn.Module()
        self.encoder.project = nn.Conv2d(c.backbone_hidden_sizes[-1], c.d_model, kernel_size=1)
        self.encoder.hook_pos = HookPoint()
        self.encoder.blocks = nn.ModuleList(DetrBlock(c, cross=False) for _ in range(c.n_encoder_layers))
        self.decoder = nn.Module()
        self.decoder.queries = nn.Embedding(c.n_queries, c.d_model)
        self.decoder.blocks = nn.ModuleList(DetrBlock(c, cross=True) for _ in range(c.n_decoder_layers))
        self.decoder.ln_final = nn.LayerNorm(c.d_model, c.ln_eps)
        self.decoder.hook_out = HookPoint()
        self.head = nn.Module()
        self.head.classify = nn.Linear(c.d_model, c.n_classes + 1)
        self.head.box = nn.ModuleList(
            [nn.Linear(c.d_model, c.d_model), nn.Linear(c.d_model, c.d_model), nn.Linear(c.d_model, 4)]
        )
        self.head.hook_logits, self.head.hook_boxes = HookPoint(), HookPoint()
        self.output_labels = tuple(c.labels) or tuple(f"LABEL_{i}" for i in range(c.n_classes))
        self.preprocessing: DetrPreprocessing | None = None
        self._finish_init()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.backbone(images)  # (B, C, h, w)
        B, _, h, w = features.shape
        x = self.encoder.project(features).flatten(2).transpose(1, 2)  # (B, hw, D)
        pos = self.encoder.hook_pos(sine_positions(h, w, self.config.d_model).to(x)[None].expand(B, -1, -1))
        for block in self.encoder.blocks:
            x = block(x, pos)
        query_pos = self.decoder.queries.weight[None].expand(B, -1, -1)  # (B, Q, D)
        y = torch.zeros_like(query_pos)
        for block in self.decoder.blocks:
            y = block(y, query_pos, x, pos)
        y = self.decoder.hook_out(self.decoder.ln_final(y))
        boxes = y
        for i, layer in enumerate(self.head.box):
            boxes = layer(boxes) if i == len(self.head.box) - 1 else torch.relu(layer(boxes))
        return self.head.hook_logits(self.head.classify(y)), self.head.hook_boxes(boxes.sigmoid())

    def trace(self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None) -> Trace:
        """Trace one preprocessed picture (C, H, W): any size (the backbone's grid follows it)."""
        x = torch.as_tensor(np.asarray(image) if not isinstance(image, torch.Tensor) else image)
        if x.dim() == 4 and x.shape[0] == 1:
            x = x[0]
        if x.dim() != 3 or x.shape[0] != self.config.n_channels or min(x.shape[1:]) < 32:
            raise ValueError(
                f"expected one preprocessed picture ({self.config.n_channels}, H, W), H and W at least "
                f"32, got {tuple(x.shape)}"
            )
        if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
            raise ValueError("the picture tensor must hold finite floats (normalised pixel values)")
        x = x.to(self.device, self.dtype)[None]
        wanted = keep or stored_by_default
        layers = {"encoder": self.config.n_encoder_layers, "decoder": self.config.n_decoder_layers}
        trace = self._trace(
            lambda: self(x)[0], lambda n: n == "backbone.features" or wanted(n), tokens=(), stack_layers=layers
        )
        h, w = trace["backbone.features"].shape[-2:]  # the feature grid: the picture's size / 32
        activations = {n: a for n, a in trace.activations.items() if wanted(n)}
        tokens = tuple(f"r{r}c{c}" for r in range(h) for c in range(w))
        queries = tuple(f"q{i}" for i in range(self.config.n_queries))
        meta = {**trace.meta, "model": "detr", "image_hw": tuple(x.shape[-2:]), "no_object": self.config.n_classes}
        return replace(
            trace,
            kind="encoder-decoder",
            activations=activations,
            tokens=tokens,
            target_tokens=queries,
            grid_hw=(int(h), int(w)),
            meta=meta,
        )


@dataclass(frozen=True)
class DetrPreprocessing:
    """DETR's image processor: resize so the shorter side is `shortest` pixels and the longer at most
    `longest` (the aspect ratio kept), scale to [0, 1], normalise with ImageNet's mean and std."""

    shortest: int = 800
    longest: int = 1333
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the picture is resized to (transformers' get_size_with_aspect_ratio)."""
        short, long = min(width, height), max(width, height)
        target = self.shortest
        if long / short * target > self.longest:
            target = round(self.longest * short / long)
        if width <= height:
            return target, int(target * height / width)
        return int(target * width / height), target

    def resized(self, image: Image.Image) -> Image.Image:
        image = image.convert("RGB")
        return image.resize(self.size(*image.size), resample=Image.BILINEAR)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        pixels = np.asarray(self.resized(image), dtype=np.float32) / 255.0
        t = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        mean = torch.tensor(self.mean).view(-1, 1, 1)
        std = torch.tensor(self.std).view(-1, 1, 1)
        return (t - mean) / std
