"""Inside a block's walk of one token through one layer, every number drawn: the block's input, each sub-layer
(its norm, the attention row or the feed-forward network, the residual sum) and the check against the model's
own next-layer input. Streamlit drawing only: the numbers come from tformer_views.lessons.block (float64,
recomputed from the model's weights).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from tformer_core.block_steps import FFNSteps, LayerNormSteps, RMSNormSteps
from tformer_views.charts.block import activation_chart
from tformer_views.charts.spec import heatmap
from tformer_views.lessons import block as lb

from . import downloads
from .markdown import escape

MAX_KEYS_DRAWN = 40  # more keys than this: the attention row goes to a CSV, not a heatmap


def vectors(name: str, rows: dict[str, np.ndarray], n_dims: int, key: str) -> None:
    """Named vectors as table rows (first n_dims components), with every component in a CSV."""
    frame = lb.vectors_frame(rows, n_dims, corner=name)
    styled = frame.style.format("{:.4f}")
    if "difference" in frame.index:  # float32 rounding: 1e-7, not 0.0000
        styled = styled.format("{:.1e}", subset=pd.IndexSlice[["difference"], :])
    st.dataframe(styled, key=f"block.table.{key}")
    full = lb.vectors_frame(rows)
    downloads.matrix_download(
        full.to_numpy(), list(full.index), list(full.columns), f"block_{key}.csv", key=f"block.csv.{key}"
    )


def show_norm(norm: LayerNormSteps | RMSNormSteps, model_norm: np.ndarray, n_dims: int, key: str, name: str) -> None:
    """One norm of the walk: the lecture's formulas with this token's numbers, then the vectors."""
    for formula in lb.norm_formulas(norm):
        st.latex(formula)
    vectors(name, lb.norm_rows(norm, model_norm), n_dims, key)
    gap = float(np.max(np.abs(norm.output[0] - model_norm)))
    st.caption(f"γ and β are the model's own (learned). Largest difference from the model's output: {gap:.1e}.")


def show_attention_row(sub: lb.SubLayerWalk, token_label: str, key: str) -> None:
    row = sub.attention
    if row is None:
        st.caption(
            "This model's attention (rotary positions, grouped K and V heads or norms on q and k) is not "
            "written out here: its output is read from the model's trace."
        )
        return
    st.markdown(
        f"Q from **{escape(row.queries_from)}**; K and V from **{escape(row.keys_from)}**. "
        f"The weights of {escape(token_label)}, per head:"
    )
    heads = [f"head {h}" for h in range(row.weights.shape[0])]
    visible = row.visible
    if len(visible) <= MAX_KEYS_DRAWN:
        title = f"{sub.title} weights of {token_label}"
        keys = [row.keys[j] for j in visible]
        chart = heatmap(row.weights[:, visible], heads, keys, title, row_title="head", col_title="key", domain=(0, 1))
        downloads.chart(chart, key=f"block.chart.{key}")
        if len(visible) < len(row.keys):
            st.caption(f"The {len(row.keys) - len(visible)} masked keys (weight 0) are left out of the picture.")
    else:
        st.dataframe(lb.strongest_keys(row))
        st.caption(f"{len(visible)} keys: too many to draw; each head's five strongest, and every weight in the CSV.")
    downloads.matrix_download(row.weights, heads, list(row.keys), f"block_{key}_weights.csv", key=f"block.csv.{key}w")


def show_sublayer(walk: lb.BlockWalk, i: int, sub: lb.SubLayerWalk, n_dims: int) -> None:
    """Sub-layer i with its residual connection and norm, in the order the model computes them."""
    layout, norm_name = walk.layout, walk.layout.norm_name
    pre = layout.norm == "pre"
    if not pre:
        st.subheader(f"{i + 1}. The {sub.title}, Add & Norm")
    if pre:
        st.subheader(f"{i + 1}. {norm_name}, the {sub.title}, Add")
        show_norm(sub.norm, sub.model_norm, n_dims, f"norm{i}", f"{norm_name} {i + 1}")
    if sub.ffn is not None:
        show_ffn(sub.ffn, layout, n_dims, i)
    else:
        show_attention_row(sub, walk.token_label, f"attn{i}")
    what = "FFN(x)" if sub.part == "mlp" else f"{sub.title} output"
    st.markdown(f"**Add**: the residual connection adds the {what} to the stream that entered this sub-layer.")
    rows = {"stream in x": sub.stream_in, f"{what}": sub.out, "x + " + what: sub.total}
    vectors(f"residual {i + 1}", rows, n_dims, f"sum{i}")
    model_name = f"{layout.stack}.{walk.layer}.{lb.TRACE_PARTS[sub.part][0]}"
    st.caption(
        f"The {what} recomputed here (float64, from the model's weights) against the model's `{model_name}`: "
        f"largest difference {sub.out_difference:.1e}."
    )
    if not pre:
        st.markdown(f"**Norm**: {norm_name} of the sum.")
        show_norm(sub.norm, sub.model_norm, n_dims, f"norm{i}", f"{norm_name} {i + 1}")


def show_ffn(ffn: FFNSteps, layout: lb.BlockLayout, n_dims: int, i: int) -> None:
    act = lb.ACTIVATION_NAMES[layout.activation]
    d, d_ff = layout.d_model, layout.d_ff
    st.latex(lb.ffn_formula(layout))
    active = int(ffn.active[0])
    what = "gate units" if layout.gated else "hidden units"
    st.markdown(
        f"The same matrices for every token: {d} → **{d_ff}** hidden units → {d} (the paper: 512 → 2048 → "
        f"512). For this token **{active} of {d_ff}** {what} ({active / d_ff:.0%}) get a positive input"
        + (
            " and pass ReLU; the rest are 0."
            if layout.activation == "relu"
            else f"; {act} lets small negatives through."
        )
    )
    rows = lb.ffn_rows(ffn, layout.activation)
    k = min(n_dims, d_ff)
    frame = pd.DataFrame(
        np.vstack([v[:k] for v in rows.values()]),
        index=pd.Index(list(rows), name="hidden layer"),
        columns=lb.dims_labels(k, "h"),
    )
    downloads.table(frame, key=f"block.table.hidden{i}")
    full = np.vstack(list(rows.values()))
    downloads.matrix_download(full, list(rows), lb.dims_labels(d_ff, "h"), "block_ffn_hidden.csv", key="block.csv.hid")
    into = ffn.gate[0] if ffn.gate is not None else ffn.hidden_pre[0]
    title = f"The {d_ff} {what} of this token"
    downloads.chart(activation_chart(into, ffn.activated[0], act, title=title), key="block.chart.activation")


def show_check(walk: lb.BlockWalk, n_dims: int) -> None:
    st.subheader("The check: the model's own next-layer input")
    last = walk.layer == walk.n_layers - 1
    where = "the block's output (this is the last layer)" if last else f"layer {walk.layer + 1}'s input"
    st.markdown(
        f"Recomposed from the block's input, step by step, in float64: compared with {where}, "
        f"`{walk.reference_name}` in the model's trace (float32)."
    )
    rows = {"recomposed": walk.output, "the model's": walk.reference, "difference": walk.difference}
    vectors("check", rows, n_dims, "check")
    st.metric("Largest difference over all dimensions", f"{walk.max_difference:.1e}")
    st.caption(
        f"Relative to the stream's largest component: {walk.relative_difference:.1e}: the rounding of float32 "
        "arithmetic, not a different computation."
    )
    every = lb.walk_vectors(walk)
    frame = lb.vectors_frame(every)
    downloads.matrix_download(
        frame.to_numpy(),
        list(frame.index),
        list(frame.columns),
        "block_walk.csv",
        "Every vector of this walk (CSV)",
        key="block.csv.walk",
    )


def show_walk(walk: lb.BlockWalk, n_dims: int) -> None:
    layout = walk.layout
    st.header(f"Token {walk.token} ({escape(walk.token_label)}) through {layout.stack} layer {walk.layer}")
    st.caption(
        f"The first {min(n_dims, layout.d_model)} of {layout.d_model} dimensions (x₁ … x_d, numbered from 1 as in "
        "the lecture). x is what enters the block: the model's own residual stream."
    )
    vectors("block input", {"x": walk.x}, n_dims, "input")
    for i, sub in enumerate(walk.sublayers):
        show_sublayer(walk, i, sub, n_dims)
    show_check(walk, n_dims)
