"""DETR: object detection as a set of object queries. Each query's box, its cross-attention over the picture,
and the decoder's self-attention between the queries.

Read widgets -> one cached traced pass per picture (caches.detr) -> the views
(tformer_views.detection) -> draw.
"""

from __future__ import annotations

import streamlit as st

from tformer_app import caches, downloads, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_views import detection as dv
from tformer_views.charts.spec import heatmap
from tformer_views.pictures import overlay, to_jpeg

DEFAULT = "facebook/detr-resnet-50"
SUGGESTIONS = (DEFAULT, "facebook/detr-resnet-101")
INTRO = (
    "DETR reads the picture with a CNN, runs a Transformer encoder over the feature map, and a decoder over a "
    'fixed set of learned object queries: each query ends as one box and one class (or "no object"). Its '
    "cross-attention shows where in the picture a query looked; its self-attention, how the queries share out "
    "the objects."
)
NEEDS = (
    "This page needs a DETR checkpoint (DetrForObjectDetection): **facebook/detr-resnet-50** from the Hugging "
    "Face hub when this server is online (or in its hub cache), or such a folder in this server's model folders "
    "(TFORMER_MODEL_DIRS)."
)


def main() -> None:
    run_page("DETR: detection with object queries", INTRO, "detr", page)


def page(url: UrlState) -> None:
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. facebook/detr-resnet-50 or models/my-detr",
        help="A DETR checkpoint with its detection heads (DetrForObjectDetection).",
    )
    model = caches.load_model(source)
    if model is not None and model.kind != "detr":
        st.warning(f"**{escape(source)}** is not a DETR model.")
        model = None
    if model is None:
        st.info(NEEDS)
        return
    picked = vision_inputs.choose_image(url, model)
    if picked is None:
        return
    name, data = picked
    result = run_safely(lambda: caches.result(caches.detr(source, data, name)), "Picture")
    if result is None:
        return
    threshold = st.slider(
        "Show queries whose class probability is at least", 0.05, 0.99, key=url.key("threshold", 0.7, lo=0.05, hi=0.99)
    )
    found = dv.detections(result, float(threshold))
    show_queries(url, result, found)


def show_queries(url: UrlState, result: dv.DetrResult, found: list[dv.Detection]) -> None:
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
    st.caption(
        f"{len(found)} of {result.n_queries} object queries found an object: "
        + escape(", ".join(f"q{d.query} {d.label} ({d.probability:.2f})" for d in found) or "none")
    )
    left, right = st.columns(2)
    left.image(to_jpeg(dv.boxes_picture(result, found, query)), caption="boxes of the queries shown", width="stretch")
    heat = dv.cross_map(result, query, layer, None if head < 0 else head)
    right.image(
        to_jpeg(overlay(result.image, heat)),
        width="stretch",
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


main()
