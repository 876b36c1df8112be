"""What "Attention, step by step" does with the worked example's inputs, without Streamlit: the labels of
their columns, the matrices a user edits, the edits a shared link carries, the shapes checked, and the
formula of each step.

    matrices = example_matrices(ex, n_heads=2)       # name -> (values, row labels, column labels)
    edits, problems = read_link_edits(ex, {"X": "1,0;0,1"})
    ex, digest = with_edits(ex, edits)                # the edited example and a signature of the edits
    validate(inputs, n_heads=1)                       # shape errors added, the inputs they concern dropped
    f = formulas({"Q"}, masked=True)                  # the LaTeX of each step, here with + b^Q

The numbers themselves come from `tformer_views.lessons.attention` (which runs `tc.attention_steps`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core.models.base import TracedModel
from tformer_core.steps import AttentionSteps

from ..charts.spec import unique_labels
from . import attention as ls
from . import tables as lt
from .tables import Inputs, TableError

__all__ = [
    "B_NAMES",
    "EDITABLE",
    "GIVEN",
    "INPUTS_OF",
    "LETTER",
    "NO_W",
    "OVERFLOWED",
    "W_NAMES",
    "Matrices",
    "ModelSizes",
    "as_table",
    "block_formula",
    "col_labels",
    "example_formulas",
    "example_matrices",
    "formulas",
    "head_formulas",
    "heads_formula",
    "link_texts",
    "mask_conventions_frame",
    "missing",
    "model_sizes",
    "not_runnable",
    "read_link_edits",
    "row_formulas",
    "row_tables",
    "run_inputs",
    "sdpa_frames",
    "too_many_tokens",
    "validate",
    "with_edits",
]

W_NAMES = ("W_q", "W_k", "W_v")
B_NAMES = ("b_q", "b_k", "b_v")
LETTER = {"W_q": "q", "W_k": "k", "W_v": "v"}
EDITABLE = ("tokens", "X", *W_NAMES, *B_NAMES, "Q", "K", "V", "W_o")  # what any preset lets the user edit
GIVEN = ("Q", "K", "V")

Matrices = dict[str, tuple[np.ndarray, list[str], list[str]]]  # name -> (values, row labels, column labels)


def col_labels(prefix: str, width: int, n_heads: int) -> list[str]:
    """q1, q2, ... for one head; h0·q1, ..., h1·q1, ... for several (the column blocks of each head).

    The app's numbering: heads (and tokens) from 0, as in the trace; a vector's components from 1, as in
    the lecture's formulas."""
    if n_heads == 1 or width % n_heads:
        return [f"{prefix}{c + 1}" for c in range(width)]
    per = width // n_heads
    return [f"h{c // per}·{prefix}{c % per + 1}" for c in range(width)]


# ---- the real model's slice -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSizes:
    """What the real-model preset may slice: layers, heads, d_model and each head's width d_head."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int


def model_sizes(model: TracedModel) -> ModelSizes:
    """The sizes of `model`'s main stack that bound the choosers of the real-model preset, read from its weights
    as `ls.real_model_example` slices them: d_head is each head's own width (Qwen3 and Gemma set it apart from
    d_model / n_heads)."""
    weights = model.weights()
    attn = weights.block(0).attn
    return ModelSizes(weights.n_layers, attn.n_heads, attn.W_Q.shape[1], attn.d_head)


def too_many_tokens(n_tokens: int) -> str | None:
    """Why a sentence of `n_tokens` (with [CLS] and [SEP]) cannot be the example, or None when it can."""
    if n_tokens <= ls.MAX_TOKENS:
        return None
    return (
        f"The sentence has {n_tokens} tokens with [CLS] and [SEP]; use at most {ls.MAX_TOKENS} "
        "so that every number stays readable."
    )


# ---- edits in the link ---------------------------------------------------------------------------------
def as_table(ex: ls.Example, name: str) -> np.ndarray:
    """The example's matrix `name` as its table shows it (a bias as one row)."""
    value = getattr(ex, name)
    return value[None, :] if name in B_NAMES else value


def read_link_edits(example: ls.Example, texts: Mapping[str, str]) -> tuple[dict[str, object], list[str]]:
    """The edits a link carries (name -> its text, e.g. "X" -> "1,0,2;0,1,1"), read for the tables `example`
    lets the user edit: (name -> tokens or matrix, what is wrong with each text that could not be read)."""
    edits: dict[str, object] = {}
    problems: list[str] = []
    for name in example.editable:
        text = texts.get(name)
        if not text:
            continue
        try:
            edits[name] = tuple(lt.parse_tokens(text)) if name == "tokens" else lt.from_link_text(text, name)
        except TableError as error:
            problems.append(str(error))
    return edits, problems


def with_edits(example: ls.Example, edits: Mapping[str, object]) -> tuple[ls.Example, str]:
    """The example with `edits` (from `read_link_edits`) in place of its own numbers, and a short signature of
    them. The tokens follow the rows of X (or Q): cut to their number, or named t<i> where rows were added."""
    changes: dict[str, object] = {}
    for name, value in edits.items():
        if isinstance(value, np.ndarray) and name in B_NAMES and value.shape[0] == 1:
            value = value[0]
        changes[name] = value
    rows = "Q" if example.given_qkv else "X"  # the table whose rows are the tokens
    table = changes.get(rows)
    n = table.shape[0] if isinstance(table, np.ndarray) else len(getattr(example, rows))
    named = changes.get("tokens")
    tokens: tuple[str, ...] = tuple(named) if isinstance(named, tuple) else example.tokens
    changes["tokens"] = tokens[:n] + tuple(f"t{i}" for i in range(len(tokens), n))
    digest = hashlib.sha1(repr(sorted((k, str(v)) for k, v in changes.items())).encode()).hexdigest()[:8]
    return dataclasses.replace(example, **changes), digest  # type: ignore[arg-type]


def link_texts(example: ls.Example, tokens: Sequence[str], values: Mapping[str, np.ndarray | None]) -> dict[str, str]:
    """What the link keeps of each editable table: "" for the preset's own numbers (or another preset's
    table), else the edited table as `lt.link_text` writes it (the tokens separated by spaces)."""
    texts: dict[str, str] = {}
    for name in EDITABLE:
        if name not in example.editable:
            texts[name] = ""
        elif name == "tokens":
            changed = bool(tokens) and tuple(tokens) != tuple(example.tokens)
            texts[name] = " ".join(tokens) if changed else ""
        else:
            value, preset = values.get(name), as_table(example, name)
            same = value is None or (value.shape == preset.shape and np.array_equal(value, preset))
            texts[name] = "" if value is None or same else lt.link_text(value)
    return texts


# ---- inputs ------------------------------------------------------------------------------------------
def example_matrices(ex: ls.Example, n_heads: int) -> Matrices:
    """Every editable matrix of the example but X (or Q, when Q, K, V are given), with its row and column labels."""
    if ex.given_qkv:
        rows = list(ex.tokens)
        given: Matrices = {
            name: (getattr(ex, name), rows, col_labels(name.lower(), getattr(ex, name).shape[1], n_heads))
            for name in GIVEN
        }
        v_width = ex.V.shape[1] if ex.V is not None else 0
        given["W_o"] = (ex.W_o, col_labels("v", v_width, n_heads), [f"o{c + 1}" for c in range(ex.W_o.shape[1])])
        return given
    matrices: Matrices = {  # rows labelled by their own count: a link's X may not fit them (said below)
        name: (w, [f"x{r + 1}" for r in range(w.shape[0])], col_labels(LETTER[name], w.shape[1], n_heads))
        for name, w in ((name, getattr(ex, name)) for name in W_NAMES)
    }
    for name in B_NAMES:
        width = getattr(ex, "W_" + name[-1]).shape[1]
        matrices[name] = (getattr(ex, name)[None, :], [ls.latex_name(name)], col_labels(name[-1], width, n_heads))
    matrices["W_o"] = (ex.W_o, col_labels("v", ex.W_o.shape[0], n_heads), [f"o{c + 1}" for c in range(ex.W_o.shape[1])])
    return matrices


def validate(inputs: Inputs, n_heads: int, given_qkv: bool = False) -> None:
    """Add shape errors (naming both shapes) to the parse errors, and drop the inputs they concern."""
    v = inputs.values
    if given_qkv:
        shape = ls.qkv_shape_errors(inputs.tokens, {n: v.get(n) for n in GIVEN}, n_heads, v.get("W_o"))
        for name, message in shape.items():
            inputs.errors.setdefault(name, message)
            for dropped in GIVEN if name == "tokens" else (name,):
                v[dropped] = None
        return
    shape = ls.shape_errors(
        inputs.tokens, v.get("X"), {n: v.get(n) for n in W_NAMES}, n_heads, {n: v.get(n) for n in B_NAMES}, v.get("W_o")
    )
    for name, message in shape.items():
        inputs.errors.setdefault(name, message)
        v["X" if name == "tokens" else name] = None
    for name in B_NAMES:  # a W with a bad bias cannot give its Q, K or V
        if name in inputs.errors:
            v["W_" + name[-1]] = None


# ---- the steps -----------------------------------------------------------------------------------------
def not_runnable(example: ls.Example, inputs: Inputs) -> str | None:
    """Why nothing below the inputs can be computed ("" when a message above the steps already says it), or
    None when the steps can run."""
    v = inputs.values
    if example.given_qkv and not any(v.get(name) is not None for name in GIVEN):
        return "Q, K and V and the token names are needed for everything below: fix them above."
    if v.get("X") is None and not example.given_qkv:
        return "X and the token names are needed for everything below: fix them above."
    if "tokens" in inputs.errors:
        return ""
    return None


NO_W = "At least one of W^Q, W^K, W^V is needed: fix them above."


def run_inputs(
    example: ls.Example, inputs: Inputs, mask: np.ndarray | None, n_heads: int
) -> tuple[AttentionSteps | None, set[str]]:
    """The steps the valid inputs allow and the parts they make available (`ls.available_steps`); (None, set())
    when not one of W^Q, W^K, W^V is valid (say `NO_W`)."""
    v = inputs.values
    if example.given_qkv:
        return ls.available_from_qkv({n: v.get(n) for n in GIVEN}, v.get("W_o"), mask, n_heads)
    W = {name: v.get(name) for name in W_NAMES}
    b = {name: v.get(name) for name in B_NAMES}
    return ls.available_steps(v["X"], W, b, v.get("W_o"), mask, n_heads)


def formulas(biased: set[str], masked: bool, given: bool = False) -> dict[str, str]:
    """The formula of each step; biased: the letters ("Q", "K", "V") whose bias is not all zero; given: Q, K, V
    typed in directly (no X, no W's)."""

    def b(m: str) -> str:
        return f" + b^{m}" if m in biased else ""

    def source(m: str) -> str:
        return rf"{m} \text{{ (given)}}" if given else rf"{m} = XW^{m}{b(m)}"

    return {
        "Q": source("Q"),
        "K": source("K"),
        "V": source("V"),
        "scores": r"S = QK^\top,\quad S_{ij} = q_i \cdot k_j",
        "scaled": (
            r"A = \frac{S}{\sqrt{d_k}} + M,\quad "
            r"M_{ij} = \begin{cases}0 & \text{allowed}\\ -\infty & \text{masked}\end{cases}"
            if masked
            else r"A = \frac{S}{\sqrt{d_k}}"
        ),
        "weights": r"\alpha_{ij} = \operatorname{softmax}_j(A_{ij}) = \frac{e^{A_{ij}}}{\sum_{j'} e^{A_{ij'}}}",
        "z": r"Z = \alpha V,\quad z_i = \sum_j \alpha_{ij} v_j",
        "concat": r"\operatorname{Concat}(Z_1, \dots, Z_h) = [\,Z_1 \mid \dots \mid Z_h\,]",
        "output": r"\text{MultiHead}(X) = \operatorname{Concat}(Z_1, \dots, Z_h)\,W^O",
    }


def example_formulas(example: ls.Example, inputs: Inputs, masked: bool) -> dict[str, str]:
    """`formulas` for the example as edited: + b^Q where the bias the user left is not all zero."""
    if example.given_qkv:
        return formulas(set(), masked, given=True)
    b = {name: inputs.values.get(name) for name in B_NAMES}
    return formulas({name[-1].upper() for name, x in b.items() if x is not None and np.any(x)}, masked)


# What each part is computed from: when those are all there and the part is not, its numbers overflowed.
INPUTS_OF = {"scores": {"Q", "K"}, "Z": {"scores", "V"}, "output": {"Z"}}
OVERFLOWED = {
    "scores": "QKᵀ overflowed (see the message above): the scores, the weights and Z are not shown.",
    "Z": "Z overflowed (see the message above): it is not shown.",
    "output": "The output overflowed (see the message above): it is not shown.",
}


def missing(part: str, available: set[str], otherwise: str) -> str:
    """Why `part` is not shown: it overflowed (said in an error above), or `otherwise` (an input is missing)."""
    return OVERFLOWED[part] if INPUTS_OF[part] <= available else otherwise


# ---- PyTorch's conventions -----------------------------------------------------------------------------
def mask_conventions_frame(tokens: Sequence[str], padding: Sequence[int]) -> pd.DataFrame:
    """The same padding in the conventions students meet (one row each, one column per token): two of them
    use True for opposite things."""
    c = ls.mask_conventions(len(tokens), padding)
    return pd.DataFrame(
        [
            [str(bool(x)) for x in c.key_padding_mask],
            [ls.fmt(x) for x in c.additive],
            [str(bool(x)) for x in c.sdpa_bool],
            [str(int(x)) for x in c.hf_attention_mask],
        ],
        index=pd.Index(
            [
                "key_padding_mask (nn.MultiheadAttention): True = padding, ignored",
                "additive mask M, added to QKᵀ/√d_k: −∞ = hidden",
                "attn_mask (F.scaled_dot_product_attention, bool): True = may attend",
                "attention_mask (Hugging Face): 1 = real token",
            ],
            name="convention",
        ),
        columns=unique_labels(tokens),
    )


# ---- one head, several heads, one row -------------------------------------------------------------------
def head_formulas(f: Mapping[str, str], head: int, n_heads: int) -> dict[str, str]:
    """`formulas` for head `head` of `n_heads`: Q_1 K_1^T and Z_1 with several heads, as they are with one."""
    sub = f"_{head + 1}" if n_heads > 1 else ""
    return {
        **f,
        "scores": f["scores"].replace("Q", f"Q{sub}").replace("K^", f"K{sub}^"),
        "z": f["z"].replace("Z", f"Z{sub}"),
    }


def block_formula(part: str, head: int, width: int) -> str:
    """Head `head`'s block of `width` columns of Q, K or V, LaTeX: Q_1 = columns 1..3 of Q."""
    return rf"{part}_{head + 1} = \text{{columns {head * width + 1}..{(head + 1) * width} of }} {part}"


def heads_formula(f: Mapping[str, str], d_k: int) -> str:
    """How Q splits into heads: its blocks of d_k columns (each XW^Q_j when Q comes from X)."""
    return (
        r"Q = [\,Q_1 \mid Q_2 \mid \dots \mid Q_h\,],\quad Q_j"
        + (r" = XW^Q_j" if "XW" in f["Q"] else "")
        + r" \;\; (\text{the } j\text{-th block of "
        + str(d_k)
        + r" columns; the same for } K, V)"
    )


def row_formulas(walk: ls.RowWalkthrough) -> tuple[str, str]:
    """The row's softmax with its numbers (the sum of the exps, then each weight) and z_i = sum_j w_j v_j, LaTeX."""
    exp_name = "e^{a_j - \\max}" if walk.shift else "e^{a_j}"
    total = ls.tex(walk.exp_sum)
    softmax = rf"\sum_j {exp_name} = {total},\qquad \alpha_{{{walk.query}j}} = \frac{{{exp_name}}}{{{total}}}"
    terms = " + ".join(f"{ls.tex(w)}\\,v_{{{j}}}" for j, w in enumerate(walk.keys["weight"]))
    z = rf"z_{{{walk.query}}} = {terms} = [{', '.join(ls.tex(x) for x in walk.z)}]"
    return softmax, z


def row_tables(walk: ls.RowWalkthrough) -> tuple[pd.DataFrame, list[str], pd.DataFrame]:
    """The row's tables as the page shows them: (the keys by name, their numeric columns, the weighted V rows)."""
    numeric = [c for c in walk.keys.columns if c not in ("key", "q·k written out")]
    keys = walk.keys.set_index(pd.Index(unique_labels(walk.keys["key"]), name="key")).drop(columns="key")
    contributions = walk.contributions.copy()
    contributions.index = pd.Index(unique_labels(contributions.index), name="weighted V rows")
    return keys, numeric, contributions


def sdpa_frames(z: np.ndarray, n_heads: int, tokens: Sequence[str]) -> list[pd.DataFrame]:
    """PyTorch's Z (`ls.torch_sdpa`), one table per head, its corner naming it."""
    blocks = z if n_heads > 1 else z[None]
    return [
        pd.DataFrame(
            block,
            index=pd.Index(unique_labels(tokens), name=f"PyTorch Z · head {head}" if n_heads > 1 else "PyTorch Z"),
            columns=[f"z{c + 1}" for c in range(block.shape[1])],
        )
        for head, block in enumerate(blocks)
    ]
