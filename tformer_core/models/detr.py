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

Every attention is the core's `MultiHeadAttention` (the one rule of tformer_core.attention), given the
positions through its inputs: queries and keys from the tokens plus their positions, values from the tokens.

The trace (kind "detr", a `DetectionModel`'s) holds two sequences: tokens name the feature cells
("r{row}c{col}", grid_hw = (h, w)), target_tokens the object queries ("q0", ...):
`trace.attention(layer, head, "cross")` is [queries, cells], `trace.attention(layer, head, "decoder")`
[queries, queries]. Hooks of its own: backbone.features (B, C, h, w), encoder.pos (B, hw, D),
head.logits (B, Q, classes + 1), head.boxes (B, Q, 4).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..capture import Edit, HookPoint, NameFilter, any_of, matching
from ..errors import InputError
from ..inputs.image_file import ImageError, check_aspect
from ..inputs.preprocessing import IMAGENET_MEAN, IMAGENET_STD
from ..trace import Trace, stored_by_default
from .base import Capabilities
from .kinds import DetectionModel
from .layers import BlockConfig, FeedForward, MultiHeadAttention
from .weights import StackWeights

if TYPE_CHECKING:
    from transformers import ResNetConfig

__all__ = [
    "DETR",
    "Backbone",
    "DETRConfig",
    "DetrBlock",
    "DetrDecoder",
    "DetrEncoder",
    "DetrHead",
    "DetrPreprocessing",
    "sine_positions",
]


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

    def resnet_config(self) -> ResNetConfig:
        from transformers import ResNetConfig

        config = ResNetConfig(
            num_channels=self.n_channels,
            embedding_size=self.backbone_embedding_size,
            hidden_sizes=list(self.backbone_hidden_sizes),
            depths=list(self.backbone_depths),
            layer_type=self.backbone_layer_type,
        )
        config.set_output_features_output_indices(out_features=[config.stage_names[-1]], out_indices=None)
        return config


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


class DetrBlock(nn.Module):
    """A post-norm block: self-attention (positions on queries and keys), cross-attention (decoder), FFN."""

    def __init__(self, c: DETRConfig, cross: bool) -> None:
        super().__init__()
        D, h, dh = c.d_model, c.n_heads, c.head_dim
        self.hook_resid_pre, self.hook_resid_post = HookPoint(), HookPoint()
        self.attn, self.ln_attn, self.hook_ln_attn = (
            MultiHeadAttention(D, h, dh),
            nn.LayerNorm(D, c.ln_eps),
            HookPoint(),
        )
        self.cross_attn = MultiHeadAttention(D, h, dh) if cross else None
        self.ln_cross = nn.LayerNorm(D, c.ln_eps) if cross else None
        if cross:
            self.hook_ln_cross = HookPoint()
        self.mlp, self.ln_mlp, self.hook_ln_mlp = (
            FeedForward(D, c.d_ff, c.activation),
            nn.LayerNorm(D, c.ln_eps),
            HookPoint(),
        )

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, T, D) and its positions pos (B, T, D); a decoder block reads memory (B, Tk, D), memory_pos."""
        x = self.hook_resid_pre(x)
        qk = x + pos
        x = self.hook_ln_attn(self.ln_attn(x + self.attn(qk, values=x)))
        if self.cross_attn is not None and self.ln_cross is not None:
            if memory is None or memory_pos is None:
                raise ValueError("a DETR decoder block reads the encoder's output and its positions")
            keys = memory + memory_pos
            x = self.hook_ln_cross(self.ln_cross(x + self.cross_attn(x + pos, memory=keys, values=memory)))
        return self.hook_resid_post(self.hook_ln_mlp(self.ln_mlp(x + self.mlp(x))))


class DetrEncoder(nn.Module):
    """The feature map to d_model (a 1 x 1 convolution), then post-norm blocks. Hook: pos (B, hw, D)."""

    def __init__(self, c: DETRConfig) -> None:
        super().__init__()
        self.project = nn.Conv2d(c.backbone_hidden_sizes[-1], c.d_model, kernel_size=1)
        self.hook_pos = HookPoint()
        blocks = [DetrBlock(c, cross=False) for _ in range(c.n_encoder_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.block_list = blocks  # the same modules, typed (a plain list registers nothing)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features (B, C, h, w) -> (encoded tokens (B, hw, D), their positions (B, hw, D))."""
        B, _, h, w = features.shape
        x = self.project(features).flatten(2).transpose(1, 2)  # (B, hw, D)
        pos = self.hook_pos(sine_positions(h, w, x.shape[-1]).to(x)[None].expand(B, -1, -1))
        for block in self.block_list:
            x = block(x, pos)
        return x, pos


class DetrDecoder(nn.Module):
    """Object queries (learned position embeddings, from zeros) through blocks and a final LayerNorm. Hook: out."""

    def __init__(self, c: DETRConfig) -> None:
        super().__init__()
        self.queries = nn.Embedding(c.n_queries, c.d_model)
        blocks = [DetrBlock(c, cross=True) for _ in range(c.n_decoder_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.block_list = blocks
        self.ln_final = nn.LayerNorm(c.d_model, c.ln_eps)
        self.hook_out = HookPoint()

    def forward(self, memory: torch.Tensor, memory_pos: torch.Tensor) -> torch.Tensor:
        query_pos = self.queries.weight[None].expand(memory.shape[0], -1, -1)  # (B, Q, D)
        y = torch.zeros_like(query_pos)
        for block in self.block_list:
            y = block(y, query_pos, memory, memory_pos)
        return self.hook_out(self.ln_final(y))


class DetrHead(nn.Module):
    """A class per query (n_classes + 1: the last is "no object") and a box (a 3-layer MLP, sigmoid: cx, cy, w,
    h as fractions of the picture). Hooks: logits, boxes."""

    def __init__(self, c: DETRConfig) -> None:
        super().__init__()
        self.classify = nn.Linear(c.d_model, c.n_classes + 1)
        layers = [nn.Linear(c.d_model, c.d_model), nn.Linear(c.d_model, c.d_model), nn.Linear(c.d_model, 4)]
        self.box = nn.ModuleList(layers)
        self.box_layers = layers
        self.hook_logits, self.hook_boxes = HookPoint(), HookPoint()

    def forward(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes = y
        for layer in self.box_layers[:-1]:
            boxes = torch.relu(layer(boxes))
        boxes = self.box_layers[-1](boxes)
        return self.hook_logits(self.classify(y)), self.hook_boxes(boxes.sigmoid())


_FEATURES = matching("backbone.features")  # always captured: the feature grid's shape names the tokens


class Backbone(nn.Module):
    """transformers' ResNetBackbone (BatchNorm in eval: DETR's frozen batch norm); hook: features (B, C, h, w)."""

    def __init__(self, c: DETRConfig) -> None:
        super().__init__()
        from transformers import ResNetBackbone  # imported when a DETR is built: the core needs it for no other model

        self.model = ResNetBackbone(c.resnet_config())
        self.hook_features = HookPoint()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.hook_features(self.model(images).feature_maps[-1])


class DETR(DetectionModel[DETRConfig]):
    """images (B, C, H, W), normalised -> (class logits (B, Q, classes + 1), boxes (B, Q, 4) as cx, cy, w, h)."""

    def __init__(self, config: DETRConfig) -> None:
        super().__init__(config)
        c = config
        self.backbone = Backbone(c)
        self.encoder = DetrEncoder(c)
        self.decoder = DetrDecoder(c)
        self.head = DetrHead(c)
        self.output_labels = tuple(c.labels) or tuple(f"LABEL_{i}" for i in range(c.n_classes))
        self.preprocessing: DetrPreprocessing | None = None
        self._finish_init()

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, weights=False)  # see `weights`

    def weights(self, stack: str | None = None) -> StackWeights:
        """Not offered: DETR's stacks are not the core's `Stack` (its positions go into every attention's queries
        and keys, never into the residual stream), so `StackWeights` cannot describe them. ValueError."""
        raise InputError(
            "DETR's weights are not offered as StackWeights: its positions enter every attention's queries and "
            "keys; its traces hold each attention's Q, K and V"
        )

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        memory, pos = self.encoder(self.backbone(images))  # (B, hw, D) each
        return self.head(self.decoder(memory, pos))

    def trace(
        self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> Trace:
        """Trace one preprocessed picture (C, H, W): any size (the backbone's grid follows it); edits: applied in
        this pass, their names checked first (`intervene`)."""
        x = torch.as_tensor(np.asarray(image) if not isinstance(image, torch.Tensor) else image)
        if x.dim() == 4 and x.shape[0] == 1:
            x = x[0]
        if x.dim() != 3 or x.shape[0] != self.config.n_channels or min(x.shape[1:]) < 32:
            raise InputError(
                f"expected one preprocessed picture ({self.config.n_channels}, H, W), H and W at least "
                f"32, got {tuple(x.shape)}"
            )
        if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
            raise InputError("the picture tensor must hold finite floats (normalised pixel values)")
        x = x.to(self.device, self.dtype)[None]
        wanted = keep or stored_by_default
        layers = {"encoder": self.config.n_encoder_layers, "decoder": self.config.n_decoder_layers}
        trace = self._trace(lambda: self(x)[0], any_of(_FEATURES, wanted), edits=edits, tokens=(), stack_layers=layers)
        h, w = trace.tensor("backbone.features").shape[-2:]  # the feature grid (the picture / 32): no copy
        activations = {n: a for n, a in trace.activations.items() if wanted(n)}
        tokens = tuple(f"r{r}c{c}" for r in range(h) for c in range(w))
        queries = tuple(f"q{i}" for i in range(self.config.n_queries))
        return replace(trace, activations=activations, tokens=tokens, target_tokens=queries, grid_hw=(int(h), int(w)))


@dataclass(frozen=True)
class DetrPreprocessing:
    """DETR's image processor: resize so the shorter side is `shortest` pixels and the longer at most
    `longest` (the aspect ratio kept), scale to [0, 1], normalise with ImageNet's mean and std."""

    shortest: int = 800
    longest: int = 1333
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the picture is resized to (transformers' get_size_with_aspect_ratio). ImageError for a
        picture more elongated than image_file.MAX_ASPECT, or whose shorter side would be resized below the 32
        pixels the backbone reads (its longer side is resized to `longest` at most)."""
        check_aspect(width, height)
        short, long = min(width, height), max(width, height)
        target = self.shortest
        if long / short * target > self.longest:
            target = round(self.longest * short / long)
        if target < 32:
            raise ImageError(
                f"the picture is {width:,} × {height:,} pixels: resized for DETR (its longer side at most "
                f"{self.longest:,} pixels) its shorter side would be {target} pixels; DETR reads at least 32. Crop it "
                "to a less elongated part first."
            )
        if width <= height:
            return target, int(target * height / width)
        return int(target * width / height), target

    def resized(self, image: Image.Image) -> Image.Image:
        image = image.convert("RGB")
        return image.resize(self.size(*image.size), resample=Image.Resampling.BILINEAR)

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """(pixels - mean) / std per channel: pixels (..., C, H, W) in [0, 1] (a batch of generated scenes)."""
        mean = torch.tensor(self.mean, dtype=pixels.dtype, device=pixels.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=pixels.dtype, device=pixels.device).view(-1, 1, 1)
        return (pixels - mean) / std

    def __call__(self, image: Image.Image) -> torch.Tensor:
        pixels = np.asarray(self.resized(image), dtype=np.float32) / 255.0
        return self.normalise(torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))))
