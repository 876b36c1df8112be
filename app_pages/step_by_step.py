"""Attention, step by step: the lecture's worked example, editable.

Read widgets (a preset, the edited tables, masks, heads) -> ask tformer_views.lessons (which runs
tc.attention_steps) -> draw every intermediate as a formula, a table, a heatmap and a CSV.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import ui
from tformer_core.steps import AttentionSteps
from tformer_views.charts.spec import heatmap, unique_labels
from tformer_views.lessons import attention as ls

MODEL = ui.DEFAULT_TEXT_MODEL
PRESETS = {
    "example": "Lecture example (3 tokens)",
    "random": "Random numbers (seeded)",
    "real": f"From a real model ({MODEL})",
}
MODES = {"tables": "Tables", "text": "Text (paste numbers)"}
MAX_HEADS = 4
DEFAULT_SENTENCE = "The cat sat."
W_NAMES = ("W_q", "W_k", "W_v")
B_NAMES = ("b_q", "b_k", "b_v")
LETTER = {"W_q": "q", "W_k": "k", "W_v": "v"}


# ---- widgets backed by the URL ---------------------------------------------------------------------
# ---- drawing ---------------------------------------------------------------------------------------
INTRO = (
    "The lecture's worked example, with every number: X → Q, K, V → QKᵀ → ÷√d_k → softmax → Z. "
    "Edit any table, pick a preset, add masks or heads; the link keeps the view."
)


def show_matrix(
    name: str,
    latex: str | None,
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    caption: str = "",
    col_title: str = "",
    row_title: str = "token",
    domain: tuple[float, float] | None = None,
    diverging: bool = True,
) -> None:
    """A formula, then the numbers as a table (with a CSV download) beside them as a heatmap.

    `name` labels the table's corner (tests find tables by it) and names the files and keys.
    """
    if latex:
        st.latex(latex)
    if caption:
        st.caption(caption)
    rows, cols = unique_labels(rows), [str(c) for c in cols]
    left, right = st.columns([1, 1])
    frame = pd.DataFrame(matrix, index=pd.Index(rows, name=name), columns=cols)
    left.dataframe(frame.style.format("{:.4g}"))
    slug = "".join(ch if ch.isalnum() else "_" for ch in name)
    with left:
        ui.matrix_download(matrix, rows, cols, f"attention_{slug}.csv", key=f"step.csv.{slug}")
    with right:
        chart = heatmap(
            matrix,
            rows,
            cols,
            name,
            row_title=row_title,
            col_title=col_title,
            domain=domain,
            diverging=diverging and domain is None,
        )
        ui.chart(chart, key=f"step.chart.{slug}")


def col_labels(prefix: str, width: int, n_heads: int) -> list[str]:
    """q1, q2, ... for one head; h1·q1, ..., h2·q1, ... for several (the column blocks of each head)."""
    if n_heads == 1 or width % n_heads:
        return [f"{prefix}{c + 1}" for c in range(width)]
    per = width // n_heads
    return [f"h{c // per + 1}·{prefix}{c % per + 1}" for c in range(width)]


# ---- presets ---------------------------------------------------------------------------------------
def preset_controls(url: ui.UrlState, preset: str, n_heads: int) -> tuple[ls.Example | None, tuple]:
    """The preset's own settings; returns its example (None when it cannot be built) and a signature of them."""
    if preset == "example":
        return ls.default_example(n_heads), (preset, n_heads)
    if preset == "random":
        c = st.columns(4)
        seed = c[0].number_input("Seed", 0, 10**6, key=ui.int_key(url, "seed", 0, 0, 10**6))
        n = c[1].number_input("Tokens", 1, ls.MAX_TOKENS, key=ui.int_key(url, "n", 4, 1, ls.MAX_TOKENS))
        d = c[2].number_input("d_model", 1, 16, key=ui.int_key(url, "d", 4, 1, 16))
        k = c[3].number_input("d_k = d_v (per head)", 1, 16, key=ui.int_key(url, "dk", 3, 1, 16))
        return ls.random_example(seed, n, d, k, n_heads), (preset, seed, n, d, k, n_heads)

    sentence = st.text_input(
        "Sentence",
        key=url.key("text", DEFAULT_SENTENCE),
        help=f"Tokenised by {MODEL}, with its [CLS] and [SEP]; at most {ls.MAX_TOKENS} tokens.",
    )
    model = ui.load_model(MODEL)
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
        f"Dims of d_model (of {cfg.d_model})", 1, cfg.d_model, key=ui.int_key(url, "dims", 4, 1, cfg.d_model)
    )
    hdims = c[3].number_input(f"Dims per head (of {d_head})", 1, d_head, key=ui.int_key(url, "hdims", 3, 1, d_head))
    sig = (preset, sentence, layer, head, dims, hdims, n_heads)
    if not sentence.strip():
        st.error("Type a sentence to take X from.")
        return None, sig
    trace = ui.run_safely(lambda: ui.cached("text", MODEL, sentence, None), "Sentence")
    if trace is None:
        return None, sig
    if len(trace.tokens) > ls.MAX_TOKENS:
        st.error(
            f"The sentence has {len(trace.tokens)} tokens with [CLS] and [SEP]; use at most {ls.MAX_TOKENS} "
            "so that every number stays readable."
        )
        return None, sig
    return ui.run_safely(lambda: ls.real_model_example(model, trace, layer, head, dims, hdims, n_heads), "Model"), sig


# ---- inputs ------------------------------------------------------------------------------------------
class Inputs:
    """The parsed tables: each matrix, or None with its message in `errors` (keyed by input name)."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.values: dict[str, np.ndarray | None] = {}
        self.errors: dict[str, str] = {}

    def parse(self, name: str, read: Callable[[], np.ndarray]) -> None:
        try:
            self.values[name] = read()
        except ls.TableError as error:
            self.values[name] = None
            self.errors[name] = str(error)


def edit_tables(ex: ls.Example, sig: tuple, n_heads: int, mode: str) -> Inputs:
    """The editable inputs, started from the preset: data editors, or text areas to paste numbers into."""
    out = Inputs()
    d_model = ex.X.shape[1]
    x_cols = [f"x{c + 1}" for c in range(d_model)]
    digest = hashlib.sha1(repr(sig).encode()).hexdigest()[:10]  # a new preset gives fresh editors
    matrices: dict[str, tuple[np.ndarray, list[str], list[str]]] = {
        name: (getattr(ex, name), x_cols, col_labels(LETTER[name], getattr(ex, name).shape[1], n_heads))
        for name in W_NAMES
    }
    for name in B_NAMES:
        W = getattr(ex, "W_" + name[-1])
        matrices[name] = (
            getattr(ex, name)[None, :],
            [ls.latex_name(name)],
            col_labels(LETTER["W_" + name[-1]], W.shape[1], n_heads),
        )
    matrices["W_o"] = (ex.W_o, col_labels("v", ex.W_o.shape[0], n_heads), [f"o{c + 1}" for c in range(ex.W_o.shape[1])])

    if mode == "text":
        if st.session_state.get("step._text_sig") != digest:
            # Text areas keep what was typed across reruns; a new preset replaces it.
            st.session_state["step.paste.tokens"] = " ".join(ex.tokens)
            st.session_state["step.paste.X"] = ls.format_matrix_text(ex.X)
            for name, (matrix, _, _) in matrices.items():
                st.session_state[f"step.paste.{name}"] = ls.format_matrix_text(matrix)
            st.session_state["step._text_sig"] = digest
        st.caption(
            "One row per line, numbers separated by spaces or commas (brackets are ignored). "
            "A new preset or number of heads starts the text again."
        )
        left, right = st.columns([1, 2])
        out.tokens = ls.parse_tokens(left.text_input("Tokens (separated by spaces)", key="step.paste.tokens"))
        out.parse("X", lambda: ls.parse_matrix_text(right.text_area("X  (n × d_model)", key="step.paste.X"), "X"))
        for column, name in zip(st.columns(3), W_NAMES):
            text = column.text_area(f"{ls.latex_name(name)}  (d_model × d_k)", key=f"step.paste.{name}")
            out.parse(name, lambda text=text, name=name: ls.parse_matrix_text(text, ls.latex_name(name)))
        with st.expander(
            "Biases b^Q, b^K, b^V" + (" (this model has them)" if ex.has_bias else " (all 0 here)"),
            expanded=ex.has_bias,
        ):
            for column, name in zip(st.columns(3), B_NAMES):
                text = column.text_area(ls.latex_name(name), key=f"step.paste.{name}", height=68)
                out.parse(name, lambda text=text, name=name: ls.parse_matrix_text(text, ls.latex_name(name)))
        if n_heads > 1:
            text = st.text_area("W^O  (h·d_v × d_model)", key="step.paste.W_o")
            out.parse("W_o", lambda: ls.parse_matrix_text(text, "W^O"))
        return out

    st.caption(
        "Edit any cell. Add or delete rows of X to change the tokens. Each table's toolbar also downloads it. "
        "A new preset or number of heads starts the tables again."
    )
    x_frame = pd.DataFrame(ex.X, columns=x_cols)
    x_frame.insert(0, "token", list(ex.tokens))
    edited = st.data_editor(x_frame, key=f"step.edit.X.{digest}", num_rows="dynamic", hide_index=True)
    out.tokens = ls.tokens_from_column(edited["token"].tolist()) if "token" in edited else []
    out.parse("X", lambda: ls.matrix_from_frame(edited, "X", skip=["token"]))

    def editor(name: str, where: Any, label: str) -> None:
        matrix, rows, cols = matrices[name]
        where.markdown(label)
        frame = where.data_editor(
            pd.DataFrame(matrix, index=pd.Index(rows, name=ls.latex_name(name)), columns=cols),
            key=f"step.edit.{name}.{digest}",
        )
        out.parse(name, lambda: ls.matrix_from_frame(frame, ls.latex_name(name)))

    for column, name in zip(st.columns(3), W_NAMES):
        editor(name, column, f"${ls.latex_name(name)}$ (d_model × d_{'v' if name == 'W_v' else 'k'})")
    with st.expander(
        "Biases b^Q, b^K, b^V" + (" (this model has them)" if ex.has_bias else " (all 0 here)"), expanded=ex.has_bias
    ):
        for column, name in zip(st.columns(3), B_NAMES):
            editor(name, column, f"${ls.latex_name(name)}$")
    if n_heads > 1:
        editor("W_o", st, "$W^O$ (h·d_v × d_model): mixes the concatenated heads back to d_model")
    return out


def validate(inputs: Inputs, n_heads: int) -> None:
    """Add shape errors (naming both shapes) to the parse errors, and drop the inputs they concern."""
    v = inputs.values
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
def formulas(biased: set[str], masked: bool) -> dict[str, str]:
    """The formula of each step; biased: the letters ("Q", "K", "V") whose bias is not all zero."""

    def b(m: str) -> str:
        return f" + b^{m}" if m in biased else ""

    return {
        "Q": rf"Q = XW^Q{b('Q')}",
        "K": rf"K = XW^K{b('K')}",
        "V": rf"V = XW^V{b('V')}",
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


def draw_head(steps: AttentionSteps, available: set[str], tokens: list[str], head: int, f: dict[str, str]) -> None:
    """One head's scores, scaled scores, weights and Z (and its Q, K, V blocks when there are several heads)."""
    h = steps.n_heads
    view = ls.head_view(steps, head)
    tag = f" · head {head + 1}" if h > 1 else ""
    sub = f"_{head + 1}" if h > 1 else ""
    if h > 1:
        for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
            if part in available:
                width = view[letter].shape[1]
                show_matrix(
                    f"{part}{tag}",
                    rf"{part}{sub} = \text{{columns {head * width + 1}..{(head + 1) * width} of }} {part}",
                    view[letter],
                    tokens,
                    [f"{letter}{c + 1}" for c in range(view[letter].shape[1])],
                    col_title=letter,
                )
    if "scores" not in available:
        st.info("Q and K are needed for the scores: fix the inputs above.")
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
        st.info("V is needed for Z: fix W^V above.")


def draw_row(url: ui.UrlState, steps: AttentionSteps, available: set[str], tokens: list[str]) -> None:
    """One query row with every number written out."""
    st.subheader("One query row, every number")
    if "scores" not in available:
        st.info("Q and K are needed: fix the inputs above.")
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
            format_func=lambda j: f"head {j + 1}",
            key=url.key("qhead", 0, choices=list(range(steps.n_heads))),
        )
    walk = ls.row_walkthrough(steps, tokens, query, head)
    q = ls.head_view(steps, head)["q"][query]
    name = tokens[query]
    st.markdown(
        f"q({name}) = [{', '.join(ls.fmt(x) for x in q)}]. For each key j: the dot product q·k_j, "
        f"divided by √d_k = √{walk.d_k}, then exp, then divided by the sum of the exps."
    )
    numeric = [c for c in walk.keys.columns if c not in ("key", "q·k written out")]
    frame = walk.keys.set_index(pd.Index(unique_labels(walk.keys["key"]), name=f"keys for q({name})")).drop(
        columns="key"
    )
    st.dataframe(frame.style.format("{:.4g}", subset=numeric))
    if walk.shift:
        st.caption(
            f"The scores are large, so exp is taken of a − max = a − {ls.fmt(walk.shift)} to avoid overflow; "
            "the weights are unchanged (the factor e^−max cancels in the division)."
        )
    exp_name = "e^{a_j - \\max}" if walk.shift else "e^{a_j}"
    total = ls.fmt(walk.exp_sum)
    st.latex(rf"\sum_j {exp_name} = {total},\qquad \alpha_{{{query}j}} = \frac{{{exp_name}}}{{{total}}}")
    if "Z" not in available:
        st.info("V is needed for z: fix W^V above.")
        return
    st.markdown(f"z({name}) is the weighted sum of the rows of V:")
    terms = " + ".join(f"{ls.fmt(w)}\\,v_{{{j}}}" for j, w in enumerate(walk.keys["weight"]))
    st.latex(rf"z_{{{query}}} = {terms} = [{', '.join(ls.fmt(x) for x in walk.z)}]")
    contributions = walk.contributions.copy()
    contributions.index = pd.Index(unique_labels(contributions.index), name="weighted V rows")
    st.dataframe(contributions.style.format("{:.4g}"))
    ui.matrix_download(
        walk.contributions.to_numpy(),
        list(walk.contributions.index),
        list(walk.contributions.columns),
        f"attention_row_{query}.csv",
        key="step.csv.row",
    )


def page(url: ui.UrlState) -> None:
    c = st.columns([2, 1, 2])
    preset = c[0].selectbox(
        "Numbers", list(PRESETS), format_func=PRESETS.get, key=url.key("preset", "example", choices=list(PRESETS))
    )
    n_heads = int(
        c[1].number_input(
            "Heads",
            1,
            MAX_HEADS,
            key=ui.int_key(url, "heads", 1, 1, MAX_HEADS),
            help="With h heads, the columns of each W split into h blocks: one head each.",
        )
    )
    mode = c[2].radio(
        "Edit as",
        list(MODES),
        format_func=MODES.get,
        horizontal=True,
        key=url.key("mode", "tables", choices=list(MODES)),
    )
    example, sig = preset_controls(url, preset, n_heads)
    if example is None:
        return
    st.caption(example.note)

    st.subheader("Inputs")
    inputs = edit_tables(example, sig, n_heads, mode)
    validate(inputs, n_heads)
    for message in inputs.errors.values():
        st.error(message)
    v = inputs.values
    X = v.get("X")
    if X is None:
        st.info("X and the token names are needed for everything below: fix them above.")
        return
    tokens = inputs.tokens
    n = len(tokens)

    st.subheader("Masks")
    left, right = st.columns(2)
    causal = left.checkbox("Causal mask (a token sees only itself and earlier tokens)", key=url.key("causal", False))
    pad_key = url.key("pad", [], cast=ui.int_list)
    st.session_state[pad_key] = [p for p in st.session_state[pad_key] if isinstance(p, int) and 0 <= p < n]
    padding = right.multiselect(
        "Padding tokens (hidden as keys)", list(range(n)), format_func=lambda i: f"{i}: {tokens[i]}", key=pad_key
    )
    mask = ls.build_mask(n, causal, padding)

    W = {name: v.get(name) for name in W_NAMES}
    b = {name: v.get(name) for name in B_NAMES}
    steps, available = ls.available_steps(X, W, b, v.get("W_o"), mask, n_heads)
    if steps is None:
        st.info("At least one of W^Q, W^K, W^V is needed: fix them above.")
        return
    f = formulas({name[-1].upper() for name, x in b.items() if x is not None and np.any(x)}, mask is not None)

    st.subheader("Q, K, V")
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            matrix = getattr(steps, part)
            show_matrix(part, f[part], matrix, tokens, col_labels(letter, matrix.shape[1], n_heads), col_title=letter)
    if n_heads > 1:
        st.latex(
            r"Q = [\,Q_1 \mid Q_2 \mid \dots \mid Q_h\,],\quad Q_j = XW^Q_j \;\; (\text{the } j\text{-th block of "
            + str(steps.d_k)
            + r" columns; the same for } K, V)"
        )

    st.subheader("Scores, scaling, softmax, Z")
    if n_heads == 1:
        draw_head(steps, available, tokens, 0, f)
    else:
        for j, tab in enumerate(st.tabs([f"Head {j + 1}" for j in range(n_heads)])):
            with tab:
                draw_head(steps, available, tokens, j, f)

    if n_heads > 1 and "Z" in available:
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
        if "output" in available:
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
        else:
            st.info("W^O is needed for the output: fix it above.")

    draw_row(url, steps, available, tokens)


def main() -> None:
    ui.run_page("Attention, step by step", INTRO, "step", page)


main()
