"""Positional encodings: fixed sinusoids (Vaswani et al. 2017) and learned embeddings."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def sinusoidal_encoding(n_positions: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal position table, float64 [n_positions, d_model].

    PE[pos, 2i]   = sin(pos / base^(2i / d_model))
    PE[pos, 2i+1] = cos(pos / base^(2i / d_model))

    Positions count from 0. With an odd `d_model` the last column is a sine. `base` sets the
    longest wavelength (2*pi*base); the paper uses 10000, small lecture examples often use 100.
    """
    if int(n_positions) != n_positions or n_positions < 0:
        raise ValueError(f"n_positions must be a whole number >= 0, got {n_positions!r}")
    if int(d_model) != d_model or d_model < 1:
        raise ValueError(f"d_model must be a whole number >= 1, got {d_model!r}")
    if not np.isfinite(base) or base <= 0:
        raise ValueError(f"base must be a positive number, got {base!r}")
    n_positions, d_model = int(n_positions), int(d_model)
    positions = np.arange(n_positions, dtype=np.float64)[:, None]  # (n, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(d/2),) the "2i" of the formula
    angles = positions / np.power(float(base), two_i / d_model)  # (n, ceil(d/2))
    table = np.empty((n_positions, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


class SinusoidalPositions(nn.Module):
    """Adds nothing by itself: returns the fixed table rows for positions 0..T-1, (1, T, D)."""

    def __init__(self, max_positions: int, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_positions, self.d_model, self.base = max_positions, d_model, base
        # Not persistent: derived from the config, so it is neither saved nor loaded.
        self.register_buffer("table", self._exact_table(torch.float32, None), persistent=False)

    def _exact_table(self, dtype: torch.dtype, device: torch.device | None) -> torch.Tensor:
        table = sinusoidal_encoding(self.max_positions, self.d_model, self.base)  # float64
        return torch.from_numpy(table).to(dtype=dtype, device=device)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # .to(float64) after float32 would keep float32-rounded values; rebuild from float64 instead.
        super()._apply(fn, recurse)
        if self.table.is_floating_point():
            self.table = self._exact_table(self.table.dtype, self.table.device)
        return self

    def forward(self, n: int, offset: int = 0) -> torch.Tensor:
        return self.table[offset : offset + n].unsqueeze(0)  # (1, T, D)


class LearnedPositions(nn.Module):
    """A trained row per position (BERT, GPT-2, ViT): (1, T, D)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_positions, d_model))
        nn.init.normal_(self.weight, std=0.02)
        self.max_positions = max_positions

    def forward(self, n: int, offset: int = 0) -> torch.Tensor:
        return self.weight[offset : offset + n].unsqueeze(0)  # (1, T, D)


def make_positions(kind: str, max_positions: int, d_model: int, base: float) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositions(max_positions, d_model, base)
    if kind == "learned":
        return LearnedPositions(max_positions, d_model)
    raise ValueError(f"unknown positional encoding {kind!r}: use 'sinusoidal' or 'learned'")
