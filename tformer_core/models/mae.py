"""Masked autoencoder (He et al. 2022): a ViT encoder that sees a quarter of the patches, a ViT decoder that
rebuilds the pixels of the others.

The picture is cut into N patches and embedded as a ViT does (the patch embedding, fixed 2-D sine-cosine
positions). Random noise per patch decides which are kept: the patches with the N * (1 - mask_ratio)
smallest noise values, in that order, go to the encoder behind a class token; the others are masked. The
decoder embeds the encoder's output in its own width, puts a learned mask token at every masked patch,
restores the picture's order, adds its own positions, runs its blocks and predicts each patch's pixels
(P * P * C numbers, in (row, column, channel) order). With norm_pix_loss the targets were each patch's
pixels normalised by their own mean and variance: the prediction is in those units.

Stacks: "encoder" (the visible patches) and "decoder" (every patch). Hooks: encoder.embed.patch (B, N, D)
every patch embedded (before masking), encoder.embed.out (B, 1 + kept, D), decoder.embed.out (B, 1 + N, D'),
head.pixels (B, N, P*P*C); the usual block hooks in both stacks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from ..capture import HookPoint, NameFilter
from ..trace import Trace
from .base import TracedModel
from .layers import BlockConfig, Stack
from .vit import ViT, ViTConfig, patchify


@dataclass(frozen=True, kw_only=True)
class MAEConfig(ViTConfig):
    """The encoder's fields are a ViT's (no classifier); the decoder's are its own."""

    n_classes: int = 0
    ln_eps: float = 1e-12
    decoder_d_model: int = 32
    decoder_n_heads: int = 4
    decoder_d_ff: int = 64
    decoder_n_layers: int = 1
    mask_ratio: float = 0.75
    norm_pix_loss: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_classes:
            raise ValueError("a masked autoencoder has no classifier: n_classes must be 0")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {self.mask_ratio}")

    @property
    def n_kept(self) -> int:
        """Patches the encoder sees (transformers' int(N * (1 - mask_ratio)))."""
        return int(self.n_patches * (1 - self.mask_ratio))

    def decoder_block(self) -> BlockConfig:
        return BlockConfig(
            d_model=self.decoder_d_model,
            n_heads=self.decoder_n_heads,
            d_ff=self.decoder_d_ff,
            activation=self.activation,
            norm="pre",
            ln_eps=self.ln_eps,
        )


def sincos_positions(grid_hw: tuple[int, int], dim: int) -> torch.Tensor:
    """MAE's fixed 2-D sine-cosine positions with a zero row for the class token: (1 + rows*cols, dim).
    Half the numbers encode the row and half the column, each as 1-D sinusoids (base 10000)."""
    rows, cols = grid_hw
    grid_w, grid_h = torch.meshgrid(
        torch.arange(cols, dtype=torch.float64), torch.arange(rows, dtype=torch.float64), indexing="xy"
    )

    def one_axis(pos: torch.Tensor) -> torch.Tensor:
        omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4.0))
        angles = pos.reshape(-1)[:, None] * omega[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    table = torch.cat([one_axis(grid_w), one_axis(grid_h)], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), table]).float()


def masking_noise(n_patches: int, seed: int) -> torch.Tensor:
    """(1, n_patches) uniform numbers drawn from `seed`: the patches with the smallest are kept."""
    return torch.rand(1, n_patches, generator=torch.Generator().manual_seed(int(seed)))


def random_mask(n_patches: int, mask_ratio: float, seed: int) -> np.ndarray:
    """[n_patches] 1 for a masked patch, 0 for a kept one: the mask an MAE draws for `seed` (no model needed)."""
    noise = masking_noise(n_patches, seed)[0].numpy()
    kept = np.argsort(noise, kind="stable")[: int(n_patches * (1 - mask_ratio))]
    mask = np.ones(n_patches, dtype=np.int8)
    mask[kept] = 0
    return mask


class MAEEmbedding(nn.Module):
    """images (B, C, H, W), noise (B, N) -> (tokens (B, 1 + kept, D), mask (B, N) 1 = masked, ids_restore (B, N))."""

    def __init__(self, c: MAEConfig) -> None:
        super().__init__()
        self.patch_size, self.n_kept = c.patch_size, c.n_kept
        self.project = nn.Linear(c.n_channels * c.patch_size**2, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.pos = nn.Parameter(sincos_positions(c.grid_hw, c.d_model)[None], requires_grad=False)
        self.hook_patch, self.hook_out = HookPoint(), HookPoint()

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.hook_patch(self.project(patchify(images, self.patch_size)))  # (B, N, D)
        x = x + self.pos[:, 1:]
        ids_shuffle = torch.argsort(noise, dim=1)  # smallest noise first: those are kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        keep = ids_shuffle[:, : self.n_kept]
        visible = torch.gather(x, 1, keep[..., None].expand(-1, -1, x.shape[-1]))  # (B, kept, D)
        mask = torch.ones_like(noise)
        mask[:, : self.n_kept] = 0
        mask = torch.gather(mask, 1, ids_restore)  # back in the picture's order
        cls = (self.cls_token + self.pos[:, :1]).expand(x.shape[0], -1, -1)
        return self.hook_out(torch.cat([cls, visible], dim=1)), mask, ids_restore


class MAEDecoderEmbedding(nn.Module):
    """latent (B, 1 + kept, D), ids_restore (B, N) -> (B, 1 + N, D'): mask tokens in place, positions added."""

    def __init__(self, c: MAEConfig) -> None:
        super().__init__()
        self.project = nn.Linear(c.d_model, c.decoder_d_model)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.decoder_d_model))
        self.pos = nn.Parameter(sincos_positions(c.grid_hw, c.decoder_d_model)[None], requires_grad=False)
        self.hook_out = HookPoint()

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        x = self.project(latent)  # (B, 1 + kept, D')
        B, N = ids_restore.shape
        tokens = torch.cat([x[:, 1:], self.mask_token.expand(B, N - (x.shape[1] - 1), -1)], dim=1)  # shuffled order
        tokens = torch.gather(tokens, 1, ids_restore[..., None].expand(-1, -1, x.shape[-1]))  # picture order
        return self.hook_out(torch.cat([x[:, :1], tokens], dim=1) + self.pos)


class MAE(TracedModel):
    """images (B, C, H, W), noise (B, N) -> (predicted pixels (B, N, P*P*C), mask (B, N))."""

    kind = "mae"

    def __init__(self, config: MAEConfig) -> None:
        super().__init__(config)
        c = config
        self.encoder = Stack(c, c.n_layers, MAEEmbedding(c))
        self.decoder = Stack(c.decoder_block(), c.decoder_n_layers, MAEDecoderEmbedding(c))
        self.head = nn.Module()
        self.head.predict = nn.Linear(c.decoder_d_model, c.patch_size**2 * c.n_channels)
        self.head.hook_pixels = HookPoint()
        self.preprocessing = None  # set by loaders: photo -> input tensor
        self._finish_init()

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask, ids_restore = self.encoder.embed(images, noise)
        latent = self.encoder(tokens)  # (B, 1 + kept, D), final LayerNorm applied
        hidden = self.decoder(self.decoder.embed(latent, ids_restore))  # (B, 1 + N, D')
        return self.head.hook_pixels(self.head.predict(hidden)[:, 1:]), mask

    def noise(self, seed: int) -> torch.Tensor:
        """The masking noise for a seed: (1, N) uniform numbers; the same seed masks the same patches."""
        return masking_noise(self.config.n_patches, seed)

    def trace(
        self,
        image: torch.Tensor | np.ndarray,
        seed: int = 0,
        noise: torch.Tensor | None = None,
        keep: NameFilter | None = None,
    ) -> Trace:
        """Trace one preprocessed image (C, H, W) with the patches masked by `seed` (or by `noise` (1, N)).

        tokens: the encoder's ([CLS] and the visible patches, in the order they were kept); target_tokens:
        the decoder's ([CLS] and every patch); meta["mask"]: [N] 1 for a masked patch, in picture order."""
        x = ViT._image(self, image)  # the same checks as a ViT's input
        noise = (self.noise(seed) if noise is None else torch.as_tensor(noise).reshape(1, -1)).to(x.device, x.dtype)
        if noise.shape[1] != self.config.n_patches:
            raise ValueError(f"noise must have one number per patch ({self.config.n_patches}), got {noise.shape[1]}")
        out: dict = {}

        def run() -> torch.Tensor:
            pixels, out["mask"] = self(x, noise)
            return pixels

        labels = ViT.patch_labels(self)[1:]
        trace = self._trace(
            run,
            keep,
            tokens=(),
            stack_layers={"encoder": self.config.n_layers, "decoder": self.config.decoder_n_layers},
            grid_hw=self.config.grid_hw,
            patch_size=self.config.patch_size,
            n_prefix_tokens=1,
        )
        mask = out["mask"][0].cpu().numpy().astype(np.int8)
        kept = np.argsort(noise[0].cpu().numpy(), kind="stable")[: self.config.n_kept]
        tokens = ("[CLS]", *(labels[i] for i in kept))
        meta = {**trace.meta, "mask": mask, "kept": kept, "norm_pix_loss": self.config.norm_pix_loss}
        return replace(trace, tokens=tokens, target_tokens=("[CLS]", *labels), meta=meta)
