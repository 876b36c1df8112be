"""The logic behind "Attention, step by step": the lecture's worked example, editable, every number kept.

    ex = default_example(n_heads=1)                    # the worked example: 3 tokens, d_model 4, d_k 3
    steps = run_example(ex, build_mask(3, causal=True, padding=[]))
    given = sdpa_example()                             # Q, K, V given directly (ex.given_qkv): no X, no W's
    steps = run_example(given, None)
    walk = row_walkthrough(steps, ex.tokens, query=1)  # every number of row 1, written out

All numbers come from `tc.attention_steps` (float64). Biases (BERT's b^Q, b^K, b^V) are folded in
as an extra input column of ones and an extra weight row b, so X'W' = XW + b exactly and the
step function needs no bias argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.steps import AttentionSteps, attention_from_qkv, attention_steps
from tformer_core.trace import Trace, to_numpy

__all__ = [
    "EXAMPLE_TOKENS",
    "EXAMPLE_W_K",
    "EXAMPLE_W_Q",
    "EXAMPLE_W_V",
    "EXAMPLE_X",
    "MAX_CELLS_NAMED",
    "MAX_TOKENS",
    "SDPA_CODE",
    "SDPA_K",
    "SDPA_Q",
    "SDPA_TOKENS",
    "TAYO_TOKENS",
    "TAYO_X",
    "Example",
    "MaskConventions",
    "RowWalkthrough",
    "as_factor",
    "attention_input_name",
    "available_from_qkv",
    "available_steps",
    "build_mask",
    "default_example",
    "dot_written_out",
    "fmt",
    "head_matrices",
    "latex_name",
    "mask_conventions",
    "non_finite",
    "qkv_shape_errors",
    "random_example",
    "real_model_example",
    "row_walkthrough",
    "run_example",
    "sdpa_example",
    "shape_errors",
    "tayo_example",
    "tex",
    "torch_sdpa",
    "with_bias",
]

MAX_TOKENS = 12  # the worked example is read cell by cell: beyond this the tables stop being readable


# ---- the example ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Example:
    """The inputs of the worked example.

    tokens: n labels. X: [n, d_model]. W_q, W_k: [d_model, h*d_k]; W_v: [d_model, h*d_v] (columns
    of head j are the j-th block). b_q, b_k: [h*d_k]; b_v: [h*d_v] (zeros when the example has no
    biases). W_o: [h*d_v, d_model]. note: where the numbers come from (shown under the tables).
    """

    tokens: tuple[str, ...]
    X: np.ndarray | None
    W_q: np.ndarray | None
    W_k: np.ndarray | None
    W_v: np.ndarray | None
    b_q: np.ndarray | None
    b_k: np.ndarray | None
    b_v: np.ndarray | None
    W_o: np.ndarray
    note: str = ""
    # Q, K, V given directly (the lectures' F.scaled_dot_product_attention demo): then X, the W's and b's are None.
    Q: np.ndarray | None = None
    K: np.ndarray | None = None
    V: np.ndarray | None = None

    @property
    def given_qkv(self) -> bool:
        return self.Q is not None

    @property
    def editable(self) -> tuple[str, ...]:
        """The tables a user edits (and a link carries): tokens and X, the W's, b's and W^O; or tokens, Q, K, V, W^O."""
        if self.given_qkv:
            return ("tokens", "Q", "K", "V", "W_o")
        return ("tokens", "X", "W_q", "W_k", "W_v", "b_q", "b_k", "b_v", "W_o")

    @property
    def has_bias(self) -> bool:
        return not self.given_qkv and bool(np.any(self.b_q) or np.any(self.b_k) or np.any(self.b_v))


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


# "tayo ay masaya" ("we are happy"): the lecture's Filipino sentence with its 4-dim embeddings.
TAYO_TOKENS = ("tayo", "ay", "masaya")
TAYO_X = np.array([[0.1, -2, 0.4, -1], [0.3, 1, -1, 2], [0.1, 0, 1, -1]], dtype=np.float64)


def tayo_example(n_heads: int = 1) -> Example:
    """ "tayo ay masaya" with the lecture's embeddings as X; W^Q, W^K, W^V (and W^O) those of the worked example."""
    ex = default_example(n_heads)
    note = (
        'The lecture\'s sentence "tayo ay masaya" ("we are happy") with its 4-dimensional embeddings as X; '
        "W^Q, W^K, W^V are the worked example's."
    )
    return replace(ex, tokens=TAYO_TOKENS, X=TAYO_X.copy(), note=note)


# The lectures' F.scaled_dot_product_attention demo: Q, K, V given directly, with value = key.
SDPA_TOKENS = ("t0", "t1", "t2", "t3")
SDPA_Q = np.array([[0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], dtype=np.float64)
SDPA_K = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=np.float64)
SDPA_CODE = """import torch
import torch.nn.functional as F

query = torch.tensor([[0., 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
key = torch.tensor([[1., 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
value = key
F.scaled_dot_product_attention(query, key, value)"""


def sdpa_example(n_heads: int = 1) -> Example:
    """Q, K and V = K of the lecture's PyTorch demo (d_k = 4); its output rows are [1, 0.8318, 0.7227, 0.4455] ×3
    and [1, 0.7227, 0.8318, 0.5545]. With several heads the 4 columns split into blocks (2 heads of 2, 4 of 1)."""
    _heads(n_heads)
    note = (
        "PyTorch's `F.scaled_dot_product_attention(query, key, value)` demo from the lecture: Q, K and V are "
        "given directly (no X, no W's) and value = key, so V = K. PyTorch's own result is computed below."
    )
    blank = (None,) * 7  # no X, W's or b's
    W_o = _small_integers(7, (4, 4))  # [h*d_v, d_model] = [4, 4] for any number of heads
    return Example(SDPA_TOKENS, *blank, W_o, note, Q=SDPA_Q.copy(), K=SDPA_K.copy(), V=SDPA_K.copy())


def random_example(seed: int, n_tokens: int, d_model: int, d_k: int, n_heads: int = 1) -> Example:
    """Random X [n, d_model] and weights [d_model, h*d_k], rounded to 2 decimals, from numpy's generator `seed`.

    Weights are scaled by 1/sqrt(d_model) (as common initialisations do) so the scores stay moderate.
    """
    h = _heads(n_heads)
    for what, value, low in (("n_tokens", n_tokens, 1), ("d_model", d_model, 1), ("d_k", d_k, 1)):
        if int(value) != value or value < low:
            raise InputError(f"{what} must be a whole number >= {low}, got {value!r}")
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
        raise InputError(f"n_heads must be a whole number >= 1, got {n_heads!r}")
    return int(n_heads)


def _param(tensor: torch.Tensor) -> np.ndarray:
    """A model parameter as a float64 numpy array (a copy: the lesson may edit it)."""
    return np.array(to_numpy(tensor), dtype=np.float64)


def attention_input_name(model: TracedModel, trace: Trace, layer: int) -> str:
    """The trace name of what enters the self-attention of `layer` (the X of the worked example).

    Post-norm blocks (BERT, MiniLM) feed the residual stream itself: `{stack}.{layer}.resid_pre`,
    which for layer 0 is the embedding sum after its LayerNorm. Pre-norm blocks (GPT-2) feed
    LN(residual stream): `{stack}.{layer}.ln_attn`.
    """
    stack = trace.main_stack
    pre_norm = model.config.norm == "pre"
    return f"{stack}.{layer}.{'ln_attn' if pre_norm else 'resid_pre'}"


def _slice_note(
    layer: int, heads: list[int], x_name: str, n_dims: int, d_model: int, n_head_dims: int, d_head: int
) -> str:
    """Where the example's numbers come from, and what a slice changes."""
    plural = "s" if len(heads) > 1 else ""
    note = f"Layer {layer}, head{plural} {', '.join(str(j) for j in heads)}. X is what enters this layer's attention "
    note += f"(`{x_name}` in the trace). "
    if n_dims == d_model and n_head_dims == d_head:
        return note + "Full size: Q, K, V and the weights are the model's own."
    return note + (
        f"**A slice**: the first {n_dims} of {d_model} dimensions of X and the first {n_head_dims} of "
        f"{d_head} columns of each head's W. Products over a slice are not the model's numbers (those sum over all "
        f"{d_model} dimensions) and 1/√d_k uses the slice's d_k = {n_head_dims}, not {d_head}."
    )


def real_model_example(
    model: TracedModel, trace: Trace, layer: int, head: int, n_dims: int, n_head_dims: int, n_heads: int = 1
) -> Example:
    """A slice of a real model's attention: X = the layer's input, W's = the head's columns of W^Q, W^K, W^V.

    model: an encoder or decoder-only `TracedModel`; its weights are read per head (`model.weights()`): the
    example's W^Q is the chosen heads' [d_model, d_head] matrices side by side, as the lecture writes them.
    trace: that model's trace of the sentence. Heads head, head+1, ... (mod the model's heads) give
    the example's n_heads heads (with grouped-query attention, W^K and W^V are those of the key/value head each
    reads). Keeps the first n_dims of d_model and the first n_head_dims of each head: X [n, n_dims],
    W [n_dims, h*n_head_dims], b [h*n_head_dims], W_o [h*n_head_dims, n_dims].
    With n_dims = d_model and n_head_dims = d_head, Q = X W^Q + b^Q is exactly the model's q.
    """
    weights = model.weights(trace.main_stack)
    n_layers, model_heads = weights.n_layers, trace.n_heads
    if not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} is out of range: the model has {n_layers} layers (0..{n_layers - 1})")
    if not 0 <= head < model_heads:
        raise InputError(f"head {head} is out of range: the model has {model_heads} heads (0..{model_heads - 1})")
    attn = weights.block(layer).attn
    d_model, d_head = attn.W_Q.shape[1], attn.d_head
    if not 1 <= n_dims <= d_model:
        raise InputError(f"the slice of d_model must keep 1..{d_model} dimensions, got {n_dims}")
    if not 1 <= n_head_dims <= d_head:
        raise InputError(f"the slice of d_head must keep 1..{d_head} dimensions, got {n_head_dims}")
    h = _heads(n_heads)
    heads = [(head + j) % model_heads for j in range(h)]

    def weight(W: torch.Tensor, kv: bool = False) -> np.ndarray:  # [heads, D, dh] -> [n_dims, h*n_head_dims]
        return np.hstack([_param(W[attn.kv_head(j) if kv else j])[:n_dims, :n_head_dims] for j in heads])

    def bias(b: torch.Tensor, kv: bool = False) -> np.ndarray:  # [heads, dh] -> [h*n_head_dims]
        return np.concatenate([_param(b[attn.kv_head(j) if kv else j])[:n_head_dims] for j in heads])

    X = np.asarray(trace[attention_input_name(model, trace, layer)], dtype=np.float64)[:, :n_dims]
    W_o = np.vstack([_param(attn.W_O[j])[:n_head_dims, :n_dims] for j in heads])  # rows of the chosen heads
    note = _slice_note(layer, heads, attention_input_name(model, trace, layer), n_dims, d_model, n_head_dims, d_head)
    return Example(
        tuple(trace.tokens),
        X,
        weight(attn.W_Q),
        weight(attn.W_K, kv=True),
        weight(attn.W_V, kv=True),
        bias(attn.b_Q),
        bias(attn.b_K, kv=True),
        bias(attn.b_V, kv=True),
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
    present = {name: m for name in ("W_q", "W_k", "W_v") if (m := W.get(name)) is not None}
    if not present:
        return None, set()
    # A missing W is replaced by a valid one of the same kind (Q and K must have equal widths).
    qk = present.get("W_q", present.get("W_k", next(iter(present.values()))))
    W_q, W_k, W_v = (present.get(name, qk) for name in ("W_q", "W_k", "W_v"))

    def bias(name: str, matrix: np.ndarray) -> np.ndarray:
        given = b.get("b" + name[1:])
        return np.ravel(given) if name in present and given is not None else np.zeros(matrix.shape[1])

    b_q, b_k, b_v = bias("W_q", W_q), bias("W_k", W_k), bias("W_v", W_v)
    available = {part for part, name in (("Q", "W_q"), ("K", "W_k"), ("V", "W_v")) if name in present}
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
        W_o if W_o is not None and "output" in available else np.zeros((W_v.shape[1], 1)),
    )
    return run_example(ex, mask, n_heads, with_output="output" in available), available


def qkv_shape_errors(
    tokens: Sequence[str], given: dict[str, np.ndarray | None], n_heads: int, W_o: np.ndarray | None = None
) -> dict[str, str]:
    """Shape problems of Q, K, V given directly (self-attention: one row per token in each), by name."""
    errors: dict[str, str] = {}
    n = len(tokens)
    if n == 0:
        errors["tokens"] = "there are no tokens: give at least one"
    elif n > MAX_TOKENS:
        errors["tokens"] = f"there are {n} tokens; the step-by-step view takes at most {MAX_TOKENS}"
    for name, matrix in given.items():
        if matrix is None or "tokens" in errors:
            continue
        if matrix.shape[0] != n:
            errors[name] = f"{name} has {matrix.shape[0]} rows for {n} tokens: give one row per token"
        elif matrix.shape[1] % n_heads:
            errors[name] = f"{name} has {matrix.shape[1]} columns, which do not split into {n_heads} equal heads"
    Q, K = given.get("Q"), given.get("K")
    if Q is not None and K is not None and not {"Q", "K"} & errors.keys() and Q.shape[1] != K.shape[1]:
        errors["K"] = (
            f"K is {K.shape[0]} × {K.shape[1]} but Q is {Q.shape[0]} × {Q.shape[1]}: they need the same number "
            "of columns (d_k), since each q is dotted with each k"
        )
    V = given.get("V")
    if n_heads > 1 and W_o is not None and V is not None and "V" not in errors and W_o.shape[0] != V.shape[1]:
        errors["W_o"] = (
            f"W^O is {W_o.shape[0]} × {W_o.shape[1]} but the concatenated heads have {V.shape[1]} columns "
            f"(the columns of V): W^O needs {V.shape[1]} rows"
        )
    return errors


def available_from_qkv(
    given: dict[str, np.ndarray | None], W_o: np.ndarray | None, mask: np.ndarray | None, n_heads: int
) -> tuple[AttentionSteps | None, set[str]]:
    """As `available_steps`, for Q, K, V given directly: a missing one is stood in for and its parts not listed."""
    present = [name for name in ("Q", "K", "V") if given.get(name) is not None]
    if not present:
        return None, set()
    Q = given.get("Q") if given.get("Q") is not None else given.get("K")
    K = given.get("K") if given.get("K") is not None else Q
    if Q is None:  # only V: its shape stands in for the scores, which are not shown
        Q = K = given["V"]
    V = given.get("V") if given.get("V") is not None else K
    available = set(present)
    if {"Q", "K"} <= available:
        available.add("scores")
        if "V" in available:
            available.add("Z")
            if n_heads > 1 and W_o is not None:
                available.add("output")
    W_o = W_o if "output" in available else None
    with np.errstate(over="ignore", invalid="ignore"):  # numbers past float64's range: see `non_finite`
        return attention_from_qkv(Q, K, V, mask, n_heads=n_heads, W_o=W_o), available


# ---- numbers past float64's range ------------------------------------------------------------------------
# part -> the parts computed from it: what cannot be shown once it holds an infinity or a NaN.
_DEPENDS = {"Q": ("scores", "Z", "output"), "K": ("scores", "Z", "output"), "V": ("Z", "output")}
_DEPENDS |= {"scores": ("Z", "output"), "Z": ("output",), "output": ()}
MAX_CELLS_NAMED = 3


def _part_values(steps: AttentionSteps, part: str) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(what the page calls it, its numbers, cells that may hold -inf by design or None) for one part."""
    if part == "scores":
        masked = None if steps.mask is None else ~np.broadcast_to(steps.mask, steps.scaled.shape)
        return [
            ("QKᵀ", steps.scores, None),
            ("the scaled scores", steps.scaled, masked),
            ("the weights", steps.weights, None),
        ]
    matrix = {"Q": steps.Q, "K": steps.K, "V": steps.V, "Z": steps.concat, "output": steps.output}[part]
    return [({"Z": "Z", "output": "the output"}.get(part, part), matrix, None)]


def _cell(index: tuple[int, ...], value: float, tokens: Sequence[str], square: bool) -> str:
    """One cell named as the page shows it: a head when there are several, tokens by position and text."""
    *head, row, col = (int(i) for i in index)
    where = f"head {head[0]}, " if head else ""
    token = tokens[row] if row < len(tokens) else row
    other = f"key {col} ({tokens[col]})" if square and col < len(tokens) else f"column {col + 1}"
    return f"{where}row {row} ({token}), {other} = {fmt(value)}"


def non_finite(steps: AttentionSteps, available: set[str], tokens: Sequence[str]) -> tuple[set[str], list[str]]:
    """The parts of `available` whose numbers are all finite, and a message for each part that is not.

    Inputs are finite (the tables refuse inf and NaN), but products of numbers near float64's limit (about
    ±1.8 × 10^308) overflow: X·W becomes ±inf, QKᵀ then inf − inf = NaN, and softmax of NaN is NaN. A part that
    overflowed is named with its cells (the first MAX_CELLS_NAMED) and left out, with everything computed from it,
    so that no caption ("each row sums to 1") is shown beside numbers that say otherwise.
    """
    kept, messages = set(available), []
    for part in ("Q", "K", "V", "scores", "Z", "output"):
        if part not in kept:
            continue
        for name, values, allowed in _part_values(steps, part):
            bad = ~np.isfinite(values) if allowed is None else ~np.isfinite(values) & ~allowed
            if not bad.any():
                continue
            cells = np.argwhere(bad)
            square = values.shape[-1] == values.shape[-2] == len(tokens) and part == "scores"
            named = [_cell(tuple(c), float(values[tuple(c)]), tokens, square) for c in cells[:MAX_CELLS_NAMED]]
            more = f" and {len(cells) - MAX_CELLS_NAMED} more" if len(cells) > MAX_CELLS_NAMED else ""
            count = f"{len(cells)} number is" if len(cells) == 1 else f"{len(cells)} numbers are"
            messages.append(
                f"{name} overflowed: {count} not finite ({'; '.join(named)}{more}). "
                "They pass float64's largest number, about ±1.8 × 10^308: use smaller numbers. "
                f"What is computed from {name} is not shown."
            )
            kept -= {part, *_DEPENDS[part]}
            break
    return kept, messages


# ---- PyTorch's conventions -----------------------------------------------------------------------------
@dataclass(frozen=True)
class MaskConventions:
    """One padding choice written in each convention a student meets (for n keys).

    key_padding_mask: nn.MultiheadAttention / nn.TransformerEncoder's, True = padding (ignored).
    additive: what is added to the scaled scores, 0 = kept, -inf = hidden.
    sdpa_bool: F.scaled_dot_product_attention's boolean attn_mask, True = may attend: the opposite of the first.
    hf_attention_mask: transformers' attention_mask, 1 = a real token, 0 = padding.
    """

    key_padding_mask: np.ndarray
    additive: np.ndarray
    sdpa_bool: np.ndarray
    hf_attention_mask: np.ndarray


def mask_conventions(n: int, padding: Sequence[int]) -> MaskConventions:
    pad = np.zeros(n, dtype=bool)
    pad[[int(p) for p in padding if 0 <= int(p) < n]] = True
    return MaskConventions(pad, np.where(pad, -np.inf, 0.0), ~pad, (~pad).astype(int))


def torch_sdpa(steps: AttentionSteps) -> tuple[np.ndarray, float]:
    """PyTorch's F.scaled_dot_product_attention on the same q, k, v (per head) and mask (its boolean attn_mask:
    True = may attend); returns (its Z, [h, n, d_v] or [n, d_v] like steps.z, and max |ours - PyTorch|).

    A query with every key masked gets NaN from PyTorch and zeros here; those rows are left out of the difference.
    """
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(np.ascontiguousarray(a)) for a in (steps.q_heads, steps.k_heads, steps.v_heads))
    mask = None if steps.mask is None else torch.from_numpy(np.ascontiguousarray(steps.mask))
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy()  # [h, n, d_v], float64 in, float64 out
    ours = steps.z if steps.n_heads > 1 else steps.z[None]
    rows = np.isfinite(z).all(axis=-1)
    diff = float(np.max(np.abs(ours[rows] - z[rows]))) if rows.any() else 0.0
    return (z if steps.n_heads > 1 else z[0]), diff


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
    """tc.attention_steps on the example, biases included (Q = X W^Q + b^Q, ...) and W^O when several heads;
    tc.attention_from_qkv when Q, K and V are given directly."""
    if ex.given_qkv:
        W_o = ex.W_o if (with_output and n_heads > 1) else None
        with np.errstate(over="ignore", invalid="ignore"):  # numbers past float64's range: see `non_finite`
            return attention_from_qkv(ex.Q, ex.K, ex.V, mask, n_heads=n_heads, W_o=W_o)
    X, W_q, W_k, W_v = ex.X, ex.W_q, ex.W_k, ex.W_v
    if X is None or W_q is None or W_k is None or W_v is None:
        raise ValueError("the example gives neither Q, K and V nor X and the three W's")
    if ex.has_bias and ex.b_q is not None and ex.b_k is not None and ex.b_v is not None:
        # One X' for all three: the appended column of ones picks up each W's bias row.
        X_aug, W_q = with_bias(X, W_q, ex.b_q)
        _, W_k = with_bias(X, W_k, ex.b_k)
        _, W_v = with_bias(X, W_v, ex.b_v)
        X = X_aug
    W_o = ex.W_o if (with_output and n_heads > 1) else None
    with np.errstate(over="ignore", invalid="ignore"):  # numbers past float64's range: see `non_finite`
        return attention_steps(X, W_q, W_k, W_v, mask, n_heads=n_heads, W_o=W_o)


def head_matrices(steps: AttentionSteps, head: int) -> dict[str, np.ndarray]:
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


def tex(x: float, digits: int = 4) -> str:
    """A number for a LaTeX formula: as `fmt`, with powers of ten written 1.131 \\times 10^{4} (LaTeX
    typesets "1.131e+04" as "1.131e + 04"), and 10^{-5} alone where the mantissa is 1 (an epsilon)."""
    s = fmt(x, digits)
    if "e" not in s:
        return s.replace("inf", r"\infty")
    mantissa, exponent = s.split("e")
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \times {power}"


def as_factor(x: float) -> str:
    """x written as a factor of a product ("2", "(-0.5)"): a negative number in parentheses."""
    s = fmt(x)
    return f"({s})" if s.startswith("-") else s


def dot_written_out(a: np.ndarray, b: np.ndarray) -> str:
    """ "1·0 + 0·1 + 2·1" for a·b (negative factors in parentheses)."""
    return " + ".join(f"{as_factor(x)}·{as_factor(y)}" for x, y in zip(a, b))


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
    view = head_matrices(steps, head)
    q, k, v = view["q"], view["k"], view["v"]
    n = k.shape[0]
    if not 0 <= query < q.shape[0]:
        raise InputError(f"query row {query} is out of range: there are {q.shape[0]} tokens")
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
