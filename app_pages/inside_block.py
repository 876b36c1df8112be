"""Inside a block: the residual connections, LayerNorm and the feed-forward network of a real model, one
token at a time, with every number; the residual stream across layers; the lecture's LayerNorm example.

Read widgets (model, input, stack, layer, token) -> one cached trace per input (caches.cached "block_*")
-> tformer_views.lessons.block recomputes the chosen token's path through the block in float64 from
the model's weights -> draw each step as formulas, tables, charts and CSV files.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import caches, downloads
from tformer_app import vision_inputs as vi
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.tables import Inputs, data_editor, matrix_panel
from tformer_app.url import UrlState, finite_float, int_key
from tformer_app.widgets import choose_model
from tformer_core.block_steps import LayerNormSteps, layer_norm_steps, rms_norm_steps
from tformer_core.models.base import TracedModel
from tformer_views import seq2seq as sv
from tformer_views.charts.block import activation_chart, flow_chart, norms_chart
from tformer_views.charts.spec import heatmap
from tformer_views.lessons import block as lb
from tformer_views.lessons import tables as lt
from tformer_views.lessons.attention import fmt

SUGGESTIONS = (DEFAULT_TEXT_MODEL, "translator", "vit-tiny", "smollm2", vi.DEFAULT_VIT, "gpt2", "bert-base-uncased")
DEFAULT_SENTENCE = "The cat sat on the mat."
MAX_DIMS = 16
MAX_KEYS_DRAWN = 40  # more keys than this: the attention row goes to a CSV, not a heatmap
NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm (T5, Llama)"}
PLACEMENT = {
    "post": "post-norm (the original Transformer, BERT): x ← Norm(x + Sublayer(x))",
    "pre": "pre-norm (GPT-2, ViT, T5, Llama): x ← x + Sublayer(Norm(x))",
}

INTRO = (
    "A Transformer layer is more than attention: each sub-layer's output is added to the residual stream "
    "and normalised, and a feed-forward network works on every token. Follow one token through one layer of "
    "a real model, number by number, and see how the stream's size changes from layer to layer."
)


# ---- the model and its input ------------------------------------------------------------------------
def choose(url: UrlState) -> tuple[str, TracedModel | None]:
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT_TEXT_MODEL,
        placeholder="e.g. bert-base-uncased, gpt2 or ./models/my-vit",
        help="MiniLM (BERT-style, post-norm), the bundled translator (encoder and decoder, post-norm), vit-tiny "
        "(pre-norm) and SmolLM2 (Llama-style: pre-norm RMSNorm, SwiGLU; its first load converts its file, about a "
        "minute) work offline; any BERT, GPT-2, ViT/DeiT, Llama, Marian, BART or T5 from the hub.",
    )
    model = caches.load_model(source)
    if model is not None and model.kind == "vit" and model.preprocessing is None:
        st.error(f"**{escape(source)}** has no image preprocessing (no preprocessor_config.json).")
        return source, None
    return source, model


def read_input(url: UrlState, source: str, model: TracedModel) -> tuple[tuple, object] | None:
    """(the cache key, the cached result) for the input the user gives, or None (said on the page)."""
    if model.kind == "vit":
        picked = vi.choose_image(url, model)
        if picked is None:
            return None
        name, data = picked
        key: tuple = ("block_image", source, data, name)
    else:
        seq2seq = model.kind == "encoder-decoder"
        label = "Source sentence" if seq2seq else "Sentence"
        default = sv.DEFAULT_SOURCES.get(source, DEFAULT_SENTENCE) if seq2seq else DEFAULT_SENTENCE
        text = st.text_input(label, key=url.key("src" if seq2seq else "text", default))
        if not text.strip():
            st.error(f"Type a {label.lower()}.")
            return None
        key = ("block_translation" if seq2seq else "block_text", source, text)
    result = run_safely(lambda: caches.cached(*key), "Input")
    if result is None:
        return None
    if model.kind == "vit":
        st.columns([2, 3])[0].image(
            caches.derived("grid_picture", key),
            caption="The picture as the model sees it; token r{row}c{column} is the patch in that row and column.",
        )
    if isinstance(result, sv.Translation):
        st.markdown(
            f"The decoder reads the model's own translation, **{escape(' '.join(result.decoder_tokens))}** "
            "(its start token, then every token it produced), with teacher forcing."
        )
    return key, result


def position(url: UrlState, model: TracedModel, result: object) -> tuple[str, int, int, int]:
    """(stack, layer, token, dimensions shown) from the row of choosers."""
    trace = caches.trace_of(result)
    stacks = lb.stacks_of(model)
    c = st.columns(4 if len(stacks) > 1 else 3)
    stack = stacks[0]
    if len(stacks) > 1:
        stack = c.pop(0).selectbox(
            "Stack",
            list(stacks),
            key=url.key("stack", stacks[0], choices=list(stacks)),
            help="The decoder's blocks have cross-attention: Q from the decoder, K and V from the encoder.",
        )
    n_layers = trace.stack_layers[stack]
    layer = c[0].selectbox("Layer", list(range(n_layers)), key=url.key("layer", 0, choices=list(range(n_layers))))
    labels = lb.token_labels(trace, stack)
    default = 0 if model.kind == "vit" else min(1, len(labels) - 1)
    token = c[1].selectbox(
        "Token",
        list(range(len(labels))),
        format_func=lambda i: f"{i}: {labels[i]}",
        key=url.key("token", default, choices=list(range(len(labels)))),
    )
    dims = c[2].number_input(
        "Dimensions shown",
        1,
        MAX_DIMS,
        key=int_key(url, "dims", 6, 1, MAX_DIMS),
        help="The tables show the first dimensions; every CSV has them all.",
    )
    return stack, int(layer), int(token), int(dims)


# ---- the block as a flow ---------------------------------------------------------------------------
def show_flow(model: TracedModel, layout: lb.BlockLayout) -> None:
    st.header("The block")
    other = "pre" if layout.norm == "post" else "post"
    left, right = st.columns(2)
    with left:
        title = f"This model's {layout.stack} block: {layout.norm}-norm"
        downloads.chart(flow_chart(lb.flow_nodes(layout), title=title), key="block.chart.flow")
    with right:
        downloads.chart(
            flow_chart(lb.flow_nodes(layout, other), title=f"For comparison: {other}-norm", muted=True),
            key="block.chart.flow_other",
        )
        st.markdown(f"**This model** ({escape(model.source)}) is {PLACEMENT[layout.norm]}.")
        st.markdown(f"**The other placement** is {PLACEMENT[other]}.")
        st.caption(
            "Post-norm normalises the sum, so the stream leaving each block has a size set by the norm: deep "
            "stacks train only with a learning-rate warm-up. Pre-norm leaves the residual path untouched (x passes "
            "through every block by addition alone), so nothing bounds the stream's size and a final norm follows "
            "the last block; it trains stably without warm-up, which is why GPT-2, ViT and later models use it."
        )
        ratio = layout.d_ff / layout.d_model
        st.markdown(
            f"d_model = **{layout.d_model}**, d_ff = **{layout.d_ff}** ({ratio:g} × d_model; the paper: "
            f"512 → 2048 → 512), **{layout.n_heads}** heads of d_k = {layout.d_head}, "
            f"{lb.ACTIVATION_NAMES[layout.activation]}, {layout.norm_name} with ε = {layout.eps:g}."
        )


# ---- one token, every number -----------------------------------------------------------------------
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


def show_norm(norm, model_norm: np.ndarray, n_dims: int, key: str, name: str) -> None:
    """One norm of the walk: the lecture's formulas with this token's numbers, then the vectors."""
    d, eps = norm.x.shape[1], lb.tex(norm.eps)
    if isinstance(norm, LayerNormSteps):
        st.latex(
            rf"\mu = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} x_i = {fmt(norm.mean[0])},\qquad "
            rf"\sigma^2 = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} (x_i-\mu)^2 = {fmt(norm.var[0])},\qquad d = {d}"
        )
        st.latex(
            rf"\hat x_i = \frac{{x_i-\mu}}{{\sqrt{{\sigma^2+\varepsilon}}}},\ \ \sqrt{{\sigma^2+\varepsilon}} = "
            rf"{fmt(norm.std[0])}\ (\varepsilon = {eps}),\qquad y_i = \gamma_i\,\hat x_i + \beta_i"
        )
    else:
        st.latex(
            rf"\mathrm{{RMS}}(x) = \sqrt{{\frac{{1}}{{d}}\sum_{{i=1}}^{{d}} x_i^2 + \varepsilon}} = {fmt(norm.rms[0])},"
            rf"\qquad y_i = \gamma_i\,\frac{{x_i}}{{\mathrm{{RMS}}(x)}}\qquad (d = {d},\ \varepsilon = {eps})"
        )
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
        top = np.argsort(-row.weights, axis=1, kind="stable")[:, :5]  # [heads, 5]
        cells = [[f"{row.keys[j]} ({row.weights[h, j]:.3f})" for j in top[h]] for h in range(len(heads))]
        frame = pd.DataFrame(cells, index=pd.Index(heads, name="strongest keys"), columns=[1, 2, 3, 4, 5])
        st.dataframe(frame)
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
        show_ffn(sub, layout, n_dims, i)
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


def show_ffn(sub: lb.SubLayerWalk, layout: lb.BlockLayout, n_dims: int, i: int) -> None:
    ffn = sub.ffn
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


# ---- across layers -----------------------------------------------------------------------------------------
def show_across_layers(key: tuple, stack: str, token: int, layout: lb.BlockLayout) -> None:
    st.header("Across layers: the size of the residual stream")
    norms = run_safely(lambda: caches.derived("stream_norms", key, stack), "Norms")
    if norms is None:
        return
    label = norms.tokens[token]
    downloads.chart(
        norms_chart(norms.frame(token), title=f"‖v‖ per {stack} layer: token {token} ({label}) and the mean"),
        key="block.chart.norms",
    )
    first = float(norms.values["resid_pre"][0].mean())
    outputs = norms.values["resid_post"].mean(axis=1)
    if layout.norm == "post":
        st.caption(
            f"Post-norm: the stream leaving each block is a {layout.norm_name} output, so its size is set by that "
            f"norm's γ and β (here between {outputs.min():.3g} and {outputs.max():.3g}, mean over tokens); what "
            "attention and the FFN add is measured before that norm."
        )
    else:
        st.caption(
            "Pre-norm: nothing normalises the stream itself; each sub-layer reads a normalised copy and adds its "
            f"output to the stream, so its size is whatever those additions make it: here {first:.3g} entering "
            f"layer 0 and {outputs[-1]:.3g} leaving the last layer (mean over tokens)."
        )
    table = norms.table(token)
    downloads.table(table, key="block.table.norms")
    downloads.matrix_download(
        table.to_numpy(), [str(i) for i in table.index], list(table.columns), "block_norms.csv", key="block.csv.norms"
    )


# ---- the lecture's LayerNorm example -------------------------------------------------------------------------
def layer_norm_example(url: UrlState) -> None:
    st.header("LayerNorm by hand")
    c = st.columns(3)
    kind = c[0].radio(
        "Norm",
        list(NORMS),
        format_func=NORMS.get,
        horizontal=True,
        key=url.key("lnorm", "layernorm", choices=list(NORMS)),
    )
    eps = c[1].number_input("ε", key=url.key("eps", lb.EXAMPLE_EPS, cast=finite_float), format="%g", step=1e-5)
    dims = c[2].number_input("Dimensions d", 1, 8, key=int_key(url, "lnd", 4, 1, 8))
    st.caption(
        "Small whole numbers whose μ and σ² come out whole, so every step can be checked by hand. Edit any cell, "
        "add or delete tokens, change ε or the number of dimensions; the real model above uses the same formulas."
    )
    inputs = edit_norm_tables(int(dims))
    for message in inputs.errors.values():
        st.error(escape(message))
    X, params = inputs.values.get("X"), inputs.values.get("params")
    if eps <= 0:
        st.error(f"ε must be greater than 0 (it keeps the division away from 0 when every x_i is equal); got {eps:g}.")
        return
    if X is None or params is None:
        st.info("Fix the tables above to see the steps.")
        return
    gamma, beta = params[0], params[1]
    norm = layer_norm_steps(X, gamma, beta, eps) if kind == "layernorm" else rms_norm_steps(X, gamma, eps)
    show_norm_example(url, norm, inputs.tokens)


def edit_norm_tables(d: int) -> Inputs:
    """X (one row per token) and γ, β, as editable tables started from the lecture's numbers."""
    X = np.zeros((len(lb.EXAMPLE_TOKENS), d))
    k = min(d, lb.EXAMPLE_X.shape[1])
    X[:, :k] = lb.EXAMPLE_X[:, :k]
    params = np.vstack([np.ones(d), np.zeros(d)])
    params[0, :k], params[1, :k] = lb.EXAMPLE_GAMMA[:k], lb.EXAMPLE_BETA[:k]
    digest = hashlib.sha1(repr(d).encode()).hexdigest()[:8]
    cols = lb.dims_labels(d)
    out = Inputs()
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**x**: one row per token (add or delete rows)")
        frame = pd.DataFrame(X, columns=cols)
        frame.insert(0, "token", list(lb.EXAMPLE_TOKENS))
        edited = data_editor(st, frame, key=f"block.ln.X.{digest}", num_rows="dynamic", hide_index=True)
    with right:
        st.markdown("**γ** (scale) and **β** (shift), one per dimension")
        p = data_editor(
            st,
            pd.DataFrame(params, index=pd.Index(["γ", "β"], name="parameter"), columns=cols),
            key=f"block.ln.p.{digest}",
        )
    out.tokens = lt.tokens_from_column(edited["token"].tolist()) if "token" in edited else []
    out.parse("X", lambda: lt.matrix_from_frame(edited, "x", skip=["token"]))
    out.parse("params", lambda: lt.matrix_from_frame(p, "γ, β"))
    return out


def show_norm_example(url: UrlState, norm, tokens: list[str]) -> None:
    n, d = norm.x.shape
    summary = lb.norm_summary(norm, tokens)
    downloads.table(summary, key="block.table.ln_summary")
    cols = lb.dims_labels(d)
    if isinstance(norm, LayerNormSteps):
        matrix_panel(
            "x̂",
            r"\hat x_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \varepsilon}}",
            norm.normalized,
            tokens,
            cols,
            key_prefix="block.ln",
        )
    else:
        matrix_panel(
            "x̂", r"\hat x_i = \frac{x_i}{\mathrm{RMS}(x)}", norm.normalized, tokens, cols, key_prefix="block.ln"
        )
    formula = r"y_i = \gamma_i\,\hat x_i + \beta_i" if isinstance(norm, LayerNormSteps) else r"y_i = \gamma_i\,\hat x_i"
    matrix_panel("y", formula, norm.output, tokens, cols, key_prefix="block.ln")
    row = st.selectbox(
        "Token, every number",
        list(range(n)),
        format_func=lambda i: f"{i}: {tokens[i]}",
        key=url.key("lnrow", 0, choices=list(range(n))),
    )
    x, eps = norm.x[row], lb.tex(norm.eps)
    if isinstance(norm, LayerNormSteps):
        st.latex(lb.written_mean(x))
        st.latex(lb.written_variance(x))
        st.latex(
            rf"\hat x = \frac{{x - {fmt(norm.mean[row])}}}{{\sqrt{{{fmt(norm.var[row])} + {eps}}}}} = "
            rf"[{', '.join(fmt(v) for v in norm.normalized[row])}]"
        )
    else:
        st.latex(lb.written_rms(x, norm.eps))
    st.latex(lb.written_output(norm, row))


def page(url: UrlState) -> None:
    source, model = choose(url)
    if model is not None:
        picked = read_input(url, source, model)
        if picked is not None:
            key, result = picked
            stack, layer, token, n_dims = position(url, model, result)
            layout = lb.block_layout(model, stack)
            show_flow(model, layout)
            walk = run_safely(lambda: lb.block_walk(model, caches.trace_of(result), stack, layer, token), "Block")
            if walk is not None:
                show_walk(walk, n_dims)
            show_across_layers(key, stack, token, layout)
    layer_norm_example(url)


def main() -> None:
    run_page("Inside a block", INTRO, "block", page)


main()
