"""Vision Transformer (Dosovitskiy et al. 2021), with DeiT's optional distillation token, and DINOv2's
registers and resized position table (Oquab et al. 2023; Darcet et al. 2024, "Vision Transformers Need Registers").

An image (C, H, W) is cut into N = H*W / P^2 patches of P x P pixels; each patch is flattened
to P*P*C numbers and linearly embedded to D. A learned class token (and, for distilled DeiT, a
distillation token) is prepended, learned position embeddings ((n_prefix + N) x D) are added,
and a pre-norm encoder runs over the sequence. The MLP head reads the class token.
DINOv2 with registers puts R learned register tokens after the class token, with no position embedding: they
hold no patch, and give the model somewhere other than a background patch to keep global information.
The patch embedding is `layers.PatchEmbedding`, beside the text embedding (the weights' accessors read both).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..attention import widened
from ..capture import Edit, HookPoint, NameFilter
from ..inputs.preprocessing import ImagePreprocessing
from ..trace import Trace
from .base import Capabilities, LinearReadout
from .kinds import VisionModel
from .layers import BlockConfig, PatchEmbedding, Stack

__all__ = ["ClassHead", "ViT", "ViTConfig", "image_input", "images_input", "patch_labels"]


@dataclass(frozen=True, kw_only=True)
class ViTConfig(BlockConfig):
    """ViT defaults: pre-norm, exact GELU, LayerNorm eps 1e-6."""

    image_size: int | tuple[int, int] = 32  # (H, W) or one side of a square
    patch_size: int = 4
    n_channels: int = 3
    n_layers: int = 2
    n_classes: int = 10  # 0: no head, the output is the final hidden states
    distilled: bool = False  # DeiT: a second prefix token (distillation token)
    dist_head: bool | None = None  # average a second head on the distillation token; default: = distilled
    n_registers: int = 0  # DINOv2 with registers: learned tokens after [CLS], without a position
    pos_grid: tuple[int, int] | None = None  # the position table's grid when not the picture's (resized per pass)
    pos_antialias: bool = False  # resize the position table with antialiasing (DINOv2 with registers)
    norm: str = "pre"
    ln_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dist_head and not self.distilled:
            raise ValueError("dist_head needs distilled=True (a distillation token to read)")
        if self.n_registers < 0 or (self.n_registers and self.distilled):
            raise ValueError(f"n_registers must be >= 0, without a distillation token; got {self.n_registers}")
        if self.pos_grid is not None and min(self.pos_grid) < 1:
            raise ValueError(f"the position table's grid must have at least one row and column, got {self.pos_grid}")
        H, W = self.image_hw
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(f"image size {H}x{W} is not a whole number of {self.patch_size}-px patches")

    @property
    def image_hw(self) -> tuple[int, int]:
        size = self.image_size
        return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    @property
    def grid_hw(self) -> tuple[int, int]:
        """Patch rows and columns."""
        H, W = self.image_hw
        return H // self.patch_size, W // self.patch_size

    @property
    def n_patches(self) -> int:
        rows, cols = self.grid_hw
        return rows * cols

    @property
    def position_grid(self) -> tuple[int, int]:
        """Rows and columns of the learned position table: pos_grid, or the picture's patch grid."""
        return self.grid_hw if self.pos_grid is None else (int(self.pos_grid[0]), int(self.pos_grid[1]))

    @property
    def n_prefix_tokens(self) -> int:
        """Tokens before the patches: [CLS], DeiT's [DIST], the registers."""
        return (2 if self.distilled else 1) + self.n_registers

    @property
    def has_dist_head(self) -> bool:
        return self.distilled if self.dist_head is None else self.dist_head


def images_input(images: torch.Tensor, config: ViTConfig, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A batch of preprocessed images (B, C, H, W) checked against `config` (shape, floats, finite: one check for
    the whole batch, so a GPU batch waits once) and moved to `device` and `dtype` in one copy."""
    expected = (config.n_channels, *config.image_hw)
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        shape = tuple(images.shape[1:]) if images.dim() == 4 else tuple(images.shape)
        raise ValueError(f"expected one preprocessed image of shape {expected} (C, H, W), got {shape}")
    if not images.is_floating_point():
        raise ValueError("the image tensor must hold floats (normalised pixel values)")
    if not bool(torch.isfinite(images).all()):
        raise ValueError("the image tensor holds NaN or infinite values")
    return images.to(device=device, dtype=dtype)


def image_input(
    image: torch.Tensor | np.ndarray, config: ViTConfig, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """One preprocessed image (C, H, W) or (1, C, H, W), checked against `config` -> (1, C, H, W) on `device`."""
    t = torch.as_tensor(np.asarray(image) if not isinstance(image, torch.Tensor) else image)
    if t.dim() == 4 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 3:
        expected = (config.n_channels, *config.image_hw)
        raise ValueError(f"expected one preprocessed image of shape {expected} (C, H, W), got {tuple(t.shape)}")
    return images_input(t.unsqueeze(0), config, device, dtype)


def patch_labels(config: ViTConfig) -> tuple[str, ...]:
    """The tokens' labels: "[CLS]" (and DeiT's "[DIST]", or the registers "[REG0]", "[REG1]", ...), then
    "r{row}c{col}" per patch in row-major order."""
    rows, cols = config.grid_hw
    prefix = ("[CLS]", "[DIST]")[: 2 if config.distilled else 1] + tuple(f"[REG{i}]" for i in range(config.n_registers))
    return prefix + tuple(f"r{r}c{c}" for r in range(rows) for c in range(cols))


class ClassHead(nn.Module):
    """Class logits from the class token (B, n_classes); DeiT at inference averages a second head on the
    distillation token. Hook: logits."""

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.classifier = nn.Linear(c.d_model, c.n_classes)
        self.dist_classifier = nn.Linear(c.d_model, c.n_classes) if c.has_dist_head else None
        self.hook_logits = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(x[:, 0])  # (B, n_classes) from the class token
        if self.dist_classifier is not None:
            logits = (logits + self.dist_classifier(x[:, 1])) / 2
        return self.hook_logits(widened(logits))  # at least float32, as every head's logits


class ViT(VisionModel[ViTConfig]):
    """images (B, C, H, W), already resized and normalised -> class logits (B, n_classes).

    Activations under `encoder.*` (embedding: `encoder.embed.*`) and `head.logits`.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        c = config
        self.encoder = Stack(c, c.n_layers, PatchEmbedding(c))
        self.head = ClassHead(c) if c.n_classes else None
        self.preprocessing: ImagePreprocessing | None = None  # set by loaders: photo -> input tensor
        self._finish_init()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(head="classification" if self.config.n_classes else None)

    @property
    def class_names(self) -> Sequence[str] | None:
        """Label of each class (e.g. ImageNet's), when the loader knows them."""
        return self.output_labels

    @class_names.setter
    def class_names(self, names: Sequence[str] | None) -> None:
        self.output_labels = names

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.encoder.embed(images))  # (B, n_prefix+N, D)
        return x if self.head is None else self.head(x)

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, n_prefix+N, D) -> class logits (B, classes): the final norm, then the class head on the class
        token (and DeiT's distillation head on the distillation token, averaged)."""
        if self.head is None:
            raise ValueError("this ViT has no class head")
        norm = self.encoder.ln_final
        return self.head(norm(hidden) if norm is not None else hidden)

    def linear_readout(self, output: int, position: int = 0) -> LinearReadout:
        """Class `output`'s logit: the class token . W_cls[output] (+ the distillation token . W_dist[output],
        the two averaged, as DeiT's head does at inference), + the bias."""
        if self.head is None:
            raise ValueError("this ViT has no class head")
        cls, dist = self.head.classifier, self.head.dist_classifier
        if dist is None:
            return LinearReadout(((0, cls.weight.detach()[output]),), float(cls.bias.detach()[output]))
        terms = ((0, cls.weight.detach()[output] / 2), (1, dist.weight.detach()[output] / 2))
        return LinearReadout(terms, float(cls.bias.detach()[output] + dist.bias.detach()[output]) / 2)

    def _image(self, image: torch.Tensor | np.ndarray) -> torch.Tensor:
        return image_input(image, self.config, self.device, self.dtype)

    def patch_labels(self) -> tuple[str, ...]:
        return patch_labels(self.config)

    def _trace_fields(self) -> dict:
        c = self.config
        return dict(
            tokens=self.patch_labels(),
            stack_layers={"encoder": c.n_layers},
            grid_hw=c.grid_hw,
            patch_size=c.patch_size,
            n_prefix_tokens=c.n_prefix_tokens,
        )

    def trace(
        self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> Trace:
        """Trace one preprocessed image (C, H, W) or (1, C, H, W); edits: applied in this pass, their names
        checked first (`intervene`)."""
        x = self._image(image)
        return self._trace(lambda: self(x), keep, edits=edits, **self._trace_fields())

    def trace_batch(
        self, images: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> list[Trace]:
        """Trace a batch (B, C, H, W) in one pass; one Trace per image. Use `keep` to hold only what you need
        (e.g. the attention weights for mean attention distance over many images); edits: applied to every image's
        row, their names checked first."""
        batch = torch.as_tensor(images)
        if batch.dim() != 4 or batch.shape[0] == 0:
            raise ValueError(f"expected a batch of images (B, C, H, W), got shape {tuple(batch.shape)}")
        x = images_input(batch, self.config, self.device, self.dtype)  # checked as trace() checks one
        return self._trace_batch(lambda: self(x), keep, x.shape[0], edits, **self._trace_fields())
