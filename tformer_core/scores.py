"""The attention score functions of the lectures: written once, in torch, for the models and for the
calculator that shows them on two vectors with every intermediate number.

    dot_scores(q, keys), bilinear_scores(q, keys, W), additive_scores(W1 q, W2 keys, v)  # [..., d] x [..., J, d]
    steps = score_functions(a, b, W=W, W1=W1, W2=W2, v=v)   # float64, a is the query, b the key
    [s.value for s in steps]                                # dot, scaled dot, cosine, bilinear, additive

The RNN encoder-decoders (models/rnn.py) score with the first three; what turns scores into weights (the
mask, the softmax) is tformer_core.attention's rule for every score function. The calculator runs the same
functions in float64 (the scaled dot product through the rule's own scaling).

- dot: a . b = sum_i a_i b_i (Luong's "dot")
- scaled dot: a . b / sqrt(d) (the Transformer's)
- cosine: a . b / (|a| |b|), the angle only (lengths divided out)
- bilinear: a^T W b (Luong's "general"); W [d_a, d_b] learned
- additive (MLP): v^T tanh(W1 a + W2 b) (Bahdanau's); W1 [h, d_a], W2 [h, d_b], v [h] learned

The parameters are any the caller gives (the app lets the user edit them); `DEFAULT_PARAMETERS` are the
small matrices the app starts with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .attention import attention_logits
from .errors import InputError

__all__ = [
    "FORMULAS",
    "MAX_MAGNITUDE",
    "SCORE_NAMES",
    "ScoreSteps",
    "additive",
    "additive_scores",
    "bilinear",
    "bilinear_scores",
    "cosine",
    "default_parameters",
    "dot",
    "dot_scores",
    "scaled_dot",
    "score_functions",
]

SCORE_NAMES = ("dot", "scaled dot", "cosine", "bilinear", "additive")
FORMULAS = {
    "dot": "a · b = Σᵢ aᵢ bᵢ",
    "scaled dot": "a · b / √d",
    "cosine": "a · b / (‖a‖ ‖b‖)",
    "bilinear": "aᵀ W b",
    "additive": "vᵀ tanh(W₁ a + W₂ b)",
}


def dot_scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q . k_j for every key j (Luong's "dot"): query [..., d], keys [..., J, d] -> [..., J]."""
    return torch.einsum("...d,...jd->...j", query, keys)


def bilinear_scores(query: torch.Tensor, keys: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """q^T W k_j (Luong's "general"), W [d_q, d_k]: W is applied to the query once, then the dot product."""
    return dot_scores(query @ W, keys)


def additive_scores(query_part: torch.Tensor, key_parts: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """v^T tanh(W1 q + W2 k_j) (Bahdanau's), from the projected query W1 q [..., h] and keys W2 k_j [..., J, h]
    (a model projects the keys once per sentence), v [h] -> [..., J]."""
    return torch.tanh(query_part.unsqueeze(-2) + key_parts) @ v


@dataclass(frozen=True)
class ScoreSteps:
    """One score function on (a, b): its value and the named intermediates (arrays or numbers), in order."""

    name: str
    formula: str
    value: float
    parts: dict[str, np.ndarray | float] = field(default_factory=dict)


# The largest number (in size) a vector or parameter may hold. A score multiplies up to three of them (aᵀ W b)
# and sums up to 8 x 8 such products: (1e100)^3 x 64 stays below float64's largest number, about 1.8e308, so
# no score, intermediate or softmax input can overflow to inf or NaN (1e200 in a gave an inf dot product and
# a NaN cosine, shown as results).
MAX_MAGNITUDE = 1e100


def _check_numbers(values: np.ndarray, what: str) -> None:
    """InputError naming the first entry of `values` that is not finite or larger than MAX_MAGNITUDE in size."""
    bad = ~np.isfinite(values) | (np.abs(np.nan_to_num(values)) > MAX_MAGNITUDE)
    if not bad.any():
        return
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"number {index[0] + 1}" if values.ndim == 1 else f"row {index[0] + 1}, column {index[1] + 1}"
    value = float(values[index])
    shown = "NaN (not a number)" if math.isnan(value) else (f"{value:g}" if math.isfinite(value) else f"{value}")
    raise InputError(
        f"{what} holds {shown} ({where}): the score functions take finite numbers up to {MAX_MAGNITUDE:.0e} in "
        "size, so that their products stay within float64's range (about 1.8e308). Use smaller numbers."
    )


def _vector(x: object, what: str) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise InputError(f"{what} must be a non-empty vector, got shape {v.shape}")
    _check_numbers(v, what)
    return v


def _matrix(x: object, shape: tuple[int, int], what: str) -> np.ndarray:
    m = np.asarray(x, dtype=np.float64)
    if m.shape != shape:
        raise InputError(f"{what} must be {shape[0]} × {shape[1]}, got {' × '.join(map(str, m.shape)) or 'a number'}")
    _check_numbers(m, what)
    return m


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    return float(dot_scores(_t(a), _t(b)[None])[0])


def dot(a: np.ndarray, b: np.ndarray) -> ScoreSteps:
    return ScoreSteps("dot", FORMULAS["dot"], _dot(a, b), {"aᵢ bᵢ": a * b})


def scaled_dot(a: np.ndarray, b: np.ndarray) -> ScoreSteps:
    raw, root = _dot(a, b), math.sqrt(a.size)
    value = float(attention_logits(torch.tensor(raw, dtype=torch.float64), 1.0 / root))  # the Transformer's scaling
    return ScoreSteps("scaled dot", FORMULAS["scaled dot"], value, {"a · b": raw, "√d": root})


def cosine(a: np.ndarray, b: np.ndarray) -> ScoreSteps:
    # hypot scales as it sums: the lengths of vectors of 1e-200s or 1e100s are neither 0 nor inf
    na, nb = math.hypot(*a), math.hypot(*b)
    if na == 0.0 or nb == 0.0:
        raise InputError("the cosine of a zero vector is not defined: give a and b at least one non-zero number")
    raw = _dot(a, b)
    value = _dot(a / na, b / nb)  # the angle from unit vectors: a . b of tiny numbers underflows to 0 first
    return ScoreSteps("cosine", FORMULAS["cosine"], value, {"a · b": raw, "‖a‖": na, "‖b‖": nb})


def bilinear(a: np.ndarray, b: np.ndarray, W: np.ndarray) -> ScoreSteps:
    value = float(bilinear_scores(_t(a), _t(b)[None], _t(W))[0])
    return ScoreSteps("bilinear", FORMULAS["bilinear"], value, {"W b": W @ b})


def additive(a: np.ndarray, b: np.ndarray, W1: np.ndarray, W2: np.ndarray, v: np.ndarray) -> ScoreSteps:
    W1a, W2b = W1 @ a, W2 @ b
    value = float(additive_scores(_t(W1a), _t(W2b)[None], _t(v))[0])
    parts = {"W₁ a": W1a, "W₂ b": W2b, "W₁ a + W₂ b": W1a + W2b, "tanh(·)": np.tanh(W1a + W2b)}
    return ScoreSteps("additive", FORMULAS["additive"], value, parts)


def default_parameters(d_a: int, d_b: int, hidden: int = 2) -> dict[str, np.ndarray]:
    """The app's starting parameters: W with 1 on its diagonal and 0.5 just above it, W1 and W2 picking the
    first `hidden` dimensions (identity-like), v all ones."""
    W = np.eye(d_a, d_b) + 0.5 * np.eye(d_a, d_b, k=1)
    return {"W": W, "W1": np.eye(hidden, d_a), "W2": np.eye(hidden, d_b), "v": np.ones(hidden)}


def score_functions(
    a: object,
    b: object,
    W: object | None = None,
    W1: object | None = None,
    W2: object | None = None,
    v: object | None = None,
) -> list[ScoreSteps]:
    """The five scores of query a and key b (float64), in SCORE_NAMES order.

    dot, scaled dot and cosine need a and b of one length; bilinear's W is [len(a), len(b)]; the additive
    score's W1 [h, len(a)], W2 [h, len(b)], v [h]. Missing parameters are `default_parameters`.
    InputError (a message for the user) for shapes that do not fit, or a number that is not finite or is larger
    than MAX_MAGNITUDE in size (it names the input, the entry and the limit).
    """
    a, b = _vector(a, "a"), _vector(b, "b")
    if a.size != b.size:
        raise InputError(f"a has {a.size} numbers and b {b.size}: the dot product and the cosine need the same length")
    defaults = default_parameters(a.size, b.size, np.asarray(v).size if v is not None else 2)
    W = _matrix(defaults["W"] if W is None else W, (a.size, b.size), "W")
    v = _vector(defaults["v"] if v is None else v, "v")
    W1 = _matrix(defaults["W1"] if W1 is None else W1, (v.size, a.size), "W₁")
    W2 = _matrix(defaults["W2"] if W2 is None else W2, (v.size, b.size), "W₂")
    steps = [dot(a, b), scaled_dot(a, b), cosine(a, b), bilinear(a, b, W), additive(a, b, W1, W2, v)]
    for step in steps:  # never inf or NaN shown as a result (MAX_MAGNITUDE keeps every one finite)
        for name, part in (("the score", step.value), *step.parts.items()):
            if not np.isfinite(part).all():
                raise InputError(f"{step.name}: {name} is not a finite number; use smaller numbers")
    return steps
