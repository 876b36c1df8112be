"""Attention, step by step: every intermediate of tc.attention_steps drawn as a formula, a table, a heatmap
and a CSV (Q, K, V; each head's scores, scaling, softmax and Z; concat and W^O; one query row written out; the
padding mask in PyTorch's conventions; the same Z from F.scaled_dot_product_attention). Streamlit drawing only:
the formulas and tables come from tformer_views.lessons (attention, worked_example).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from tformer_core.steps import AttentionSteps
from tformer_views.lessons import attention as ls
from tformer_views.lessons import worked_example as we
from tformer_views.lessons.worked_example import col_labels, missing

from . import downloads, presenter
from .markdown import escape
from .tables import matrix_panel
from .url import UrlState

# A formula, the numbers as a table (its corner says the name) and a heatmap; files "attention_<name>.csv".
show_matrix = partial(matrix_panel, key_prefix="step", file_prefix="attention")
show_square = partial(show_matrix, col_title="key", row_title="query")  # queries by keys


def draw_head_blocks(view: dict[str, np.ndarray], available: set[str], tokens: list[str], head: int) -> None:
    """Head j's Q, K, V: the j-th block of columns of the full Q, K, V."""
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            width = view[letter].shape[1]
            columns = [f"{letter}{c + 1}" for c in range(width)]
            latex = we.block_formula(part, head, width)
            show_matrix(f"{part} · head {head}", latex, view[letter], tokens, columns, col_title=letter)


def draw_head(steps: AttentionSteps, available: set[str], tokens: list[str], head: int, f: dict[str, str]) -> None:
    """One head's scores, scaled scores, weights and Z (and its Q, K, V blocks when there are several heads)."""
    h = steps.n_heads
    view, f = ls.head_matrices(steps, head), we.head_formulas(f, head, h)
    tag = f" · head {head}" if h > 1 else ""
    if h > 1:
        draw_head_blocks(view, available, tokens, head)
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed for the scores: fix the inputs above."))
        return
    show_square(f"QKᵀ{tag}", f["scores"], view["scores"], tokens, tokens)
    masked = " Masked cells are −∞ (grey)." if steps.mask is not None else ""
    scaled = f"d_k = {steps.d_k}, so every score is multiplied by 1/√{steps.d_k} = {steps.scale:.4g}.{masked}"
    show_square(f"scaled{tag}", f["scaled"], view["scaled"], tokens, tokens, caption=scaled)
    weights = "Each row sums to 1; a masked cell gets e^−∞ = 0."
    show_square(f"weights{tag}", f["weights"], view["weights"], tokens, tokens, domain=(0.0, 1.0), caption=weights)
    if "Z" in available:
        columns = [f"z{c + 1}" for c in range(view["z"].shape[1])]
        show_matrix(f"Z{tag}", f["z"], view["z"], tokens, columns, col_title="z")
    else:
        st.info(missing("Z", available, "V is needed for Z: fix W^V above."))


def draw_row(url: UrlState, steps: AttentionSteps, available: set[str], tokens: list[str]) -> None:
    """One query row with every number written out."""
    st.subheader("One query row, every number", anchor="row")
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed: fix the inputs above."))
        return
    rows, heads = list(range(len(tokens))), list(range(steps.n_heads))
    left, right = st.columns(2)
    query = left.selectbox(
        "Query token", rows, format_func=lambda i: f"{i}: {tokens[i]}", key=url.key("query", 0, choices=rows)
    )
    head = 0
    if steps.n_heads > 1:
        head = right.selectbox("Head", heads, format_func=lambda j: f"head {j}", key=url.key("qhead", 0, choices=heads))
    walk = ls.row_walkthrough(steps, tokens, query, head)
    q = ls.head_matrices(steps, head)["q"][query]
    name = tokens[query]
    st.markdown(
        f"q({escape(name)}) = [{', '.join(ls.fmt(x) for x in q)}]. For each key j: the dot product q·k_j, "
        f"divided by √d_k = √{walk.d_k}, then exp, then divided by the sum of the exps."
    )
    keys, numeric, contributions = we.row_tables(walk)
    st.caption(f"Keys for q({escape(name)}):")  # a table's corner is too narrow for this
    presenter.table(keys.style.format("{:.4g}", subset=numeric))
    if walk.shift:
        st.caption(
            f"The scores are large, so exp is taken of a − max = a − {ls.fmt(walk.shift)} to avoid overflow; "
            "the weights are unchanged (the factor e^−max cancels in the division)."
        )
    softmax, z = we.row_formulas(walk)
    st.latex(softmax)
    if "Z" not in available:
        st.info(missing("Z", available, "V is needed for z: fix W^V above."))
        return
    st.markdown(f"z({escape(name)}) is the weighted sum of the rows of V:")
    st.latex(z)
    presenter.table(contributions.style.format("{:.4g}"))
    raw = walk.contributions
    downloads.matrix_download(
        raw.to_numpy(), list(raw.index), list(raw.columns), f"attention_row_{query}.csv", key="step.csv.row"
    )


def draw_mask_conventions(tokens: list[str], padding: list[int]) -> None:
    """The same padding in the conventions students meet: two of them use True for opposite things."""
    with st.expander("The padding mask in PyTorch's conventions (True means opposite things)", expanded=bool(padding)):
        presenter.table(we.mask_conventions_frame(tokens, padding))
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
        st.latex(we.heads_formula(f, steps.d_k))


def draw_heads(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    st.subheader("Scores, scaling, softmax, Z", anchor="softmax")
    if steps.n_heads == 1:
        draw_head(steps, available, tokens, 0, f)
        return
    for j, tab in enumerate(st.tabs([f"Head {j}" for j in range(steps.n_heads)])):
        with tab:
            draw_head(steps, available, tokens, j, f)


def draw_combined(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    """Several heads: their outputs concatenated, then mixed by W^O."""
    n_heads, width = steps.n_heads, steps.concat.shape[1]
    st.subheader("Heads together: concat, then W^O")
    caption = f"{n_heads} heads × d_v = {width // n_heads} → {width} columns."
    columns = col_labels("z", width, n_heads)
    show_matrix("concat", f["concat"], steps.concat, tokens, columns, col_title="z", caption=caption)
    if "output" not in available:
        st.info(missing("output", available, "W^O is needed for the output: fix it above."))
        return
    columns = [f"o{c + 1}" for c in range(steps.output.shape[1])]
    show_matrix("output", f["output"], steps.output, tokens, columns, col_title="output")


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
        for frame in we.sdpa_frames(z, steps.n_heads, tokens):
            presenter.table(frame.style.format("{:.4f}"))
        st.caption(f"Largest difference from Z above: {diff:.1e} (float64 rounding).")
