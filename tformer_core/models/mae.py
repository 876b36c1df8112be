"""Masked autoencoder (He et al. 2022): a ViT encoder that sees a quarter of the patches, a ViT decoder that
rebuilds the pixels of the others.

The picture is cut into N patches and embedded as a ViT does (the patch embedding, fixed 2-D sine-cosine
positions). Random noise per patch decides which are kept: the patches with the N * (1 - mask_ratio)
smallest noise values, in that order, go to the encoder behind a class token; the others are masked. The
decoder embeds the encoder's output in its own width, puts a learned mask token at every masked patch,
restores the picture's order, adds its own positions, runs its blocks and predicts each patch's pixels
(P * P * C numbers, in (row, column, channel) order). With norm_pix_loss the targets were each patch's
pixels normalised by their own mean and variance: the prediction is in those units.

Stacks: "encoder" (the visible patches) and "decoder" (every patch; its heads and their width are its own,
`Trace.heads_in("decoder")`). Hooks: encoder.embed.patch (B, N, D) every patch embedded (before masking),
encoder.embed.mask (B, N) 1 for a masked patch (in the picture's order), encoder.embed.kept (B, kept) the
patches kept, in the order the encoder reads them, encoder.embed.out (B, 1 + kept, D), decoder.embed.out
(B, 1 + N, D'), head.pixels (B, N, P*P*C); the usual block hooks in both stacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..capture import Edit, HookPoint, NameFilter, any_of, matching
from ..errors import InputError
from ..inputs.preprocessing import ImagePreprocessing
from ..trace import Trace, stored_by_default
from .kinds import MaskedAutoencoder
from .layers import BlockConfig, Stack, patchify
from .vit import ViTConfig, image_input, patch_labels
from .weights import PatchWeights, StackWeights, block_weights, norm_weights

__all__ = [
    "MAE",
    "MAEConfig",
    "MAEDecoderEmbedding",
    "MAEEmbedding",
    "PixelHead",
    "masking_noise",
    "pixel_patches",
    "random_mask",
    "sincos_positions",
]

_MASKING = matching("encoder.embed.mask", "encoder.embed.kept")  # in every trace: they name its tokens


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


def pixel_patches(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, P*P*C): each patch's pixels in the order the MAE's head predicts them (row,
    column, channel; not `patchify`'s channel-first order), patches row-major. The loss's targets."""
    B, C, H, W = images.shape
    P = patch_size
    x = images.reshape(B, C, H // P, P, W // P, P).permute(0, 2, 4, 3, 5, 1)  # (B, rows, cols, P, P, C)
    return x.reshape(B, (H // P) * (W // P), P * P * C)


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
        self.hook_patch, self.hook_mask, self.hook_kept, self.hook_out = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.hook_patch(self.project(patchify(images, self.patch_size)))  # (B, N, D)
        x = x + self.pos[:, 1:]
        ids_shuffle = torch.argsort(noise, dim=1)  # smallest noise first: those are kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        keep = self.hook_kept(ids_shuffle[:, : self.n_kept])
        visible = torch.gather(x, 1, keep[..., None].expand(-1, -1, x.shape[-1]))  # (B, kept, D)
        mask = torch.ones_like(noise)
        mask[:, : self.n_kept] = 0
        mask = self.hook_mask(torch.gather(mask, 1, ids_restore))  # back in the picture's order
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


class PixelHead(nn.Module):
    """Each patch's pixels from the decoder's output (B, 1 + N, D') -> (B, N, P*P*C). Hook: pixels."""

    def __init__(self, c: MAEConfig) -> None:
        super().__init__()
        self.predict = nn.Linear(c.decoder_d_model, c.patch_size**2 * c.n_channels)
        self.hook_pixels = HookPoint()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hook_pixels(self.predict(hidden)[:, 1:])  # the class token predicts nothing


class MAE(MaskedAutoencoder[MAEConfig]):
    """images (B, C, H, W), noise (B, N) -> (predicted pixels (B, N, P*P*C), mask (B, N))."""

    def __init__(self, config: MAEConfig) -> None:
        super().__init__(config)
        c = config
        self.encoder = Stack(c, c.n_layers, MAEEmbedding(c))
        self.decoder = Stack(c.decoder_block(), c.decoder_n_layers, MAEDecoderEmbedding(c))
        self.head = PixelHead(c)
        self.preprocessing: ImagePreprocessing | None = None  # set by loaders: photo -> input tensor
        self._finish_init()

    def forward(self, images: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask, ids_restore = self.encoder.embed(images, noise)
        latent = self.encoder(tokens)  # (B, 1 + kept, D), final LayerNorm applied
        hidden = self.decoder(self.decoder.embed(latent, ids_restore))  # (B, 1 + N, D')
        return self.head(hidden), mask

    def noise(self, seed: int) -> torch.Tensor:
        """The masking noise for a seed: (1, N) uniform numbers; the same seed masks the same patches."""
        return masking_noise(self.config.n_patches, seed)

    def trace(
        self,
        image: torch.Tensor | np.ndarray,
        seed: int = 0,
        noise: torch.Tensor | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one preprocessed image (C, H, W) with the patches masked by `seed` (or by `noise` (1, N)).

        tokens: the encoder's ([CLS] and the visible patches, in the order they were kept); target_tokens:
        the decoder's ([CLS] and every patch); encoder.embed.mask [N] (1 for a masked patch, in picture order)
        and encoder.embed.kept are in the trace whatever `keep` says. edits: applied in this pass, their names
        checked first (`intervene`)."""
        c = self.config
        x = image_input(image, c, self.device, self.dtype)  # the same checks as a ViT's input
        noise = (self.noise(seed) if noise is None else torch.as_tensor(noise).reshape(1, -1)).to(x.device, x.dtype)
        if noise.shape[1] != c.n_patches:
            raise InputError(f"noise must have one number per patch ({c.n_patches}), got {noise.shape[1]}")
        trace = self._trace(
            lambda: self(x, noise)[0],
            any_of(_MASKING, keep or stored_by_default),
            edits=edits,
            tokens=(),
            stack_layers={"encoder": c.n_layers, "decoder": c.decoder_n_layers},
            grid_hw=c.grid_hw,
            patch_size=c.patch_size,
            n_prefix_tokens=1,
        )
        labels = patch_labels(c)[1:]
        tokens = ("[CLS]", *(labels[int(i)] for i in trace["encoder.embed.kept"]))
        return replace(trace, tokens=tokens, target_tokens=("[CLS]", *labels))

    def _trace_meta(self) -> dict[str, Any]:
        decoder = self.config.decoder_block()  # its own heads, of their own width
        scale = 1.0 / decoder.head_dim**0.5
        return {
            **super()._trace_meta(),
            "stack_heads": {"decoder": decoder.n_heads},
            "stack_scales": {"decoder": scale},
        }

    def weights(self, stack: str | None = None) -> StackWeights:
        """The weights of "encoder" (default) or "decoder" in TransformerLens's shapes (see `models.weights`).
        Both add fixed 2-D sine-cosine positions (positional "sinusoidal", W_pos [1 + patches, width], the class
        token's row zeros); the encoder's `patch` holds its patch kernels and class token. The decoder's input,
        the encoder's output brought to its width with a mask token at every masked patch, is in its trace
        (decoder.embed.out)."""
        name = stack or self.main_stack
        module = self.stack(name)
        blocks, activation = module.block_list, self.config.activation
        patch = None
        if name == "encoder":
            embed, P = self.encoder.embed, self.config.patch_size
            kernels = embed.project.weight.detach().view(embed.project.out_features, -1, P, P)  # [D, C, P, P]
            patch = PatchWeights(kernels, embed.project.bias.detach(), embed.cls_token.detach()[0, 0], None)
        return StackWeights(
            name,
            len(blocks),
            lambda layer: block_weights(blocks[layer], activation),
            "sinusoidal",
            module.embed.pos.detach()[0],
            ln_final=None if module.ln_final is None else norm_weights(module.ln_final),
            patch=patch,
        )
