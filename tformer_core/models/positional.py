"""Positional encodings: fixed sinusoids (Vaswani et al. 2017), learned embeddings, T5's relative bias."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def sinusoidal_encoding(
    n_positions: int, d_model: int, base: float = 10000.0, *, layout: str = "interleaved"
) -> np.ndarray:
    """The sinusoidal position table, float64 [n_positions, d_model].

    PE[pos, 2i]   = sin(pos / base^(2i / d_model))
    PE[pos, 2i+1] = cos(pos / base^(2i / d_model))

    Positions count from 0. With an odd `d_model` the last column is a sine. `base` sets the
    longest wavelength (2*pi*base); the paper uses 10000, small lecture examples often use 100.
    layout="split" puts the same sines in the first half of the columns and the cosines in the
    second half, as Marian (opus-mt) checkpoints do.
    """
    if layout not in ("interleaved", "split"):
        raise ValueError(f"layout must be 'interleaved' or 'split', got {layout!r}")
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
    if layout == "split":
        table = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    return table


class SinusoidalPositions(nn.Module):
    """Adds nothing by itself: returns the fixed table rows for positions 0..T-1, (1, T, D)."""

    def __init__(self, max_positions: int, d_model: int, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_positions, self.d_model, self.base, self.layout = max_positions, d_model, base, layout
        # Not persistent: derived from the config, so it is neither saved nor loaded.
        self.register_buffer("table", self._exact_table(torch.float32, None), persistent=False)

    def _exact_table(self, dtype: torch.dtype, device: torch.device | None) -> torch.Tensor:
        table = sinusoidal_encoding(self.max_positions, self.d_model, self.base, layout=self.layout)  # float64
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
    """A trained row per position (BERT, GPT-2, ViT): (1, T, D).

    `first_row` skips rows the checkpoint reserves: RoBERTa and BART keep 2 rows before
    position 0 (a padding row and a legacy one), so position p reads row p + 2.
    """

    def __init__(self, max_positions: int, d_model: int, first_row: int = 0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(first_row + max_positions, d_model))
        nn.init.normal_(self.weight, std=0.02)
        self.max_positions, self.first_row = max_positions, first_row

    def forward(self, n: int, offset: int = 0) -> torch.Tensor:
        start = self.first_row + offset
        return self.weight[start : start + n].unsqueeze(0)  # (1, T, D)


POSITIONAL_KINDS = ("sinusoidal", "learned", "none")


def make_positions(
    kind: str, max_positions: int, d_model: int, base: float = 10000.0, layout: str = "interleaved", first_row: int = 0
) -> nn.Module | None:
    """The absolute position module of a text model; None for "none" (T5 uses a relative bias instead)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(max_positions, d_model, base, layout)
    if kind == "learned":
        return LearnedPositions(max_positions, d_model, first_row)
    if kind == "none":
        return None
    raise ValueError(f"unknown positional encoding {kind!r}: use one of {POSITIONAL_KINDS}")


class RelativePositionBias(nn.Module):
    """T5's learned bias b[h, i, j] added to the attention logits, from the offset j - i.

    Offsets are put in log-spaced buckets: exact for small offsets, coarser up to
    `max_distance`, one bucket beyond. Bidirectional (encoder) buckets keep the sign of the
    offset; unidirectional (decoder) ones only look back. Returns (1, h, Tq, Tk).
    """

    def __init__(self, n_buckets: int, max_distance: int, n_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.n_buckets, self.max_distance, self.bidirectional = n_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(n_buckets, n_heads)

    def buckets(self, relative: torch.Tensor) -> torch.Tensor:
        """relative = key position - query position -> bucket index, same shape."""
        n = self.n_buckets
        bucket = torch.zeros_like(relative)
        if self.bidirectional:
            n //= 2
            bucket = bucket + (relative > 0).long() * n
            distance = relative.abs()
        else:
            distance = -torch.clamp(relative, max=0)
        exact = n // 2
        is_small = distance < exact
        # Log-spaced buckets between `exact` and `max_distance`.
        log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
        large = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)
        return bucket + torch.where(is_small, distance, large)

    def forward(self, n_q: int, n_k: int) -> torch.Tensor:
        device = self.embedding.weight.device
        query = torch.arange(n_q, device=device)[:, None]
        key = torch.arange(n_k, device=device)[None, :]
        values = self.embedding(self.buckets(key - query))  # (Tq, Tk, h)
        return values.permute(2, 0, 1).unsqueeze(0)  # (1, h, Tq, Tk)
