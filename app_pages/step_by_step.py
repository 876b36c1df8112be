"""Attention, step by step: the lecture's worked example, editable.

Read widgets (a preset, the edited tables, masks, heads) -> ask tformer_views.lessons.attention (which
runs tc.attention_steps) -> draw every intermediate as a formula, a table, a heatmap and a CSV.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import caches, downloads, presenter
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.tables import Inputs, data_editor, matrix_panel
from tformer_app.url import UrlState, int_key, int_list
from tformer_core.steps import AttentionSteps
from tformer_views.charts.spec import unique_labels
from tformer_views.lessons import attention as ls
from tformer_views.lessons import tables as lt
from tformer_views.lessons.tables import TableError

MODEL = DEFAULT_TEXT_MODEL
PRESETS = {
    "example": "Lecture example (3 tokens)",
    "tayo": "tayo ay masaya (the lecture's embeddings)",
    "sdpa": "Q, K, V given: PyTorch's scaled_dot_product_attention demo",
    "random": "Random numbers (seeded)",
    "real": f"From a real model ({MODEL})",
}
MODES = {"tables": "Tables", "text": "Text (paste numbers)"}
MAX_HEADS = 4
DEFAULT_SENTENCE = "The cat sat."
W_NAMES = ("W_q", "W_k", "W_v")
B_NAMES = ("b_q", "b_k", "b_v")
LETTER = {"W_q": "q", "W_k": "k", "W_v": "v"}

INTRO = (
    "The lecture's worked example, with every number: X → Q, K, V → QKᵀ → ÷√d_k → softmax → Z. "
    "Edit any table, pick a preset, add masks or heads; the link keeps the view."
)


# A formula, the numbers as a table (its corner says the name) and a heatmap; files "attention_<name>.csv".
show_matrix = partial(matrix_panel, key_prefix="step", file_prefix="attention")


def col_labels(prefix: str, width: int, n_heads: int) -> list[str]:
    """q1, q2, ... for one head; h0·q1, ..., h1·q1, ... for several (the column blocks of each head).

    The app's numbering: heads (and tokens) from 0, as in the trace; a vector's components from 1, as in
    the lecture's formulas."""
    if n_heads == 1 or width % n_heads:
        return [f"{prefix}{c + 1}" for c in range(width)]
    per = width // n_heads
    return [f"h{c // per}·{prefix}{c % per + 1}" for c in range(width)]


# ---- presets ---------------------------------------------------------------------------------------
def preset_controls(url: UrlState, preset: str, n_heads: int) -> tuple[ls.Example | None, tuple]:
    """The preset's own settings; returns its example (None when it cannot be built) and a signature of them."""
    if preset == "example":
        return ls.default_example(n_heads), (preset, n_heads)
    if preset == "tayo":
        return ls.tayo_example(n_heads), (preset, n_heads)
    if preset == "sdpa":
        return ls.sdpa_example(n_heads), (preset, n_heads)
    if preset == "random":
        c = st.columns(4)
        seed = c[0].number_input("Seed", 0, 10**6, key=int_key(url, "seed", 0, 0, 10**6))
        n = c[1].number_input("Tokens", 1, ls.MAX_TOKENS, key=int_key(url, "n", 4, 1, ls.MAX_TOKENS))
        d = c[2].number_input("d_model", 1, 16, key=int_key(url, "d", 4, 1, 16))
        k = c[3].number_input("d_k = d_v (per head)", 1, 16, key=int_key(url, "dk", 3, 1, 16))
        return ls.random_example(seed, n, d, k, n_heads), (preset, seed, n, d, k, n_heads)

    sentence = st.text_input(
        "Sentence",
        key=url.key("text", DEFAULT_SENTENCE),
        help=f"Tokenised by {MODEL}, with its [CLS] and [SEP]; at most {ls.MAX_TOKENS} tokens.",
    )
    model = caches.load_model(MODEL)
    if model is None:
        return None, (preset,)
    cfg = model.config
    c = st.columns(4)
    layer = c[0].selectbox(
        "Layer", list(range(cfg.n_layers)), key=url.key("layer", 0, choices=list(range(cfg.n_layers)))
    )
    head = c[1].selectbox(
        "Head" if n_heads == 1 else "First head",
        list(range(cfg.n_heads)),
        key=url.key("head", 0, choices=list(range(cfg.n_heads))),
    )
    d_head = cfg.d_model // cfg.n_heads
    dims = c[2].number_input(
        f"Dims of d_model (of {cfg.d_model})", 1, cfg.d_model, key=int_key(url, "dims", 4, 1, cfg.d_model)
    )
    hdims = c[3].number_input(f"Dims per head (of {d_head})", 1, d_head, key=int_key(url, "hdims", 3, 1, d_head))
    sig = (preset, sentence, layer, head, dims, hdims, n_heads)
    if not sentence.strip():
        st.error("Type a sentence to take X from.")
        return None, sig
    trace = run_safely(lambda: caches.cached("text", MODEL, sentence, None), "Sentence")
    if trace is None:
        return None, sig
    if len(trace.tokens) > ls.MAX_TOKENS:
        st.error(
            f"The sentence has {len(trace.tokens)} tokens with [CLS] and [SEP]; use at most {ls.MAX_TOKENS} "
            "so that every number stays readable."
        )
        return None, sig
    return run_safely(lambda: ls.real_model_example(model, trace, layer, head, dims, hdims, n_heads), "Model"), sig


# ---- edits in the link ---------------------------------------------------------------------------------
EDITABLE = ("tokens", "X", *W_NAMES, *B_NAMES, "Q", "K", "V", "W_o")  # what any preset lets the user edit
GIVEN = ("Q", "K", "V")


def _as_table(ex: ls.Example, name: str) -> np.ndarray:
    return getattr(ex, name)[None, :] if name in B_NAMES else getattr(ex, name)


def link_edits(url: UrlState, example: ls.Example, sig: tuple) -> tuple[ls.Example, tuple]:
    """The example with the edits a shared link carries (e_X=1,0,2;0,1,1 ...: only what differs from the
    preset), read on the session's first visit; they hold until the preset or its settings change."""
    for name in EDITABLE:
        url.key(f"e_{name}", "", cast=str, omit_default=True)
        url.described[f"e_{name}"] = f"your edits of {ls.latex_name(name) if name != 'tokens' else 'the tokens'}"
    if url.incoming is not None:
        edits: dict[str, object] = {}
        for name in example.editable:
            text = url.value(f"e_{name}")
            if not text:
                continue
            try:
                edits[name] = tuple(lt.parse_tokens(text)) if name == "tokens" else lt.from_link_text(text, name)
            except TableError as error:
                st.warning(f"The link's edits could not be read: {escape(error)}")
        st.session_state["step.link_edits"] = (sig, edits)
    stored_sig, edits = st.session_state.get("step.link_edits", (None, {}))
    if stored_sig != sig or not edits:
        return example, sig
    changes = {n: (v[0] if n in B_NAMES and v.shape[0] == 1 else v) for n, v in edits.items()}
    rows = "Q" if example.given_qkv else "X"  # the table whose rows are the tokens
    n = changes[rows].shape[0] if rows in changes else len(getattr(example, rows))
    tokens = tuple(changes.get("tokens", example.tokens))  # one name per row of X: the table holds both
    changes["tokens"] = tokens[:n] + tuple(f"t{i}" for i in range(len(tokens), n))
    digest = hashlib.sha1(repr(sorted((n, str(v)) for n, v in changes.items())).encode()).hexdigest()[:8]
    return dataclasses.replace(example, **changes), (*sig, digest)


def record_edits(url: UrlState, example: ls.Example, inputs: Inputs) -> None:
    """Put in the link what the user changed from the preset (nothing for the preset's own numbers)."""
    for name in EDITABLE:
        if name not in example.editable:  # another preset's tables
            url.set(f"e_{name}", "")
            continue
        if name == "tokens":
            changed = bool(inputs.tokens) and tuple(inputs.tokens) != tuple(example.tokens)
            url.set("e_tokens", " ".join(inputs.tokens) if changed else "")
            continue
        value, preset = inputs.values.get(name), _as_table(example, name)
        same = value is None or (value.shape == preset.shape and np.array_equal(value, preset))
        url.set(f"e_{name}", "" if same else lt.link_text(value))


# ---- inputs ------------------------------------------------------------------------------------------
Matrices = dict[str, tuple[np.ndarray, list[str], list[str]]]  # name -> (values, row labels, column labels)


def example_matrices(ex: ls.Example, n_heads: int) -> Matrices:
    """Every editable matrix of the example but X (or Q, when Q, K, V are given), with its row and column labels."""
    if ex.given_qkv:
        rows = list(ex.tokens)
        matrices = {
            name: (getattr(ex, name), rows, col_labels(name.lower(), getattr(ex, name).shape[1], n_heads))
            for name in GIVEN
        }
        v_width = ex.V.shape[1]
        matrices["W_o"] = (ex.W_o, col_labels("v", v_width, n_heads), [f"o{c + 1}" for c in range(ex.W_o.shape[1])])
        return matrices
    matrices: Matrices = {  # rows labelled by their own count: a link's X may not fit them (said below)
        name: (w, [f"x{r + 1}" for r in range(w.shape[0])], col_labels(LETTER[name], w.shape[1], n_heads))
        for name, w in ((name, getattr(ex, name)) for name in W_NAMES)
    }
    for name in B_NAMES:
        width = getattr(ex, "W_" + name[-1]).shape[1]
        matrices[name] = (getattr(ex, name)[None, :], [ls.latex_name(name)], col_labels(name[-1], width, n_heads))
    matrices["W_o"] = (ex.W_o, col_labels("v", ex.W_o.shape[0], n_heads), [f"o{c + 1}" for c in range(ex.W_o.shape[1])])
    return matrices


def edit_tables(ex: ls.Example, sig: tuple, n_heads: int, mode: str) -> Inputs:
    """The editable inputs, started from the preset: data editors, or text areas to paste numbers into."""
    digest = hashlib.sha1(repr(sig).encode()).hexdigest()[:10]  # a new preset gives fresh editors
    matrices = example_matrices(ex, n_heads)
    if mode == "text":
        return edit_as_text(ex, matrices, digest, n_heads)
    return edit_as_tables(ex, matrices, digest, n_heads)


def _bias_label(ex: ls.Example) -> str:
    return "Biases b^Q, b^K, b^V" + (" (this model has them)" if ex.has_bias else " (all 0 here)")


def edit_as_text(ex: ls.Example, matrices: Matrices, digest: str, n_heads: int) -> Inputs:
    out = Inputs()
    if st.session_state.get("step._text_sig") != digest:
        # Text areas keep what was typed across reruns; a new preset replaces it.
        st.session_state["step.paste.tokens"] = " ".join(ex.tokens)
        if not ex.given_qkv:
            st.session_state["step.paste.X"] = lt.format_matrix_text(ex.X)
        for name, (matrix, _, _) in matrices.items():
            st.session_state[f"step.paste.{name}"] = lt.format_matrix_text(matrix)
        st.session_state["step._text_sig"] = digest
    st.caption(
        "One row per line, numbers separated by spaces or commas (brackets are ignored). "
        "A new preset or number of heads starts the text again."
    )

    def paste(where: Any, name: str, label: str, **kwargs: Any) -> None:
        text = where.text_area(label, key=f"step.paste.{name}", **kwargs)
        out.parse(name, lambda: lt.parse_matrix_text(text, ls.latex_name(name)))

    if ex.given_qkv:
        out.tokens = lt.parse_tokens(st.text_input("Tokens (separated by spaces)", key="step.paste.tokens"))
        for column, name in zip(st.columns(3), GIVEN):
            paste(column, name, f"{name}  (n × {'d_v' if name == 'V' else 'd_k'})")
        if n_heads > 1:
            paste(st, "W_o", "W^O  (h·d_v × d_model)")
        return out
    left, right = st.columns([1, 2])
    out.tokens = lt.parse_tokens(left.text_input("Tokens (separated by spaces)", key="step.paste.tokens"))
    out.parse("X", lambda: lt.parse_matrix_text(right.text_area("X  (n × d_model)", key="step.paste.X"), "X"))

    for column, name in zip(st.columns(3), W_NAMES):
        paste(column, name, f"{ls.latex_name(name)}  (d_model × d_k)")
    with st.expander(_bias_label(ex), expanded=ex.has_bias):
        for column, name in zip(st.columns(3), B_NAMES):
            paste(column, name, ls.latex_name(name), height=68)
    if n_heads > 1:
        paste(st, "W_o", "W^O  (h·d_v × d_model)")
    return out


def edit_as_tables(ex: ls.Example, matrices: Matrices, digest: str, n_heads: int) -> Inputs:
    out = Inputs()
    st.caption(
        f"Edit any cell. Add or delete rows of {'Q' if ex.given_qkv else 'X'} to change the tokens. "
        "Each table's toolbar also downloads it. "
        "A new preset or number of heads starts the tables again."
    )
    first = "Q" if ex.given_qkv else "X"  # the table that holds the tokens, one per row
    values = getattr(ex, first)
    prefix = "q" if ex.given_qkv else "x"
    x_frame = pd.DataFrame(values, columns=col_labels(prefix, values.shape[1], n_heads if ex.given_qkv else 1))
    x_frame.insert(0, "token", list(ex.tokens))
    if ex.given_qkv:
        st.markdown("$Q$ (n × d_k), one row per token:")
    edited = data_editor(st, x_frame, key=f"step.edit.{first}.{digest}", num_rows="dynamic", hide_index=True)
    out.tokens = lt.tokens_from_column(edited["token"].tolist()) if "token" in edited else []
    out.parse(first, lambda: lt.matrix_from_frame(edited, first, skip=["token"]))

    def editor(name: str, where: Any, label: str, **kwargs: Any) -> None:
        matrix, rows, cols = matrices[name]
        where.markdown(label)
        frame = data_editor(
            where,
            # "K given": the corner of the input table, apart from the K computed below it
            pd.DataFrame(
                matrix, index=pd.Index(rows, name=ls.latex_name(name) + (" given" * (name in GIVEN))), columns=cols
            ),
            key=f"step.edit.{name}.{digest}",
            **kwargs,
        )
        out.parse(name, lambda: lt.matrix_from_frame(frame, ls.latex_name(name)))

    if ex.given_qkv:
        for column, name in zip(st.columns(2), ("K", "V")):
            editor(name, column, f"${name}$ (n × d_{name.lower() if name == 'V' else 'k'})", num_rows="dynamic")
        if n_heads > 1:
            editor("W_o", st, "$W^O$ (h·d_v × d_model): mixes the concatenated heads back to d_model")
        return out

    for column, name in zip(st.columns(3), W_NAMES):
        editor(name, column, f"${ls.latex_name(name)}$ (d_model × d_{'v' if name == 'W_v' else 'k'})")
    with st.expander(_bias_label(ex), expanded=ex.has_bias):
        for column, name in zip(st.columns(3), B_NAMES):
            editor(name, column, f"${ls.latex_name(name)}$")
    if n_heads > 1:
        editor("W_o", st, "$W^O$ (h·d_v × d_model): mixes the concatenated heads back to d_model")
    return out


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
    }


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


def draw_head_blocks(view: dict[str, np.ndarray], available: set[str], tokens: list[str], head: int) -> None:
    """Head j's Q, K, V: the j-th block of columns of the full Q, K, V."""
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            width = view[letter].shape[1]
            show_matrix(
                f"{part} · head {head}",
                rf"{part}_{head + 1} = \text{{columns {head * width + 1}..{(head + 1) * width} of }} {part}",
                view[letter],
                tokens,
                [f"{letter}{c + 1}" for c in range(width)],
                col_title=letter,
            )


def draw_head(steps: AttentionSteps, available: set[str], tokens: list[str], head: int, f: dict[str, str]) -> None:
    """One head's scores, scaled scores, weights and Z (and its Q, K, V blocks when there are several heads)."""
    h = steps.n_heads
    view = ls.head_matrices(steps, head)
    tag = f" · head {head}" if h > 1 else ""
    sub = f"_{head + 1}" if h > 1 else ""
    if h > 1:
        draw_head_blocks(view, available, tokens, head)
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed for the scores: fix the inputs above."))
        return
    show_matrix(
        f"QKᵀ{tag}",
        f["scores"].replace("Q", f"Q{sub}").replace("K^", f"K{sub}^"),
        view["scores"],
        tokens,
        tokens,
        col_title="key",
        row_title="query",
    )
    show_matrix(
        f"scaled{tag}",
        f["scaled"],
        view["scaled"],
        tokens,
        tokens,
        col_title="key",
        row_title="query",
        caption=f"d_k = {steps.d_k}, so every score is multiplied by 1/√{steps.d_k} = {steps.scale:.4g}."
        + (" Masked cells are −∞ (grey)." if steps.mask is not None else ""),
    )
    show_matrix(
        f"weights{tag}",
        f["weights"],
        view["weights"],
        tokens,
        tokens,
        col_title="key",
        row_title="query",
        domain=(0.0, 1.0),
        caption="Each row sums to 1; a masked cell gets e^−∞ = 0.",
    )
    if "Z" in available:
        show_matrix(
            f"Z{tag}",
            f["z"].replace("Z", f"Z{sub}"),
            view["z"],
            tokens,
            [f"z{c + 1}" for c in range(view["z"].shape[1])],
            col_title="z",
        )
    else:
        st.info(missing("Z", available, "V is needed for Z: fix W^V above."))


def draw_row(url: UrlState, steps: AttentionSteps, available: set[str], tokens: list[str]) -> None:
    """One query row with every number written out."""
    st.subheader("One query row, every number", anchor="row")
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed: fix the inputs above."))
        return
    n = len(tokens)
    left, right = st.columns(2)
    query = left.selectbox(
        "Query token",
        list(range(n)),
        format_func=lambda i: f"{i}: {tokens[i]}",
        key=url.key("query", 0, choices=list(range(n))),
    )
    head = 0
    if steps.n_heads > 1:
        head = right.selectbox(
            "Head",
            list(range(steps.n_heads)),
            format_func=lambda j: f"head {j}",
            key=url.key("qhead", 0, choices=list(range(steps.n_heads))),
        )
    walk = ls.row_walkthrough(steps, tokens, query, head)
    q = ls.head_matrices(steps, head)["q"][query]
    name = tokens[query]
    st.markdown(
        f"q({escape(name)}) = [{', '.join(ls.fmt(x) for x in q)}]. For each key j: the dot product q·k_j, "
        f"divided by √d_k = √{walk.d_k}, then exp, then divided by the sum of the exps."
    )
    numeric = [c for c in walk.keys.columns if c not in ("key", "q·k written out")]
    st.caption(f"Keys for q({escape(name)}):")  # a table's corner is too narrow for this
    frame = walk.keys.set_index(pd.Index(unique_labels(walk.keys["key"]), name="key")).drop(columns="key")
    presenter.table(frame.style.format("{:.4g}", subset=numeric))
    if walk.shift:
        st.caption(
            f"The scores are large, so exp is taken of a − max = a − {ls.fmt(walk.shift)} to avoid overflow; "
            "the weights are unchanged (the factor e^−max cancels in the division)."
        )
    exp_name = "e^{a_j - \\max}" if walk.shift else "e^{a_j}"
    total = ls.tex(walk.exp_sum)
    st.latex(rf"\sum_j {exp_name} = {total},\qquad \alpha_{{{query}j}} = \frac{{{exp_name}}}{{{total}}}")
    if "Z" not in available:
        st.info(missing("Z", available, "V is needed for z: fix W^V above."))
        return
    st.markdown(f"z({escape(name)}) is the weighted sum of the rows of V:")
    terms = " + ".join(f"{ls.tex(w)}\\,v_{{{j}}}" for j, w in enumerate(walk.keys["weight"]))
    st.latex(rf"z_{{{query}}} = {terms} = [{', '.join(ls.tex(x) for x in walk.z)}]")
    contributions = walk.contributions.copy()
    contributions.index = pd.Index(unique_labels(contributions.index), name="weighted V rows")
    presenter.table(contributions.style.format("{:.4g}"))
    downloads.matrix_download(
        walk.contributions.to_numpy(),
        list(walk.contributions.index),
        list(walk.contributions.columns),
        f"attention_row_{query}.csv",
        key="step.csv.row",
    )


def settings(url: UrlState) -> tuple[str, int, str]:
    """(preset, number of heads, edit mode) from the first row of widgets."""
    c = st.columns([2, 1, 2])
    preset = c[0].selectbox(
        "Numbers", list(PRESETS), format_func=PRESETS.get, key=url.key("preset", "example", choices=list(PRESETS))
    )
    n_heads = c[1].number_input(
        "Heads",
        1,
        MAX_HEADS,
        key=int_key(url, "heads", 1, 1, MAX_HEADS),
        help="With h heads, the columns of each W split into h blocks: one head each.",
    )
    mode = c[2].radio(
        "Edit as",
        list(MODES),
        format_func=MODES.get,
        horizontal=True,
        key=url.key("mode", "tables", choices=list(MODES)),
    )
    return preset, int(n_heads), mode


def masks(url: UrlState, tokens: list[str]) -> np.ndarray | None:
    """The causal and padding masks chosen, as one [n, n] boolean mask (None: nothing masked)."""
    st.subheader("Masks", anchor="masks")
    n = len(tokens)
    left, right = st.columns(2)
    causal = left.checkbox("Causal mask (a token sees only itself and earlier tokens)", key=url.key("causal", False))
    pad_key = url.key("pad", [], cast=int_list, choices=range(n))
    padding = right.multiselect(
        "Padding tokens (hidden as keys)", list(range(n)), format_func=lambda i: f"{i}: {tokens[i]}", key=pad_key
    )
    draw_mask_conventions(tokens, padding)
    return ls.build_mask(n, causal, padding)


def draw_mask_conventions(tokens: list[str], padding: list[int]) -> None:
    """The same padding in the conventions students meet: two of them use True for opposite things."""
    c = ls.mask_conventions(len(tokens), padding)
    with st.expander("The padding mask in PyTorch's conventions (True means opposite things)", expanded=bool(padding)):
        frame = pd.DataFrame(
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
        presenter.table(frame)
        st.caption(
            "nn.MultiheadAttention's key_padding_mask marks the padding with True; F.scaled_dot_product_attention's "
            "boolean attn_mask marks what may be attended to with True. Passing one where the other is expected "
            "hides exactly the wrong keys: convert with attn_mask = ~key_padding_mask. The additive form turns "
            "either into 0 / −∞ before the softmax, where e^−∞ = 0."
        )


def draw_qkv(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    st.subheader("Q, K, V", anchor="qkv")
    n_heads = steps.n_heads
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            matrix = getattr(steps, part)
            show_matrix(part, f[part], matrix, tokens, col_labels(letter, matrix.shape[1], n_heads), col_title=letter)
    if n_heads > 1:
        st.latex(
            r"Q = [\,Q_1 \mid Q_2 \mid \dots \mid Q_h\,],\quad Q_j"
            + (r" = XW^Q_j" if "XW" in f["Q"] else "")
            + r" \;\; (\text{the } j\text{-th block of "
            + str(steps.d_k)
            + r" columns; the same for } K, V)"
        )


def draw_heads(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    st.subheader("Scores, scaling, softmax, Z", anchor="softmax")
    if steps.n_heads == 1:
        draw_head(steps, available, tokens, 0, f)
        return
    for j, tab in enumerate(st.tabs([f"Head {j}" for j in range(steps.n_heads)])):
        with tab:
            draw_head(steps, available, tokens, j, f)


def draw_combined(steps: AttentionSteps, available: set[str], tokens: list[str], preset: str) -> None:
    """Several heads: their outputs concatenated, then mixed by W^O."""
    n_heads = steps.n_heads
    st.subheader("Heads together: concat, then W^O")
    d_v = steps.concat.shape[1] // n_heads
    show_matrix(
        "concat",
        r"\operatorname{Concat}(Z_1, \dots, Z_h) = [\,Z_1 \mid \dots \mid Z_h\,]",
        steps.concat,
        tokens,
        col_labels("z", steps.concat.shape[1], n_heads),
        col_title="z",
        caption=f"{n_heads} heads × d_v = {d_v} → {steps.concat.shape[1]} columns.",
    )
    if "output" not in available:
        st.info(missing("output", available, "W^O is needed for the output: fix it above."))
        return
    show_matrix(
        "output",
        r"\text{MultiHead}(X) = \operatorname{Concat}(Z_1, \dots, Z_h)\,W^O",
        steps.output,
        tokens,
        [f"o{c + 1}" for c in range(steps.output.shape[1])],
        col_title="output",
    )
    if preset == "real":
        st.caption("The model also adds a bias b^O here; it is left out of this slice.")


JUMPS = (
    "Jump to: [Q, K, V](#qkv) · [**Scores, scaling, softmax, Z**](#softmax) · [One query row, every number](#row) · "
    "[Masks](#masks)"
)


def page(url: UrlState) -> None:
    preset, n_heads, mode = settings(url)
    preset_example, sig = preset_controls(url, preset, n_heads)
    if preset_example is None:
        return
    st.caption(preset_example.note)
    # The lesson's point is one click away on the first screen: the softmax and Z are below the inputs.
    st.markdown(JUMPS)
    example, sig = link_edits(url, preset_example, sig)

    st.subheader("Inputs")
    inputs = edit_tables(example, sig, n_heads, mode)
    record_edits(url, preset_example, inputs)
    validate(inputs, n_heads, example.given_qkv)
    for message in inputs.errors.values():
        st.error(escape(message))
    steps, available, tokens, mask = run_steps(url, example, inputs, n_heads)
    if steps is None:
        return
    available, overflowed = ls.non_finite(steps, available, tokens)
    for message in overflowed:
        st.error(escape(message))
    if example.given_qkv:
        f = formulas(set(), mask is not None, given=True)
    else:
        b = {name: inputs.values.get(name) for name in B_NAMES}
        f = formulas({name[-1].upper() for name, x in b.items() if x is not None and np.any(x)}, mask is not None)
    draw_qkv(steps, available, tokens, f)
    draw_heads(steps, available, tokens, f)
    if n_heads > 1 and "Z" in available:
        draw_combined(steps, available, tokens, preset)
    draw_row(url, steps, available, tokens)
    draw_pytorch_check(steps, available, tokens, expanded=preset == "sdpa")


def run_steps(
    url: UrlState, example: ls.Example, inputs: Inputs, n_heads: int
) -> tuple[AttentionSteps | None, set[str], list[str], np.ndarray | None]:
    """The masks chosen and the steps the valid inputs allow: (steps or None, what is available, tokens, mask)."""
    v = inputs.values
    first = "Q" if example.given_qkv else "X"
    if example.given_qkv and not any(v.get(name) is not None for name in GIVEN):
        st.info("Q, K and V and the token names are needed for everything below: fix them above.")
        return None, set(), [], None
    if v.get(first) is None and not example.given_qkv:
        st.info("X and the token names are needed for everything below: fix them above.")
        return None, set(), [], None
    if "tokens" in inputs.errors:
        return None, set(), [], None
    tokens = inputs.tokens
    mask = masks(url, tokens)
    if example.given_qkv:
        steps, available = ls.available_from_qkv({n: v.get(n) for n in GIVEN}, v.get("W_o"), mask, n_heads)
        return steps, available, tokens, mask
    W = {name: v.get(name) for name in W_NAMES}
    b = {name: v.get(name) for name in B_NAMES}
    steps, available = ls.available_steps(v["X"], W, b, v.get("W_o"), mask, n_heads)
    if steps is None:
        st.info("At least one of W^Q, W^K, W^V is needed: fix them above.")
    return steps, available, tokens, mask


def draw_pytorch_check(steps: AttentionSteps, available: set[str], tokens: list[str], expanded: bool) -> None:
    """The same Z from PyTorch's F.scaled_dot_product_attention, on the same q, k, v and mask."""
    if "Z" not in available:
        return
    with st.expander("The same with PyTorch: F.scaled_dot_product_attention", expanded=expanded):
        z, diff = ls.torch_sdpa(steps)
        if expanded:
            st.code(ls.SDPA_CODE, language="python")
        st.caption(
            "PyTorch takes q, k, v per head ([h, n, d] tensors) and scales by 1/√d_k itself; a boolean attn_mask "
            "means True = may attend."
        )
        blocks = z if steps.n_heads > 1 else z[None]
        for head, block in enumerate(blocks):
            label = f"PyTorch Z · head {head}" if steps.n_heads > 1 else "PyTorch Z"
            frame = pd.DataFrame(
                block,
                index=pd.Index(unique_labels(tokens), name=label),
                columns=[f"z{c + 1}" for c in range(block.shape[1])],
            )
            presenter.table(frame.style.format("{:.4f}"))
        st.caption(f"Largest difference from Z above: {diff:.1e} (float64 rounding).")


def main() -> None:
    run_page("Attention, step by step", INTRO, "step", page)


main()
