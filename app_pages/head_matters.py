"""Does this head matter? Every head ablated, each head's direct share of the prediction, the logit lens, and
one head ablated by choice: what attention weights alone cannot tell.

Read widgets -> one cached study per input (caches.head_study_of_*: tformer_views.head_matters) -> draw.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tformer_app import caches, downloads, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_core.interventions import Head
from tformer_views import head_matters as hm
from tformer_views.charts.spec import heatmap
from tformer_views.seq2seq import DEFAULT_SOURCES

DEFAULT = "smollm2"
SUGGESTIONS = ("smollm2", "translator", "vit-tiny", "minilm")
TEXT = "The capital of France is"
PAIR = ("The cat sat on the mat.", "A kitten was sitting on the rug.")
INTRO = (
    "Attention weights show where a head looks, not whether the answer needs it. Here each head is switched off "
    "(its output set to zero) and the prediction measured again; each head's direct share of the winning logit is "
    "read from the residual stream; and the prediction is read after every layer (the logit lens)."
)


def main() -> None:
    run_page("Does this head matter?", INTRO, "heads", page)


def page(url: UrlState) -> None:
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. smollm2, translator, vit-tiny, minilm",
        help="A language model, a translator, a Vision Transformer or a sentence encoder run by tformer's own modules.",
    )
    model = caches.load_model(source)
    if model is None:
        return
    if model.path != "tformer" or model.kind not in ("decoder", "encoder-decoder", "vit", "encoder"):
        st.warning(f"**{escape(source)}** cannot be intervened on here: choose one of {', '.join(SUGGESTIONS)}.")
        return
    with st.spinner("Ablating every head, one batch row each…"):
        study = run_safely(lambda: _study(url, source, model), "Input")
    if study is not None:
        show(url, study)


def _study(url: UrlState, source: str, model) -> hm.HeadStudy | None:
    if model.kind == "decoder":
        text = st.text_input("Text (the model predicts the next token)", key=url.key("text", TEXT))
        return caches.result(caches.head_study_of_text(source, text))
    if model.kind == "encoder-decoder":
        text = st.text_input(
            "Source (the model writes its first target word)", key=url.key("source", DEFAULT_SOURCES.get(source, ""))
        )
        return caches.result(caches.head_study_of_translation(source, text))
    if model.kind == "vit":
        picked = vision_inputs.choose_image(url, model)
        return None if picked is None else caches.result(caches.head_study_of_picture(source, picked[1], picked[0]))
    first = st.text_input("First sentence", key=url.key("first", PAIR[0]))
    second = st.text_input("Second sentence", key=url.key("second", PAIR[1]))
    return caches.result(caches.head_study_of_similarity(source, first, second))


def show(url: UrlState, study: hm.HeadStudy) -> None:
    imp = study.importance
    st.subheader("The prediction")
    st.dataframe(pd.DataFrame(study.prediction, columns=["output", "probability"]), hide_index=True)
    st.caption(
        f"Measured: **{escape(study.what)}** = {imp.clean:.4f}. Every head ablated in {imp.passes} batched "
        f"pass(es), {imp.rows} rows, {imp.seconds:.2f} s."
    )
    stacks = list(imp.effects)
    stack = st.radio("Attention", stacks, horizontal=True, key=url.key("stack", stacks[0], choices=stacks))
    left, right = st.columns(2)
    with left:
        effects = hm.grid(study, stack, "ablation")
        _grid(effects, f"Drop in {study.what} when the head is ablated", f"ablation-{stack}")
    with right:
        if study.attribution is None:
            st.info(f"Direct attribution: {escape(study.note)}")
        else:
            _grid(
                hm.grid(study, stack, "attribution"),
                f"Direct share of the logit of {hm.display_token(study.attribution.label)}",
                f"attr-{stack}",
            )
    _ablate_one(url, study, stack, effects)
    if study.lens is not None:
        st.subheader("The logit lens: the prediction after every layer")
        table = hm.lens_table(study)
        formats = {c: st.column_config.NumberColumn(c, format="%.3g") for c in table.columns if c.startswith("p(")}
        st.dataframe(table, hide_index=True, column_config=formats)
        rank = table.columns[3]
        st.line_chart(table, x="after layer", y=rank)


def _grid(values, title: str, key: str) -> None:
    layers, heads = values.shape
    spec = heatmap(
        values,
        [f"L{i}" for i in range(layers)],
        [f"H{h}" for h in range(heads)],
        title,
        row_title="layer",
        col_title="head",
        diverging=True,
    )
    downloads.chart(spec, key=key)


def _ablate_one(url: UrlState, study: hm.HeadStudy, stack: str, effects) -> None:
    st.subheader("Ablate a head yourself")
    layers, heads = effects.shape
    top = study.importance.ranked()[0][0]
    c1, c2 = st.columns(2)
    layer = c1.selectbox(
        "Layer",
        list(range(layers)),
        key=url.key("layer", top.layer if top.stack == stack else 0, choices=list(range(layers))),
    )
    head = c2.selectbox(
        "Head",
        list(range(heads)),
        key=url.key("head", top.head if top.stack == stack else 0, choices=list(range(heads))),
    )
    value = caches.in_turn(lambda: hm.ablated(study, [Head(stack, int(layer), int(head))]))
    st.metric(
        f"{study.what} with {stack} L{layer} H{head} ablated", f"{value:.4f}", f"{value - study.importance.clean:+.4f}"
    )


main()
