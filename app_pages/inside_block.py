"""Inside a block: the residual connections, LayerNorm and the feed-forward network of a real model, one
token at a time, with every number; the residual stream across layers; the lecture's LayerNorm example.

Read widgets (model, input, stack, layer, token) -> one cached trace per input (results.block_text,
block_translation, block_image) -> tformer_views.lessons.block recomputes the chosen token's path through
the block in float64 from the model's weights -> draw each step as formulas, tables, charts and CSV files.
"""

from __future__ import annotations

import contextlib
from typing import Any

import streamlit as st

from tformer_app import block_walk, derived_views, downloads, layer_norm, models, presenter, results
from tformer_app import vision_inputs as vi
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.url import UrlState, int_key
from tformer_app.widgets import choose_model
from tformer_core.models.base import TracedModel
from tformer_core.trace import Trace
from tformer_views import seq2seq as sv
from tformer_views.charts.block import flow_chart, norms_chart
from tformer_views.lessons import block as lb
from tformer_views.vision import VisionResult

SUGGESTIONS = (DEFAULT_TEXT_MODEL, "translator", "vit-tiny", "smollm2", vi.DEFAULT_VIT, "gpt2", "bert-base-uncased")
DEFAULT_SENTENCE = "The cat sat on the mat."
MAX_DIMS = 16
Result = Trace | sv.Translation | VisionResult  # what the cache gives for a sentence, a translation, a picture
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
    model = models.load_model(source)
    if model is not None and model.kind == "vit" and model.preprocessing is None:
        st.error(f"**{escape(source)}** has no image preprocessing (no preprocessor_config.json).")
        return source, None
    return source, model


def read_input(url: UrlState, source: str, model: TracedModel) -> tuple[results.Request[Any], Result] | None:
    """(the cache request, the cached result) for the input the user gives, or None (said on the page)."""
    if model.kind == "vit":
        picked = vi.choose_image(url, model)
        if picked is None:
            return None
        name, data = picked
        key: results.Request[Any] = results.block_image(source, data, name)
    else:
        seq2seq = model.kind == "encoder-decoder"
        label = "Source sentence" if seq2seq else "Sentence"
        default = sv.DEFAULT_SOURCES.get(source, DEFAULT_SENTENCE) if seq2seq else DEFAULT_SENTENCE
        text = st.text_input(label, key=url.key("src" if seq2seq else "text", default))
        if not text.strip():
            st.error(f"Type a {label.lower()}.")
            return None
        key = results.block_translation(source, text) if seq2seq else results.block_text(source, text)
    result = run_safely(lambda: results.result(key), "Input")
    if result is None:
        return None
    if model.kind == "vit":
        st.columns([2, 3])[0].image(
            derived_views.grid_picture(key),
            caption="The picture as the model sees it; token r{row}c{column} is the patch in that row and column.",
        )
    if isinstance(result, sv.Translation):
        st.markdown(
            f"The decoder reads the model's own translation, **{escape(' '.join(result.decoder_tokens))}** "
            "(its start token, then every token it produced), with teacher forcing."
        )
    return key, result


def position(url: UrlState, model: TracedModel, result: Result) -> tuple[str, int, int, int]:
    """(stack, layer, token, dimensions shown) from the row of choosers."""
    trace = derived_views.trace_of(result)
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


# ---- across layers -----------------------------------------------------------------------------------------
def show_across_layers(key: results.Request[Any], stack: str, token: int, layout: lb.BlockLayout) -> None:
    st.header("Across layers: the size of the residual stream")
    norms = run_safely(lambda: derived_views.stream_norms(key, stack), "Norms")
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


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, sentence, layer, token and dimensions")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = choose(url)
        picked = None if model is None else read_input(url, source, model)
        where = None if picked is None or model is None else position(url, model, picked[1])
    if model is not None and picked is not None and where is not None:
        key, result = picked
        stack, layer, token, n_dims = where
        presenter.idea(
            f"Layer {layer}: one token's vector through attention, add & norm, the feed-forward network, add & norm."
        )
        layout = lb.block_layout(model, stack)
        show_flow(model, layout)
        walk = run_safely(lambda: lb.block_walk(model, derived_views.trace_of(result), stack, layer, token), "Block")
        if walk is not None:
            block_walk.show_walk(walk, n_dims)
        show_across_layers(key, stack, token, layout)
    layer_norm.draw(url)


def main() -> None:
    run_page("Inside a block", INTRO, "block", page)


main()
