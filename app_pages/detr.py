"""DETR: object detection as a set of object queries. Each query's box, its cross-attention over the picture,
and the decoder's self-attention between the queries. Opens on detr-tiny, trained by this project on generated
scenes of shapes (offline); a DETR checkpoint from the hub or the server's model folders when chosen.

Read widgets -> one cached traced pass per picture (results.detr) -> the views
(tformer_views.detection) -> draw.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import streamlit as st

from tformer_app import downloads, models, presenter, results, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_core.bundled import BUNDLED_MODELS, model_card, recorded
from tformer_core.models.base import TracedModel
from tformer_views import detection as dv
from tformer_views.charts.spec import heatmap
from tformer_views.pictures import overlay, to_jpeg

BUNDLED = "detr-tiny"
DEFAULT = BUNDLED
SUGGESTIONS = (BUNDLED, "facebook/detr-resnet-50", "facebook/detr-resnet-101")
INTRO = (
    "DETR reads the picture with a CNN, runs a Transformer encoder over the feature map, and a decoder over a "
    'fixed set of learned object queries: each query ends as one box and one class (or "no object"). Its '
    "cross-attention shows where in the picture a query looked; its self-attention, how the queries share out "
    "the objects."
)
KEY_IDEA = "Each object query ends as one box and one class; its cross-attention shows where it looked."
NEEDS = (
    "This page needs a DETR model: the bundled **detr-tiny** (offline), or a DETR checkpoint "
    "(DetrForObjectDetection) such as **facebook/detr-resnet-50** from the Hugging Face hub when this server is "
    "online (or in its hub cache), or such a folder in this server's model folders (TFORMER_MODEL_DIRS)."
)
PRESENTED_PX = 420  # the two pictures side by side on a 1280 x 720 projector, under the title and two lines


def main() -> None:
    run_page("DETR: detection with object queries", INTRO, "detr", page)


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, picture, threshold, layer, head and query")
    box = settings if settings is not None else contextlib.nullcontext()
    with box:
        source, model = choose_detr(url)
        picked = vision_inputs.choose_image(url, model) if model is not None else None
    if model is None:
        st.info(NEEDS)  # outside the settings: seen on a projector too
        return
    if picked is None:
        return
    name, data = picked
    result = run_safely(lambda: results.result(results.detr(source, data, name)), "Picture")
    if result is None:
        return
    with box:
        threshold = st.slider(
            "Show queries whose class probability is at least",
            0.05,
            0.99,
            key=url.key("threshold", 0.7, lo=0.05, hi=0.99),
        )
        found = dv.detections(result, float(threshold))
        layer, head, query, queries = choose_query(url, result, found)
    presenter.idea(KEY_IDEA)  # presenter mode: on the line below the title, beside the settings
    show_queries(result, found, layer, head, query, queries, presenting=settings is not None)
    if source in BUNDLED_MODELS:
        say_quality(source)


def choose_detr(url: UrlState) -> tuple[str, TracedModel | None]:
    """The model picker (the bundled detr-tiny first); the model, or None with the reason shown."""
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. facebook/detr-resnet-50 or models/my-detr",
        help=f"{BUNDLED} is trained by this project on 64 × 64 scenes of shapes and works offline. A DETR "
        "checkpoint needs its detection heads (DetrForObjectDetection); hub models need the internet the first time.",
    )
    model = models.load_model(source)
    if model is not None and model.kind != "detr":
        st.warning(f"**{escape(source)}** is not a DETR model.")
        model = None
    return source, model


def choose_query(url: UrlState, result: dv.DetrResult, found: list[dv.Detection]) -> tuple[int, Any, int, list[int]]:
    """(decoder layer, head or -1 for their mean, the query whose attention is shown, the queries compared)."""
    L, H = result.trace.layers_in("decoder"), result.trace.heads_in("decoder")
    c1, c2, c3 = st.columns(3)
    layer = c1.selectbox("Decoder layer", list(range(L)), key=url.key("layer", L - 1, choices=list(range(L))))
    head = c2.selectbox(
        "Head",
        [-1, *range(H)],
        format_func=lambda h: "mean of the heads" if h < 0 else str(h),
        key=url.key("head", -1, choices=[-1, *range(H)]),
    )
    queries = [d.query for d in found] or list(range(min(5, result.n_queries)))
    query = c3.selectbox(
        "Object query",
        list(range(result.n_queries)),
        key=url.key("query", queries[0], choices=list(range(result.n_queries))),
    )
    return int(layer), int(head), int(query), queries


def show_queries(
    result: dv.DetrResult,
    found: list[dv.Detection],
    layer: int,
    head: int,
    query: int,
    queries: list[int],
    presenting: bool,
) -> None:
    st.caption(
        f"{len(found)} of {result.n_queries} object queries found an object: "
        + escape(", ".join(f"q{d.query} {d.label} ({d.probability:.2f})" for d in found) or "none")
    )
    width: int | Literal["stretch"] = PRESENTED_PX if presenting else "stretch"
    left, right = st.columns(2)
    left.image(to_jpeg(dv.boxes_picture(result, found, query)), caption="boxes of the queries shown", width=width)
    heat = dv.cross_map(result, query, layer, None if head < 0 else head)
    right.image(
        to_jpeg(overlay(result.image, heat)),
        width=width,
        caption=f"where q{query} looks: its cross-attention in decoder layer {layer}",
    )
    labels = [f"q{q}" for q in queries]
    matrix = dv.query_attention(result, layer, None if head < 0 else head, queries)
    spec = heatmap(
        matrix,
        labels,
        labels,
        f"self-attention between these queries, decoder layer {layer}",
        row_title="query",
        col_title="attends to",
        domain=(0.0, 1.0),
    )
    downloads.chart(spec, "detr.queries", "detr_query_attention")
    st.caption("Rows renormalised over the queries shown (each query attends to all of them).")


def say_quality(name: str) -> None:
    """One line of the bundled model's measured quality (its training run's record), and its model card."""
    figures = recorded(name).get("evaluation")
    if figures is not None:
        st.caption(
            f"**{escape(name)}** was trained by this project on generated 64 × 64 scenes of 1 to 4 shapes. On "
            f"{figures['held_out_scenes']:,} held-out scenes, {figures['precision']:.1%} of its detections "
            f"(probability ≥ {figures['threshold']:g}) cover a shape of their class (IoU ≥ {figures['iou_match']:g}) "
            f"and it finds {figures['recall']:.1%} of the shapes."
        )
    with st.expander("Model card"):
        st.markdown(model_card(name))


main()
