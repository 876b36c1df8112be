"""Positional encodings: fixed sinusoids (Vaswani et al. 2017), learned embeddings, T5's relative bias, and
rotary embeddings (RoPE, Su et al. 2021: Q and K turned by position, as Llama-family models do)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = [
    "POSITIONAL_KINDS",
    "ROPE_TYPES",
    "LearnedPositions",
    "RelativePositionBias",
    "Rope",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "apply_rotary",
    "inverse_frequencies",
    "make_positions",
    "rope_attention_factor",
    "rope_frequencies",
    "rope_pair_dims",
    "rope_rotate",
    "rope_rotation",
    "rope_scores",
    "rotate_half",
    "sinusoidal_encoding",
]


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

    table: torch.Tensor  # a buffer: (max_positions, d_model)

    def _apply(self, fn, recurse=True):
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


# ---- rotary position embedding (RoPE; Su et al. 2021) -------------------------------------------------------
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True, kw_only=True)
class Rope:
    """Rotary position embedding: how Q and K are rotated by position, and the scaling a config declares.

    Each head's d_head dimensions form d_head / 2 pairs, (i, i + d_head / 2) in the Hugging Face layout; at
    position p, pair i is rotated by the angle p * inv_freq[i], with inv_freq[i] = theta^(-2i / d_head) before
    scaling. A query at position m and a key at position n then score q R(m)^T R(n) k = q R(n - m) k: the
    product depends on the offset only.

    theta: the base (10000 in the paper, 500000 for Llama 3, 100000 for SmolLM2).
    type: "default"; "linear" (every frequency / factor: positions stretched); "dynamic" (NTK-aware: changes
        the frequencies only for inputs longer than the model's maximum, which the core never runs, so it
        rotates as "default" here); "llama3" (low frequencies / factor, high ones kept, a smooth blend
        between); "yarn" (a per-frequency blend of scaled and unscaled, and cos / sin times attention_factor).
    original_max_positions: the pre-training context ("llama3", "yarn"). The other fields are the scalings'
    own parameters, named as in Hugging Face configs.
    """

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(f"rotary scaling must be one of {ROPE_TYPES}, got {self.type!r}")
        if not (math.isfinite(self.theta) and self.theta > 1):
            raise ValueError(f"the rotary base theta must be a number above 1, got {self.theta!r}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"the rotary scaling factor must be positive, got {self.factor!r}")
        if self.type in ("llama3", "yarn") and not self.original_max_positions:
            raise ValueError(f"{self.type} rotary scaling needs original_max_positions")
        if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rotary scaling needs high_freq_factor > low_freq_factor")


def rope_attention_factor(rope: Rope) -> float:
    """What cos and sin are multiplied by: 1, except for YaRN (0.1 ln(factor) + 1 by default)."""
    if rope.type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return float(rope.attention_factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return float(mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim))
    return mscale(rope.factor)


def inverse_frequencies(head_dim: int, rope: Rope, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Radians per position of each rotated pair, [head_dim / 2], the config's scaling applied.

    Computed as transformers computes them (in float32 for the models, so both rotate alike); float64 for
    lessons.
    """
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even d_head, got {head_dim}")
    # On the CPU even while a model is built on the meta device: a few numbers, and meta arithmetic goes
    # through PyTorch's Python kernels, whose first use imports torch._dynamo (seconds).
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(dtype) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3_frequencies(inv_freq, rope)
    if rope.type == "yarn":
        return _yarn_frequencies(inv_freq, head_dim, rope, dtype)
    return inv_freq


def _original_context(rope: Rope) -> int:
    if rope.original_max_positions is None:  # Rope.__post_init__ refuses llama3 and yarn without it
        raise ValueError(f"{rope.type} rotary scaling needs original_max_positions")
    return rope.original_max_positions


def _llama3_frequencies(inv_freq: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Llama 3.1: wavelengths beyond the original context / low_freq_factor are divided by factor, those under
    the original context / high_freq_factor kept, and those between blended smoothly."""
    context, factor = _original_context(rope), rope.factor
    low_wavelen, high_wavelen = context / rope.low_freq_factor, context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_frequencies(inv_freq: torch.Tensor, head_dim: int, rope: Rope, dtype: torch.dtype) -> torch.Tensor:
    """YaRN (Peng et al. 2023): pairs that turn many times over the original context keep their frequency
    (extrapolation), those that turn less than once are divided by factor (interpolation), a ramp between."""

    def correction_dim(rotations: float) -> float:
        context = _original_context(rope)
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1).to(dtype)
    extrapolation = 1 - ramp
    return (inv_freq / rope.factor) * (1 - extrapolation) + inv_freq * extrapolation


def rope_frequencies(head_dim: int, rope: Rope | None = None) -> np.ndarray:
    """Radians per position of each rotated pair, float64 [head_dim / 2], the scaling of `rope` applied.

    Pair i rotates dimensions (i, i + head_dim / 2) by position * frequency[i]; its wavelength in tokens is
    2 pi / frequency[i]. A model's own: `model.rope_frequencies()`.
    """
    return inverse_frequencies(int(head_dim), rope or Rope(), torch.float64).numpy()


def rope_rotate(
    x: np.ndarray, positions: int | np.ndarray, frequencies: np.ndarray, attention_factor: float = 1.0
) -> np.ndarray:
    """`x` rotated as RoPE rotates a query or key at `positions`: x [..., d_head] (a vector, or one row per
    position) -> the same shape, float64. Pair i, dimensions (i, i + d_head / 2), turns by position *
    frequencies[i] (radians); `attention_factor` scales the result as YaRN scales cos and sin.

    rope_rotate(q, m, f) @ rope_rotate(k, n, f) depends on n - m only.
    """
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    if x.shape[-1] != 2 * len(frequencies):
        raise ValueError(
            f"x has {x.shape[-1]} dimensions; {len(frequencies)} frequencies rotate {2 * len(frequencies)}"
        )
    angles = np.asarray(positions, dtype=np.float64)[..., None] * np.asarray(frequencies, dtype=np.float64)
    cos, sin = np.cos(angles) * attention_factor, np.sin(angles) * attention_factor
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def rope_pair_dims(head_dim: int, pair: int) -> tuple[int, int]:
    """The two dimensions of every head's q and k that pair `pair` turns together: (pair, pair + head_dim / 2)
    in the Hugging Face layout the core rotates ("rotate half"). The RoFormer paper writes the pairs as
    (2i, 2i + 1): the same rotations, with the dimensions numbered in another order (checkpoints converted
    from the paper's layout have their W_Q and W_K rows permuted to match)."""
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"rotary embedding needs an even d_head, got {head_dim}")
    if not 0 <= pair < head_dim // 2:
        raise ValueError(f"pair must be 0 to {head_dim // 2 - 1} for d_head {head_dim}, got {pair}")
    return pair, pair + head_dim // 2


def rope_rotation(angle: float) -> np.ndarray:
    """The 2 x 2 rotation of one pair by `angle` radians (position * frequency), float64:
    [[cos, -sin], [sin, cos]]: R @ (x, y) is (x, y) turned counter-clockwise, as `rope_rotate` turns it."""
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]], dtype=np.float64)


def rope_scores(
    q: np.ndarray,
    k: np.ndarray,
    q_positions: int | np.ndarray,
    k_positions: int | np.ndarray,
    frequencies: np.ndarray,
    attention_factor: float = 1.0,
) -> np.ndarray:
    """q . k after RoPE: q turned to each of `q_positions`, k to each of `k_positions` (broadcast together),
    float64. Equal to q R(n - m) k: it depends on the offset n - m only, wherever the pair of positions starts.

    q, k: [d_head] vectors before the rotation (a trace's attn.q_pre_rope, attn.k_pre_rope rows).
    """
    m, n = np.broadcast_arrays(np.asarray(q_positions), np.asarray(k_positions))
    rotated_q = rope_rotate(q, m, frequencies, attention_factor)
    rotated_k = rope_rotate(k, n, frequencies, attention_factor)
    return np.einsum("...d,...d->...", rotated_q, rotated_k)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis's halves: the 90-degree turn of every pair."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, dh) rotated by position: x cos + rotate_half(x) sin, cos / sin (1, 1, T, dh)."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """cos and sin of every position's angles, (1, 1, T, d_head), for the attention layers of one stack.

    The frequencies stay float32 whatever the model's dtype (as in transformers: bfloat16 angles at position
    1000 would be off by several degrees); cos and sin are cast to the activations' dtype.
    """

    def __init__(self, head_dim: int, rope: Rope) -> None:
        super().__init__()
        self.head_dim, self.rope = head_dim, rope
        self.attention_factor = rope_attention_factor(rope)
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, rope), persistent=False)

    inv_freq: torch.Tensor  # a buffer: (d_head / 2,)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        self.inv_freq = inverse_frequencies(self.head_dim, self.rope).to(device)  # float32, from the formula
        return self

    def forward(self, n: int, offset: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(offset, offset + n, device=self.inv_freq.device).float()
        freqs = positions[:, None] * self.inv_freq[None, :]  # (T, dh/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (T, dh): pair i is dimensions i and i + dh/2
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype)[None, None], sin.to(dtype)[None, None]
