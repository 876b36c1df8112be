"""The logic behind the two lesson pages ("Attention, step by step" and "Positional encoding").

No Streamlit here: the pages read widgets, call these functions and draw what they return.

Attention, step by step:

    ex = default_example(n_heads=1)                    # the worked example: 3 tokens, d_model 4, d_k 3
    X = matrix_from_frame(edited_frame, "X")           # TableError naming the bad cell
    steps = run_example(ex, build_mask(3, causal=True, padding=[]))
    walk = row_walkthrough(steps, ex.tokens, query=1)  # every number of row 1, written out

All numbers come from `tc.attention_steps` (float64). Biases (BERT's b^Q, b^K, b^V) are folded in
as an extra input column of ones and an extra weight row b, so X'W' = XW + b exactly and the
step function needs no bias argument.

Positional encoding:

    pe = sinusoidal_encoding(50, 128, 100.0)
    formula_table(6, 6, base=100.0, d_model=6)         # "sin(2/100^(2/6)) = 0.4177", cell by cell
    offset_products(pe, starts=[0, 5, 10], max_offset=30)   # PE(p).PE(p+k) depends on k only
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import altair as alt
import numpy as np
import pandas as pd

from tformer_core.models.positional import LearnedPositions, sinusoidal_encoding
from tformer_core.steps import AttentionSteps, attention_steps
from tformer_core.trace import Trace

MAX_TOKENS = 12  # the worked example is read cell by cell: beyond this the tables stop being readable
MAX_PE_POSITIONS = 512
MAX_PE_D_MODEL = 1024
MAX_CHART_CELLS = 32_768  # a dense heatmap sends one row of data per cell: keep a chart's payload small


class TableError(ValueError):
    """An input table that cannot be used; the message names the table, and the cell or the shape."""


# ---- reading the edited tables ---------------------------------------------------------------------
def _cell_error(name: str, row: int, row_label: Any, col_label: Any, problem: str) -> TableError:
    where = f"row {row + 1}" + (f" ({row_label})" if str(row_label) not in ("", str(row), str(row + 1)) else "")
    return TableError(f"{name}, {where}, column {col_label}: {problem}")


def _number(value: Any) -> tuple[float | None, str]:
    """(the value as a float, "") or (None, what is wrong with it)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "empty cell"
    if isinstance(value, (bool, np.bool_)):
        return None, f"{value!r} is not a number"
    try:
        number = float(str(value).strip().replace("\u2212", "-")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None, f"{str(value)!r} is not a number"
    if math.isnan(number):
        return None, "empty cell (NaN)"
    if not math.isfinite(number):
        return None, f"{value} is not a finite number"
    return number, ""


def matrix_from_frame(frame: pd.DataFrame, name: str, skip: Sequence[str] = ()) -> np.ndarray:
    """An edited table -> float64 [rows, cols]; the columns named in `skip` (e.g. "token") are left out.

    Raises TableError naming the first bad cell by row number (and row label) and column name:
    empty / NaN cells, text that is not a number, infinities; or an empty table.
    """
    data = frame.drop(columns=[c for c in skip if c in frame.columns])
    if len(data) == 0:
        raise TableError(f"{name} is empty: it needs at least one row")
    if data.shape[1] == 0:
        raise TableError(f"{name} has no columns")
    out = np.empty(data.shape, dtype=np.float64)
    for r, (label, row) in enumerate(data.iterrows()):
        for c, col in enumerate(data.columns):
            number, problem = _number(row.iloc[c])
            if number is None:
                raise _cell_error(name, r, label, col, problem)
            out[r, c] = number
    return out


_SEPARATORS = re.compile(r"[,;\s\t]+")


def parse_matrix_text(text: str, name: str) -> np.ndarray:
    """Pasted text -> float64 [rows, cols]: one row per line, numbers separated by spaces, commas or tabs.

    Brackets are ignored, so numpy / Python list output can be pasted as is. Raises TableError
    naming the bad cell (row and column, from 1) or the rows of unequal length.
    """
    rows: list[list[str]] = []
    for line in str(text).splitlines():
        cleaned = line.replace("[", " ").replace("]", " ").strip()
        if cleaned:
            rows.append([cell for cell in _SEPARATORS.split(cleaned) if cell])
    if not rows:
        raise TableError(f"{name} is empty: type one row per line, e.g. '1 0 2'")
    for r, cells in enumerate(rows):
        if len(cells) != len(rows[0]):
            raise TableError(f"{name}: row {r + 1} has {len(cells)} numbers but row 1 has {len(rows[0])}")
    out = np.empty((len(rows), len(rows[0])), dtype=np.float64)
    for r, cells in enumerate(rows):
        for c, cell in enumerate(cells):
            number, problem = _number(cell)
            if number is None:
                raise _cell_error(name, r, "", c + 1, problem)
            out[r, c] = number
    return out


def parse_tokens(text: str) -> list[str]:
    """Token names from one line, separated by spaces (or commas)."""
    return [t for t in re.split(r"[,\s]+", str(text).strip()) if t]


def format_matrix_text(matrix: np.ndarray) -> str:
    """The inverse of parse_matrix_text: one line per row, numbers as short as they can be without loss."""
    return "\n".join(" ".join(f"{v:.6g}" for v in row) for row in np.atleast_2d(matrix))


def tokens_from_column(values: Sequence[Any]) -> list[str]:
    """Token names from an edited "token" column; empty names become their position ("#2")."""
    out = []
    for i, v in enumerate(values):
        text = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()
        out.append(text or f"#{i + 1}")
    return out


# ---- the example ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Example:
    """The inputs of the worked example.

    tokens: n labels. X: [n, d_model]. W_q, W_k: [d_model, h*d_k]; W_v: [d_model, h*d_v] (columns
    of head j are the j-th block). b_q, b_k: [h*d_k]; b_v: [h*d_v] (zeros when the example has no
    biases). W_o: [h*d_v, d_model]. note: where the numbers come from (shown under the tables).
    """

    tokens: tuple[str, ...]
    X: np.ndarray
    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    b_q: np.ndarray
    b_k: np.ndarray
    b_v: np.ndarray
    W_o: np.ndarray
    note: str = ""

    @property
    def has_bias(self) -> bool:
        return bool(np.any(self.b_q) or np.any(self.b_k) or np.any(self.b_v))


# The lecture's example (as in "Illustrated: Self-Attention"): integers, so every step can be checked by hand.
EXAMPLE_TOKENS = ("I", "love", "tea")
EXAMPLE_X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=np.float64)
EXAMPLE_W_Q = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=np.float64)
EXAMPLE_W_K = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float64)
EXAMPLE_W_V = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=np.float64)


def _small_integers(seed: int, shape: tuple[int, int]) -> np.ndarray:
    """Integers in {-1, 0, 1, 2}: extra heads and W^O of the hand-checkable example stay hand-checkable."""
    return np.random.default_rng(seed).integers(-1, 3, size=shape).astype(np.float64)


def default_example(n_heads: int = 1) -> Example:
    """The 3-token example (d_model 4, d_k = d_v = 3 per head); heads after the first get other small integers."""
    h = _heads(n_heads)
    extra = [[_small_integers(1000 * j + m, (4, 3)) for m in range(3)] for j in range(1, h)]
    W_q = np.hstack([EXAMPLE_W_Q] + [e[0] for e in extra])
    W_k = np.hstack([EXAMPLE_W_K] + [e[1] for e in extra])
    W_v = np.hstack([EXAMPLE_W_V] + [e[2] for e in extra])
    zeros = np.zeros(3 * h)
    return Example(
        EXAMPLE_TOKENS,
        EXAMPLE_X.copy(),
        W_q,
        W_k,
        W_v,
        zeros,
        zeros.copy(),
        zeros.copy(),
        _small_integers(7, (3 * h, 4)),
        "The lecture's example: small integers, so every step can be checked by hand.",
    )


def random_example(seed: int, n_tokens: int, d_model: int, d_k: int, n_heads: int = 1) -> Example:
    """Random X [n, d_model] and weights [d_model, h*d_k], rounded to 2 decimals, from numpy's generator `seed`.

    Weights are scaled by 1/sqrt(d_model) (as common initialisations do) so the scores stay moderate.
    """
    h = _heads(n_heads)
    for what, value, low in (("n_tokens", n_tokens, 1), ("d_model", d_model, 1), ("d_k", d_k, 1)):
        if int(value) != value or value < low:
            raise ValueError(f"{what} must be a whole number >= {low}, got {value!r}")
    n, d, k = int(n_tokens), int(d_model), int(d_k)
    rng = np.random.default_rng(int(seed))
    X = np.round(rng.normal(size=(n, d)), 2)
    W_q, W_k, W_v = (np.round(rng.normal(size=(d, h * k)) / math.sqrt(d), 2) for _ in range(3))
    W_o = np.round(rng.normal(size=(h * k, d)) / math.sqrt(h * k), 2)
    zeros = np.zeros(h * k)
    return Example(
        tuple(f"t{i + 1}" for i in range(n)),
        X,
        W_q,
        W_k,
        W_v,
        zeros,
        zeros.copy(),
        zeros.copy(),
        W_o,
        f"Random numbers (seed {int(seed)}), rounded to 2 decimals.",
    )


def _heads(n_heads: int) -> int:
    if int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"n_heads must be a whole number >= 1, got {n_heads!r}")
    return int(n_heads)


def _param(tensor: Any) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().astype(np.float64)


def attention_input_name(model: Any, trace: Trace, layer: int) -> str:
    """The trace name of what enters the self-attention of `layer` (the X of the worked example).

    Post-norm blocks (BERT, MiniLM) feed the residual stream itself: `{stack}.{layer}.resid_pre`,
    which for layer 0 is the embedding sum after its LayerNorm. Pre-norm blocks (GPT-2) feed
    LN(residual stream): `{stack}.{layer}.ln_attn`.
    """
    stack = trace.main_stack
    pre_norm = getattr(model.config, "norm", "post") == "pre"
    return f"{stack}.{layer}.{'ln_attn' if pre_norm else 'resid_pre'}"


def real_model_example(
    model: Any, trace: Trace, layer: int, head: int, n_dims: int, n_head_dims: int, n_heads: int = 1
) -> Example:
    """A slice of a real model's attention: X = the layer's input, W's = the head's columns of W^Q, W^K, W^V.

    model: an encoder or decoder-only `TracedModel` (its `W_q` etc. are Linear layers whose output
    columns hold the heads one after another: head j = columns j*d_head .. (j+1)*d_head).
    trace: that model's trace of the sentence. Heads head, head+1, ... (mod the model's heads) give
    the example's n_heads heads. Keeps the first n_dims of d_model and the first n_head_dims of each
    head: X [n, n_dims], W [n_dims, h*n_head_dims], b [h*n_head_dims], W_o [h*n_head_dims, n_dims].
    With n_dims = d_model and n_head_dims = d_head, Q = X W^Q + b^Q is exactly the model's q.
    """
    stack_name = trace.main_stack
    stack = getattr(model, stack_name)
    n_layers, model_heads = len(stack.blocks), trace.n_heads
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is out of range: the model has {n_layers} layers (0..{n_layers - 1})")
    if not 0 <= head < model_heads:
        raise ValueError(f"head {head} is out of range: the model has {model_heads} heads (0..{model_heads - 1})")
    attn = stack.blocks[layer].attn
    d_model, d_head = attn.W_q.in_features, attn.d_head
    if not 1 <= n_dims <= d_model:
        raise ValueError(f"the slice of d_model must keep 1..{d_model} dimensions, got {n_dims}")
    if not 1 <= n_head_dims <= d_head:
        raise ValueError(f"the slice of d_head must keep 1..{d_head} dimensions, got {n_head_dims}")
    h = _heads(n_heads)
    heads = [(head + j) % model_heads for j in range(h)]
    cols = np.concatenate([np.arange(j * d_head, j * d_head + n_head_dims) for j in heads])  # [h*n_head_dims]

    def weight(linear: Any) -> np.ndarray:  # nn.Linear stores [out, in]; the lecture's W is [in, out]
        return _param(linear.weight).T[:n_dims, cols]

    def bias(linear: Any) -> np.ndarray:
        return _param(linear.bias)[cols] if linear.bias is not None else np.zeros(len(cols))

    X = np.asarray(trace[attention_input_name(model, trace, layer)], dtype=np.float64)[:, :n_dims]
    W_o = _param(attn.W_o.weight).T[cols][:, :n_dims]  # [inner, d_model] rows of the chosen heads
    head_names = ", ".join(str(j) for j in heads)
    full = n_dims == d_model and n_head_dims == d_head
    note = (
        f"Layer {layer}, head{'s' if h > 1 else ''} {head_names}. X is what enters this layer's attention "
        f"(`{attention_input_name(model, trace, layer)}` in the trace). "
        + (
            "Full size: Q, K, V and the weights are the model's own."
            if full
            else f"**A slice**: the first {n_dims} of {d_model} dimensions of X and the first {n_head_dims} of "
            f"{d_head} columns of each head's W. Products over a slice are not the model's numbers (those sum over all "
            f"{d_model} dimensions) and 1/√d_k uses the slice's d_k = {n_head_dims}, not {d_head}."
        )
    )
    return Example(
        tuple(trace.tokens),
        X,
        weight(attn.W_q),
        weight(attn.W_k),
        weight(attn.W_v),
        bias(attn.W_q),
        bias(attn.W_k),
        bias(attn.W_v),
        W_o,
        note,
    )


# ---- shapes and masks --------------------------------------------------------------------------------
def shape_errors(
    tokens: Sequence[str],
    X: np.ndarray | None,
    W: dict[str, np.ndarray | None],
    n_heads: int,
    b: dict[str, np.ndarray | None] | None = None,
    W_o: np.ndarray | None = None,
) -> dict[str, str]:
    """Shape problems of the parsed inputs, by input name ("tokens", "W_k", "b_q", "W_o"...), naming both shapes.

    X: [n, d_model] or None when it did not parse; W: {"W_q", "W_k", "W_v"} -> [d_model, cols] or None;
    b: {"b_q", "b_k", "b_v"} -> [1, cols] or [cols] or None; W_o: [h*d_v, d_out] or None (checked
    only when n_heads > 1, where it is used).
    """
    errors: dict[str, str] = {}
    if X is not None:
        if len(tokens) == 0:
            errors["tokens"] = "there are no tokens: X needs at least one row"
        elif len(tokens) != X.shape[0]:
            errors["tokens"] = f"{len(tokens)} token names for {X.shape[0]} rows of X: give one name per row"
        elif X.shape[0] > MAX_TOKENS:
            errors["tokens"] = f"X has {X.shape[0]} rows; the step-by-step view takes at most {MAX_TOKENS} tokens"
    for name, matrix in W.items():
        if matrix is None:
            continue
        label = latex_name(name)
        if X is not None and matrix.shape[0] != X.shape[1]:
            errors[name] = (
                f"{label} is {matrix.shape[0]} × {matrix.shape[1]} but X is {X.shape[0]} × {X.shape[1]}: "
                f"{label} needs d_model = {X.shape[1]} rows"
            )
        elif matrix.shape[1] % n_heads:
            errors[name] = f"{label} has {matrix.shape[1]} columns, which do not split into {n_heads} equal heads"
    W_q, W_k = W.get("W_q"), W.get("W_k")
    if W_q is not None and W_k is not None and "W_k" not in errors and W_q.shape[1] != W_k.shape[1]:
        errors["W_k"] = (
            f"W^K is {W_k.shape[0]} × {W_k.shape[1]} but W^Q is {W_q.shape[0]} × {W_q.shape[1]}: "
            "they need the same number of columns (d_k), since each q is dotted with each k"
        )
    for name, bias in (b or {}).items():
        matrix = W.get("W_" + name[-1])
        if bias is None or matrix is None:
            continue
        bias = np.atleast_2d(bias)
        if bias.shape[0] != 1 or bias.shape[1] != matrix.shape[1]:
            errors[name] = (
                f"{latex_name(name)} must be one row of {matrix.shape[1]} numbers (one per column of "
                f"{latex_name('W_' + name[-1])}), got {bias.shape[0]} × {bias.shape[1]}"
            )
    W_v = W.get("W_v")
    if n_heads > 1 and W_o is not None and W_v is not None and W_o.shape[0] != W_v.shape[1]:
        errors["W_o"] = (
            f"W^O is {W_o.shape[0]} × {W_o.shape[1]} but the concatenated heads have {W_v.shape[1]} "
            f"columns (the columns of W^V): W^O needs {W_v.shape[1]} rows"
        )
    return errors


def available_steps(
    X: np.ndarray | None,
    W: dict[str, np.ndarray | None],
    b: dict[str, np.ndarray | None],
    W_o: np.ndarray | None,
    mask: np.ndarray | None,
    n_heads: int,
) -> tuple[AttentionSteps | None, set[str]]:
    """Run the steps that the valid inputs allow, so one bad table does not blank the whole page.

    W / b: the valid matrices by name ("W_q", "b_q", ...), None for one that did not parse or fit.
    Returns (steps, available) where available is a subset of {"Q", "K", "V", "scores", "Z", "output"};
    parts computed from a stand-in for a missing matrix are not listed and must not be shown.
    """
    if X is None:
        return None, set()
    valid = [name for name in ("W_q", "W_k", "W_v") if W.get(name) is not None]
    if not valid:
        return None, set()
    # A missing W is replaced by a valid one of the same kind (Q and K must have equal widths).
    qk = W.get("W_q") if W.get("W_q") is not None else W.get("W_k")
    if qk is None:
        qk = W[valid[0]]
    W_q = W["W_q"] if W.get("W_q") is not None else qk
    W_k = W["W_k"] if W.get("W_k") is not None else qk
    W_v = W["W_v"] if W.get("W_v") is not None else qk

    b_q = np.ravel(b["b_q"]) if W.get("W_q") is not None and b.get("b_q") is not None else np.zeros(W_q.shape[1])
    b_k = np.ravel(b["b_k"]) if W.get("W_k") is not None and b.get("b_k") is not None else np.zeros(W_k.shape[1])
    b_v = np.ravel(b["b_v"]) if W.get("W_v") is not None and b.get("b_v") is not None else np.zeros(W_v.shape[1])
    available = {part for part, name in (("Q", "W_q"), ("K", "W_k"), ("V", "W_v")) if W.get(name) is not None}
    if {"Q", "K"} <= available:
        available.add("scores")
        if "V" in available:
            available.add("Z")
            if n_heads > 1 and W_o is not None:
                available.add("output")
    ex = Example(
        tuple(str(i) for i in range(X.shape[0])),
        X,
        W_q,
        W_k,
        W_v,
        b_q,
        b_k,
        b_v,
        W_o if "output" in available else np.zeros((W_v.shape[1], 1)),
    )
    return run_example(ex, mask, n_heads, with_output="output" in available), available


def latex_name(name: str) -> str:
    """ "W_q" -> "W^Q" as printed on the page."""
    return {"W_q": "W^Q", "W_k": "W^K", "W_v": "W^V", "W_o": "W^O", "b_q": "b^Q", "b_k": "b^K", "b_v": "b^V"}.get(
        name, name
    )


def build_mask(n: int, causal: bool, padding: Sequence[int] = ()) -> np.ndarray | None:
    """bool [n, n], True where query i may attend to key j; None when nothing is masked.

    causal: j <= i only. padding: indices of padding tokens, hidden as keys from every query (their
    own rows are still computed, as in BERT: the model just ignores those outputs).
    """
    pad = [int(p) for p in padding if 0 <= int(p) < n]
    if not causal and not pad:
        return None
    allowed = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    allowed[:, pad] = False
    return allowed


def with_bias(X: np.ndarray, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([X | 1], [W ; b]): [n, d+1] and [d+1, cols], so that their product is X W + b."""
    return np.hstack([X, np.ones((X.shape[0], 1))]), np.vstack([W, np.asarray(b, dtype=np.float64)[None, :]])


def run_example(
    ex: Example, mask: np.ndarray | None = None, n_heads: int = 1, with_output: bool = True
) -> AttentionSteps:
    """tc.attention_steps on the example, biases included (Q = X W^Q + b^Q, ...) and W^O when several heads."""
    X, W_q, W_k, W_v = ex.X, ex.W_q, ex.W_k, ex.W_v
    if ex.has_bias:
        # One X' for all three: the appended column of ones picks up each W's bias row.
        X_aug, W_q = with_bias(X, W_q, ex.b_q)
        _, W_k = with_bias(X, W_k, ex.b_k)
        _, W_v = with_bias(X, W_v, ex.b_v)
        X = X_aug
    W_o = ex.W_o if (with_output and n_heads > 1) else None
    return attention_steps(X, W_q, W_k, W_v, mask, n_heads=n_heads, W_o=W_o)


def head_view(steps: AttentionSteps, head: int) -> dict[str, np.ndarray]:
    """One head's matrices: q, k [n, d_k], v [n, d_v], scores, scaled, weights [n, n], z [n, d_v]."""
    if steps.n_heads == 1:
        return {
            "q": steps.Q,
            "k": steps.K,
            "v": steps.V,
            "scores": steps.scores,
            "scaled": steps.scaled,
            "weights": steps.weights,
            "z": steps.z,
        }
    return {
        "q": steps.q_heads[head],
        "k": steps.k_heads[head],
        "v": steps.v_heads[head],
        "scores": steps.scores[head],
        "scaled": steps.scaled[head],
        "weights": steps.weights[head],
        "z": steps.z[head],
    }


# ---- one query row, every number written out --------------------------------------------------------
def fmt(x: float, digits: int = 4) -> str:
    """A number as the page prints it: 4 significant digits, integers without a decimal point, -inf kept."""
    if not np.isfinite(x):
        return "-inf" if x < 0 else ("+inf" if x > 0 else "nan")
    if float(x).is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.{digits}g}"


def _factor(x: float) -> str:
    s = fmt(x)
    return f"({s})" if s.startswith("-") else s


def dot_written_out(a: np.ndarray, b: np.ndarray) -> str:
    """ "1·0 + 0·1 + 2·1" for a·b (negative factors in parentheses)."""
    return " + ".join(f"{_factor(x)}·{_factor(y)}" for x, y in zip(a, b))


@dataclass(frozen=True, eq=False)
class RowWalkthrough:
    """Row `query` of one head, step by step.

    keys: one row per key j: the key, q·k_j written out, q·k_j, scaled a_j (or -inf), exp, weight.
    shift: the number subtracted before exp (0, or the row's max when exp would overflow; the
    weights do not change). exp_sum: sum of the exps. contributions: weight_j · v_j per key, then
    their sum z_i as the last row [n + 1, d_v].
    """

    query: int
    keys: pd.DataFrame
    shift: float
    exp_sum: float
    contributions: pd.DataFrame
    z: np.ndarray
    d_k: int


def row_walkthrough(steps: AttentionSteps, tokens: Sequence[str], query: int, head: int = 0) -> RowWalkthrough:
    """Spell out row `query`: q·k_j as a sum of products, /sqrt(d_k), exp, /sum, and z = sum_j w_j v_j."""
    view = head_view(steps, head)
    q, k, v = view["q"], view["k"], view["v"]
    n = k.shape[0]
    if not 0 <= query < q.shape[0]:
        raise ValueError(f"query row {query} is out of range: there are {q.shape[0]} tokens")
    scores, scaled, weights = view["scores"][query], view["scaled"][query], view["weights"][query]
    finite = np.isfinite(scaled)
    # exp(a) overflows float64 past ~709; subtracting the row max leaves the weights unchanged.
    top = float(np.max(scaled[finite])) if finite.any() else 0.0
    shift = top if finite.any() and np.max(np.abs(scaled[finite])) > 30 else 0.0
    exps = np.where(finite, np.exp(np.where(finite, scaled - shift, 0.0)), 0.0)
    labels = list(tokens)
    keys = pd.DataFrame(
        {
            "key": labels,
            "q·k written out": [dot_written_out(q[query], k[j]) for j in range(n)],
            "q·k": scores,
            "÷√d_k": scaled,
            ("exp(a − max)" if shift else "exp(a)"): exps,
            "weight": weights,
        }
    )
    contributions = pd.DataFrame(
        np.vstack([weights[:, None] * v, view["z"][query][None, :]]),
        index=[f"{fmt(weights[j])} · v({labels[j]})" for j in range(n)] + [f"z({labels[query]})"],
        columns=[f"z{c + 1}" for c in range(v.shape[1])],
    )
    return RowWalkthrough(query, keys, shift, float(exps.sum()), contributions, view["z"][query], steps.d_k)


# ---- positional encoding ---------------------------------------------------------------------------
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


def thin(
    matrix: np.ndarray, max_cells: int = MAX_CHART_CELLS, keep_rows: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sub-matrix, row indices, column indices) with at most max_cells cells, taking every s-th column.

    Columns are dropped first and rows are all kept when keep_rows (striding the positions of a
    sinusoid would alias its fast dimensions; each column is its own frequency, so skipping
    some loses nothing else). Otherwise rows and columns get the same stride (square matrices).
    """
    n_rows, n_cols = matrix.shape
    if n_rows * n_cols <= max_cells:
        return matrix, np.arange(n_rows), np.arange(n_cols)
    if keep_rows:
        col_step = math.ceil(n_rows * n_cols / max_cells)
        rows, cols = np.arange(n_rows), np.arange(0, n_cols, col_step)
    else:
        step = math.ceil(math.sqrt(n_rows * n_cols / max_cells))
        rows, cols = np.arange(0, n_rows, step), np.arange(0, n_cols, step)
    return matrix[np.ix_(rows, cols)], rows, cols


def grid_heatmap(
    matrix: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    title: str,
    *,
    row_title: str,
    col_title: str,
    diverging: bool = True,
    width: int = 520,
    height: int = 320,
) -> alt.Chart:
    """A heatmap for large numeric grids (positions x dimensions): fixed size, a few axis labels.

    charts.heatmap labels every row and column; with hundreds of positions that is unreadable, so
    this one labels about ten ticks per axis and never prints numbers in cells.
    """
    m = np.asarray(matrix, dtype=np.float64)
    r, c = np.meshgrid(rows, cols, indexing="ij")
    frame = pd.DataFrame({"row": r.ravel(), "col": c.ravel(), "value": m.ravel()})
    # A few outlier cells (learned embeddings have some) would wash out the rest: the colours span the
    # 99th percentile of |value| and clamp beyond; the tooltip still shows the true value.
    bound = float(np.percentile(np.abs(m), 99)) if m.size else 1.0
    bound = bound or float(np.max(np.abs(m), initial=0.0)) or 1.0
    domain = [-bound, bound] if diverging else [float(np.min(m)), float(np.max(m))]
    scale = (
        alt.Scale(scheme="redblue", domain=domain, reverse=True, clamp=True)
        if diverging
        else alt.Scale(scheme="viridis")
    )

    def ticks(values: np.ndarray) -> list[int]:
        """About ten labels at round numbers (multiples of 1, 2, 5, 8, 10, 16, ...) that are on the axis."""
        stride = int(values[1] - values[0]) if len(values) > 1 else 1  # thinned axes hold multiples of it
        span = (int(values[-1]) - int(values[0])) if len(values) else 0
        nice = stride * next(
            (n for n in (1, 2, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512) if span / (n * stride) <= 10), 1024
        )
        return [int(v) for v in values if v % nice == 0]

    return (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("col:O", title=col_title, axis=alt.Axis(values=ticks(cols), labelAngle=0)),
            y=alt.Y("row:O", title=row_title, axis=alt.Axis(values=ticks(rows))),
            color=alt.Color("value:Q", scale=scale, title=None),
            tooltip=[
                alt.Tooltip("row:O", title=row_title),
                alt.Tooltip("col:O", title=col_title),
                alt.Tooltip("value:Q", format=".4f"),
            ],
        )
        .properties(title=title, width=width, height=height)
    )


def learned_positions(model: Any, n_positions: int) -> np.ndarray:
    """The first n_positions rows of a text model's learned position embeddings, float64 [n, d_model].

    Raises ValueError when the model's positions are not learned (sinusoidal, or T5's relative bias).
    """
    stack = getattr(model, "decoder" if getattr(model, "kind", "") == "decoder" else "encoder", None)
    pos = getattr(getattr(stack, "embed", None), "pos", None)
    if not isinstance(pos, LearnedPositions):
        raise ValueError("this model has no learned position embeddings")
    if not 1 <= n_positions <= pos.max_positions:
        raise ValueError(f"the model has {pos.max_positions} positions; asked for {n_positions}")
    return _param(pos.weight)[pos.first_row : pos.first_row + n_positions]


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
