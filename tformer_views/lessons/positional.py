"""The logic behind "Positional encoding": the sinusoidal table cell by cell, how positions compare, and a
real model's learned positions beside it.

    pe = tc.sinusoidal_encoding(50, 128, 100.0)
    formula_table(6, 6, base=100.0, d_model=6)         # "sin(2/100^(2/6)) = 0.4177", cell by cell
    offset_products(pe, starts=[0, 5, 10], max_offset=30)   # PE(p).PE(p+k) depends on k only
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core.models.base import TracedModel
from tformer_core.models.positional import LearnedPositions, sinusoidal_encoding
from tformer_core.trace import Trace, to_numpy

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
    pos = model.stack(model.main_stack).embed.pos
    if not isinstance(pos, LearnedPositions):
        raise ValueError("this model has no learned position embeddings")
    if not 1 <= n_positions <= pos.max_positions:
        raise ValueError(f"the model has {pos.max_positions} positions; asked for {n_positions}")
    return np.array(to_numpy(pos.weight), dtype=np.float64)[pos.first_row : pos.first_row + n_positions]


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
    tok = np.asarray(trace[f"{stack}.embed.tok"], dtype=np.float64)
    if f"{stack}.embed.pos" not in trace:
        raise ValueError("this model adds no absolute position embeddings")
    pos = np.asarray(trace[f"{stack}.embed.pos"], dtype=np.float64)
    seg_name = f"{stack}.embed.segment"
    segment = np.asarray(trace[seg_name], dtype=np.float64) if seg_name in trace else np.zeros_like(tok)
    sinus = sinusoidal_encoding(tok.shape[0], tok.shape[1], base)
    return EmbeddingSum(tuple(trace.tokens), tok, pos, segment, tok + pos + segment, sinus, tok + sinus)
