"""The logic behind "Positional encoding": the sinusoidal table cell by cell, how positions compare, a real
model's learned positions beside it, and rotary position embeddings (RoPE) with a real model's frequencies.

    pe = tc.sinusoidal_encoding(50, 128, 100.0)
    formula_table(6, 6, base=100.0, d_model=6)         # "sin(2/100^(2/6)) = 0.4177", cell by cell
    offset_products(pe, starts=[0, 5, 10], max_offset=30)   # PE(p).PE(p+k) depends on k only

    rope = rotary_setting(model)                        # smollm2's base, d_head and frequencies (or the defaults)
    frequency_frame(rope)                               # theta_i and the wavelength of every pair
    rotation_step(rope, pair=1, position=5, vector=(1.0, 0.0))   # (cos 5 theta_1, sin 5 theta_1)
    rope_offset_scores(rope, q, k, starts=[0, 100, 1000], max_offset=64)   # one curve whatever the start
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.models.llama import Llama
from tformer_core.models.positional import (
    Rope,
    rope_attention_factor,
    rope_frequencies,
    rope_pair_dims,
    rope_rotate,
    rope_rotation,
    rope_scores,
    sinusoidal_encoding,
)
from tformer_core.trace import Trace, to_host, to_numpy

__all__ = [
    "MAX_PE_D_MODEL",
    "MAX_PE_POSITIONS",
    "MAX_ROPE_HEAD_DIM",
    "MAX_ROPE_POSITION",
    "PATH_POINTS",
    "ROPE_DEFAULT_BASE",
    "EmbeddingSum",
    "RotarySetting",
    "RotationStep",
    "curves_frame",
    "embedding_sum",
    "formula_cell",
    "formula_table",
    "frequencies",
    "frequency_curves",
    "frequency_frame",
    "learned_positions",
    "model_agreement",
    "offset_formula",
    "offset_products",
    "offset_spread",
    "pair_of",
    "pe_problems",
    "random_qk",
    "rope_offset_scores",
    "rope_problems",
    "rotary_setting",
    "rotation_step",
    "sentence_qk",
    "similarity",
    "without_rotation",
]

MAX_PE_POSITIONS = 512
MAX_PE_D_MODEL = 1024


def pe_problems(n_positions: int, d_model: int, base: float) -> list[str]:
    """Why these sinusoidal-encoding settings cannot be drawn (empty list when they can)."""
    problems = []
    if not 1 <= n_positions <= MAX_PE_POSITIONS:
        problems.append(f"positions must be between 1 and {MAX_PE_POSITIONS}, got {n_positions}")
    if not 2 <= d_model <= MAX_PE_D_MODEL:
        problems.append(f"d_model must be between 2 and {MAX_PE_D_MODEL}, got {d_model}")
    elif d_model % 2:
        problems.append(f"d_model must be even (dimensions come in sin/cos pairs), got {d_model}")
    if not (np.isfinite(base) and base > 1):
        problems.append(
            f"the base must be a number greater than 1 (10000 in the paper, 100 in the lecture), got {base:g}"
        )
    return problems


def formula_cell(pos: int, dim: int, base: float, d_model: int) -> str:
    """ "sin(2/100^(2/6)) = 0.4177": PE[pos, dim] with the numbers substituted into its formula."""
    two_i = dim - dim % 2
    value = (math.sin if dim % 2 == 0 else math.cos)(pos / base ** (two_i / d_model))
    return f"{'sin' if dim % 2 == 0 else 'cos'}({pos}/{base:g}^({two_i}/{d_model})) = {value:.4f}"


def formula_table(n_positions: int, n_dims: int, base: float, d_model: int) -> pd.DataFrame:
    """The first positions x dims of the sinusoidal table as formulas with numbers, [n_positions, n_dims] of str."""
    n_dims = min(n_dims, d_model)
    return pd.DataFrame(
        [[formula_cell(p, d, base, d_model) for d in range(n_dims)] for p in range(n_positions)],
        index=pd.Index([f"pos {p}" for p in range(n_positions)], name="formula"),
        columns=[f"dim {d} ({'sin' if d % 2 == 0 else 'cos'}, i={d // 2})" for d in range(n_dims)],
    )


def frequencies(d_model: int, base: float) -> np.ndarray:
    """omega_i = 1 / base^(2i/d_model) for i = 0 .. d_model/2 - 1, radians per position."""
    return 1.0 / np.power(float(base), np.arange(0, d_model, 2, dtype=np.float64) / d_model)


def curves_frame(pe: np.ndarray, dims: Sequence[int]) -> pd.DataFrame:
    """Long frame (position, value, dimension) of the chosen columns of pe [n, d]."""
    n = pe.shape[0]
    parts = [
        pd.DataFrame(
            {"position": np.arange(n), "value": pe[:, d], "dimension": f"dim {d} ({'sin' if d % 2 == 0 else 'cos'})"}
        )
        for d in dims
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["position", "value", "dimension"])


def similarity(matrix: np.ndarray, kind: str = "dot") -> np.ndarray:
    """[n, n] similarity between the rows of matrix [n, d]: "dot" products or "cosine" (zero rows give 0)."""
    m = np.asarray(matrix, dtype=np.float64)
    if kind == "dot":
        return m @ m.T
    if kind == "cosine":
        norms = np.linalg.norm(m, axis=1)
        unit = np.divide(m, norms[:, None], out=np.zeros_like(m), where=norms[:, None] > 0)
        return unit @ unit.T
    raise ValueError(f"similarity must be 'dot' or 'cosine', got {kind!r}")


def offset_products(pe: np.ndarray, starts: Sequence[int], max_offset: int) -> pd.DataFrame:
    """PE(p)·PE(p+k) for k = 0..max_offset and each start p (only where p+k is inside the table).

    Long frame: offset k, dot, start ("p = 5"). For the sinusoidal table the curves coincide:
    PE(p)·PE(p+k) = sum_i cos(omega_i k), whatever p is.
    """
    n = pe.shape[0]
    rows = []
    for p in starts:
        ks = np.arange(0, min(max_offset, n - 1 - p) + 1)
        if len(ks):
            rows.append(
                pd.DataFrame({"offset k": ks, "dot": np.einsum("d,kd->k", pe[p], pe[p + ks]), "start": f"p = {p}"})
            )
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["offset k", "dot", "start"])


def offset_formula(d_model: int, base: float, offsets: np.ndarray) -> np.ndarray:
    """sum_i cos(omega_i k) for each offset k (even d_model): the dot product the sinusoids predict."""
    return np.cos(np.outer(np.asarray(offsets, dtype=np.float64), frequencies(d_model, base))).sum(axis=1)


def learned_positions(model: TracedModel, n_positions: int) -> np.ndarray:
    """The first n_positions rows of a text model's learned position embeddings, float64 [n, d_model].

    Raises ValueError when the model's positions are not learned (sinusoidal, or T5's relative bias).
    """
    weights = model.weights()
    if weights.positional != "learned" or weights.W_pos is None:
        raise InputError("this model has no learned position embeddings")
    n_learned = weights.W_pos.shape[0]
    if not 1 <= n_positions <= n_learned:
        raise InputError(f"the model has {n_learned} positions; asked for {n_positions}")
    return np.array(to_numpy(weights.W_pos[:n_positions]), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class EmbeddingSum:
    """What a BERT-style model adds at its input, for one sentence (all [n, d_model], float64).

    tok: token embeddings; pos: learned position embeddings; segment: segment (token type)
    embeddings, zeros when the model has none; total = tok + pos + segment (what LayerNorm then
    normalises into layer 0's input); sinusoidal: the table the original Transformer would add at
    the same d_model (base `base`); tok_plus_sinusoidal = tok + sinusoidal.
    """

    tokens: tuple[str, ...]
    tok: np.ndarray
    pos: np.ndarray
    segment: np.ndarray
    total: np.ndarray
    sinusoidal: np.ndarray
    tok_plus_sinusoidal: np.ndarray

    def norms(self) -> pd.DataFrame:
        """Length ||row|| of each token's vectors: how strongly each part pulls on the sum."""
        parts = {
            "‖token‖": self.tok,
            "‖learned position‖": self.pos,
            "‖segment‖": self.segment,
            "‖token + position + segment‖": self.total,
            "‖sinusoidal PE‖": self.sinusoidal,
        }
        return pd.DataFrame(
            {k: np.linalg.norm(v, axis=1) for k, v in parts.items()}, index=pd.Index(list(self.tokens), name="token")
        )


def embedding_sum(trace: Trace, base: float = 10000.0) -> EmbeddingSum:
    """The input embeddings of a traced sentence, split into their parts, with the sinusoidal alternative."""
    stack = trace.main_stack
    if f"{stack}.embed.pos" not in trace:
        raise InputError("this model adds no absolute position embeddings")
    names = [f"{stack}.embed.{part}" for part in ("tok", "pos", "segment")]
    parts = [np.asarray(a, dtype=np.float64) for a in trace.fetch(*(n for n in names if n in trace))]  # one transfer
    tok, pos = parts[0], parts[1]
    segment = parts[2] if len(parts) == 3 else np.zeros_like(tok)
    sinus = sinusoidal_encoding(tok.shape[0], tok.shape[1], base)
    return EmbeddingSum(tuple(trace.tokens), tok, pos, segment, tok + pos + segment, sinus, tok + sinus)


# ---- rotary position embeddings (RoPE) --------------------------------------------------------------------
ROPE_DEFAULT_BASE = 10000.0  # RoFormer's (and Llama 2's) base: the page's fallback without a rotary model
MAX_ROPE_HEAD_DIM = 256
MAX_ROPE_POSITION = 100_000


@dataclass(frozen=True, eq=False)
class RotarySetting:
    """How a model rotates q and k: its base, head size, scaling and the resulting frequencies.

    frequencies: theta_i in radians per position, float64 [head_dim / 2], the scaling applied (the model's own,
    `Llama.rope_frequencies`); source: the model they come from, "" for the default setting the page falls
    back on; max_positions: the model's context (None for the default).
    """

    source: str
    head_dim: int
    base: float
    rope_type: str
    factor: float
    frequencies: np.ndarray
    attention_factor: float = 1.0
    max_positions: int | None = None

    @property
    def n_pairs(self) -> int:
        return self.head_dim // 2

    @property
    def unscaled(self) -> np.ndarray:
        """base^(-2i/d) for each pair: the formula before any scaling (equal to `frequencies` for "default")."""
        return rope_frequencies(self.head_dim, Rope(theta=self.base))

    @property
    def wavelengths(self) -> np.ndarray:
        """2 pi / theta_i: the positions pair i takes to turn once."""
        return 2 * np.pi / self.frequencies


def rope_problems(head_dim: int, base: float) -> list[str]:
    """Why a default rotary setting (no model) cannot be drawn (empty list when it can)."""
    problems = []
    if not 2 <= head_dim <= MAX_ROPE_HEAD_DIM or head_dim % 2:
        problems.append(f"d_head must be even, 2 to {MAX_ROPE_HEAD_DIM} (dimensions turn in pairs), got {head_dim}")
    if not (np.isfinite(base) and base > 1):
        problems.append(f"the rotary base must be a number greater than 1, got {base:g}")
    return problems


def rotary_setting(
    model: TracedModel | None = None, head_dim: int = 64, base: float = ROPE_DEFAULT_BASE
) -> RotarySetting:
    """A rotary model's own setting (its config's base, d_head, scaling; its frequencies as it rotates), or,
    without one (model None), the unscaled default for `head_dim` and `base`.

    Raises ValueError for a model that does not rotate q and k, or a default setting `rope_problems` refuses.
    """
    if model is not None:
        rope = model.config.rope if isinstance(model, Llama) else None
        if not isinstance(model, Llama) or rope is None:
            raise InputError(f"{model.source or 'this model'} does not rotate q and k (no rotary position embedding)")
        config = model.config
        return RotarySetting(
            source=model.source or "",
            head_dim=int(config.head_dim),
            base=float(rope.theta),
            rope_type=rope.type,
            factor=float(rope.factor),
            frequencies=model.rope_frequencies(),
            attention_factor=float(model.rope_attention_factor),
            max_positions=int(config.max_positions) if config.max_positions else None,
        )
    problems = rope_problems(int(head_dim), float(base))
    if problems:
        raise InputError("; ".join(problems))
    rope = Rope(theta=float(base))
    return RotarySetting(
        source="",
        head_dim=int(head_dim),
        base=float(base),
        rope_type=rope.type,
        factor=1.0,
        frequencies=rope_frequencies(int(head_dim), rope),
        attention_factor=rope_attention_factor(rope),
    )


def frequency_frame(setting: RotarySetting) -> pd.DataFrame:
    """Every pair's numbers, one row per pair i (index "pair i"): the dimensions it turns, 2i/d, base^(-2i/d),
    theta_i as the model rotates (after its scaling), and the wavelength 2 pi / theta_i in tokens."""
    i = np.arange(setting.n_pairs)
    frame = pd.DataFrame(
        {
            "dimensions": [", ".join(map(str, rope_pair_dims(setting.head_dim, int(p)))) for p in i],
            "2i/d": 2 * i / setting.head_dim,
            f"{setting.base:g}^(-2i/d)": setting.unscaled,
            "θ_i (rad / token)": setting.frequencies,
            "wavelength 2π/θ_i (tokens)": setting.wavelengths,
        },
        index=pd.Index(i, name="pair i"),
    )
    if setting.rope_type == "default":  # the model's theta_i is the formula itself: one column says it
        frame = frame.drop(columns=[f"{setting.base:g}^(-2i/d)"])
    return frame


def frequency_curves(setting: RotarySetting) -> pd.DataFrame:
    """Long frame (pair i, value, what) for the frequency and wavelength charts: theta_i (the model's), and
    base^(-2i/d) when a scaling makes them differ."""
    i = np.arange(setting.n_pairs)
    parts = [pd.DataFrame({"pair i": i, "θ_i": setting.frequencies, "wavelength": setting.wavelengths})]
    parts[0]["what"] = "θ_i" if setting.rope_type == "default" else f"θ_i ({setting.rope_type} scaling)"
    if setting.rope_type != "default":
        unscaled = setting.unscaled
        parts.append(
            pd.DataFrame({"pair i": i, "θ_i": unscaled, "wavelength": 2 * np.pi / unscaled, "what": "base^(-2i/d)"})
        )
    return pd.concat(parts, ignore_index=True)


@dataclass(frozen=True, eq=False)
class RotationStep:
    """One pair of a q or k vector turned to one position: what the rotation picture and its numbers show."""

    pair: int
    dims: tuple[int, int]
    position: int
    frequency: float  # theta_i
    angle: float  # position * theta_i, radians
    matrix: np.ndarray  # [[cos, -sin], [sin, cos]]
    before: np.ndarray  # (x_a, x_b) at position 0
    after: np.ndarray  # matrix @ before
    path: pd.DataFrame  # the pair at positions 0..position (at most PATH_POINTS of them): position, x, y

    @property
    def degrees(self) -> float:
        return math.degrees(self.angle)

    @property
    def turns(self) -> float:
        return self.angle / (2 * math.pi)


PATH_POINTS = 64  # positions drawn along the circle: the first ones (and the chosen one)


def rotation_step(setting: RotarySetting, pair: int, position: int, vector: Sequence[float]) -> RotationStep:
    """The pair `pair` of a vector, (vector[0], vector[1]) in its dimensions `rope_pair_dims`, turned by
    position * theta_i, as the model turns it (its attention factor left out: it scales every pair alike)."""
    dims = rope_pair_dims(setting.head_dim, int(pair))
    if not 0 <= position <= MAX_ROPE_POSITION:
        raise InputError(f"the position must be 0 to {MAX_ROPE_POSITION:,}, got {position}")
    before = np.asarray(vector, dtype=np.float64)
    if before.shape != (2,) or not np.isfinite(before).all():
        raise InputError("the pair must be two finite numbers")
    frequency = float(setting.frequencies[pair])
    angle = position * frequency
    matrix = rope_rotation(angle)
    shown = np.unique(np.concatenate([np.arange(min(position, PATH_POINTS - 1) + 1), [position]]))
    angles = shown * frequency
    path = pd.DataFrame(
        {
            "position": shown,
            "x": before[0] * np.cos(angles) - before[1] * np.sin(angles),
            "y": before[1] * np.cos(angles) + before[0] * np.sin(angles),
        }
    )
    return RotationStep(int(pair), dims, int(position), frequency, angle, matrix, before, matrix @ before, path)


def pair_of(vector: np.ndarray, pair: int) -> np.ndarray:
    """The two numbers of a [d_head] q or k vector that pair `pair` turns together."""
    a, b = rope_pair_dims(len(vector), int(pair))
    return np.array([vector[a], vector[b]], dtype=np.float64)


def random_qk(head_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A query and a key of standard normal numbers (float64 [head_dim] each), the same for a seed."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(head_dim), rng.standard_normal(head_dim)


def sentence_qk(trace: Trace, layer: int, head: int, q_token: int, k_token: int) -> tuple[np.ndarray, np.ndarray]:
    """A real query and key before their rotation (float64 [d_head]): query head `head` of token `q_token` and
    the key it reads (its key/value head's) of token `k_token`, in layer `layer`."""
    if f"{trace.main_stack}.{layer}.attn.q_pre_rope" not in trace:
        raise InputError("this trace holds no q and k before the rotation (not a rotary model)")
    n = len(trace.tokens)
    for name, token in (("query", q_token), ("key", k_token)):
        if not 0 <= token < n:
            raise InputError(f"the {name} token must be 0 to {n - 1}, got {token}")
    q_row = trace.block_tensor("q_pre_rope", layer, head)[q_token]
    k_row = trace.block_tensor("k_pre_rope", layer, head)[k_token]
    q, k = (np.asarray(a, dtype=np.float64) for a in to_host([q_row, k_row]))  # one transfer
    return q, k


def rope_offset_scores(
    setting: RotarySetting, q: np.ndarray, k: np.ndarray, starts: Sequence[int], max_offset: int
) -> pd.DataFrame:
    """q . k after RoPE with k at position n = start and q at m = start + offset, for offsets 0..max_offset and
    each start: long frame (offset m - n, q·k, start "n = 100"). The curves coincide: q R(m)^T R(n) k = q R(n - m) k.
    """
    offsets = np.arange(int(max_offset) + 1)
    parts = [
        pd.DataFrame(
            {
                "offset m - n": offsets,
                "q·k": rope_scores(q, k, start + offsets, start, setting.frequencies, setting.attention_factor),
                "start": f"n = {start}",
            }
        )
        for start in starts
    ]
    return pd.concat(parts, ignore_index=True)


def offset_spread(scores: pd.DataFrame) -> float:
    """The largest difference between the curves of `rope_offset_scores` at one offset (0 up to rounding)."""
    wide = scores.pivot(index="offset m - n", columns="start", values="q·k")
    return float((wide.max(axis=1) - wide.min(axis=1)).max())


def without_rotation(q: np.ndarray, k: np.ndarray) -> float:
    """q . k with no rotation: what every offset would give without position information."""
    return float(np.dot(np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)))


def model_agreement(trace: Trace, layer: int, head: int, setting: RotarySetting) -> float:
    """The largest difference, over every query and key of the sentence, between the model's own q . k (its
    q and k after its rotation, as its scores multiply them) and `rope_scores` of its q and k before the
    rotation at their positions (0..n-1): how exactly the formula on the page is what the model computes."""
    parts = [trace.block_tensor(part, layer, head) for part in ("q_pre_rope", "k_pre_rope", "q", "k")]
    q_pre, k_pre, q_rot, k_rot = (np.asarray(a, dtype=np.float64) for a in to_host(parts))  # one transfer
    n = len(q_pre)
    positions = np.arange(n)
    ours = (
        rope_rotate(q_pre, positions, setting.frequencies, setting.attention_factor)
        @ rope_rotate(k_pre, positions, setting.frequencies, setting.attention_factor).T
    )
    return float(np.abs(ours - q_rot @ k_rot.T).max())
