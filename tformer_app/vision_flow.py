"""The Vision page's "How information flows to the class token": tformer_core.flow's shares, every route followed
back from the class token's output (flow_rollout), over the picture before a chosen layer, as bars per layer, and
the strongest attention edges on the routes. Streamlit drawing only; the numbers come from tformer_views.flow.

The flow needs the residual stream after every attention, which the page's cached trace leaves out: it is its own
request (one more pass), opened on request and cached for the whole server, as the Text attention page's graph.
"""

from __future__ import annotations

import functools

import streamlit as st

import tformer_core as tc
from tformer_core.trace import lean
from tformer_views import vision as vv
from tformer_views.flow import ClassTokenFlow, class_token_flow, held_by_layer, held_chart, held_over_patches
from tformer_views.pictures import overlay, to_jpeg

from . import downloads, flow_panel, models, results
from . import vision_inputs as vi
from .logs import log
from .markdown import escape
from .page import part, run_safely
from .url import UrlState

__all__ = ["TITLE", "draw", "flow_request"]

TITLE = "How information flows to the class token"
ABOUT = (
    "The class token's final state is what the classifier reads. Each layer adds to every token's residual "
    "stream: its attention a part per source token, its FFN one part, and the stream itself is kept. Each part "
    "gets a **share** of the update it belongs to (max(0, ‖whole‖₁ − ‖whole − part‖₁), normalised over the parts: "
    "Ferrando & Voita 2024, as on the Text attention page). Following every route back from the class token's "
    "output and multiplying the shares along it says how much of that output sits where before each layer: "
    "attention rollout with these shares in place of the attention weights, the residual among them. What the "
    "biases add has no source, so a little is lost on the way. A share is read from this one pass; it is not "
    "what removing a patch would change."
)


def _picture_flow(model: tc.TracedModel, data: bytes, name: str) -> ClassTokenFlow:
    return class_token_flow(model, vv.trace_picture(model, data, name, keep=lean))


def flow_request(source: str, data: bytes, name: str) -> results.Request[ClassTokenFlow]:
    """The class token's flow for one picture: one pass with the residual stream kept, cached for the server."""
    return results.Request.of("picture_flow", _picture_flow, source, data, name)


def draw(
    url: UrlState, model: tc.TracedModel, picture: results.Request[vv.VisionResult], result: vv.VisionResult
) -> None:
    """The section, folded, computed once its toggle is on: the picture with what each patch holds before the
    chosen layer, the bars per layer, the strongest edges. picture: the page's request for `result`; the part
    keeps only its model's name and reads the picture from the page's widgets when it runs.

    The toggle and what it opens are a part of the page that runs alone (page.part): turning it on or moving the
    layer neither runs nor draws the page's other views again."""
    with st.expander(TITLE):
        st.markdown(ABOUT)
        why_not = flow_panel.unavailable(model, result.trace, max_tokens=None)  # the rollout is small at any size
        if why_not:
            st.caption(escape(why_not))
            return
        # The part holds the model's name, not the picture: a closed tab's part lives as long as its session (two
        # minutes, to be resumed), and a copy of every photo a class uploaded took 5 MB each beyond the budget.
        part(url, functools.partial(_routes, url, picture.source))


def _routes(url: UrlState, source: str) -> None:
    if not st.toggle("Follow the routes to the class token (one more pass)", key=url.key("cls_flow", False)):
        return
    model = run_safely(lambda: models.cached_model(source), "Model")
    chosen = None if model is None else vi.current_picture(url, model)
    if chosen is None:  # the picture has gone since the page drew it (a session resumed after its upload ended)
        log.info("the class token's flow found no picture in the Vision page's widgets")
        st.caption("No picture: choose one above.")
        return
    name, data = chosen
    picture = results.picture(source, data, name)
    flow = run_safely(lambda: results.result(flow_request(source, data, name), label="Information flow"), TITLE)
    if flow is None:
        return
    result = run_safely(lambda: results.result(picture), "Picture")  # the page's own: cached, unless let go since
    if result is None:
        return
    L = (flow.held.shape[0] - 1) // 2
    before = int(
        st.select_slider(
            "Before layer",
            options=list(range(L + 1)),
            key=url.key("cls_flow_before", 0, choices=range(L + 1)),
            format_func=lambda k: f"{k} (the output)" if k == L else ("0 (the input)" if k == 0 else str(k)),
        )
    )
    left, right = st.columns([3, 2])
    grid = held_over_patches(flow.held, before, flow.n_prefix, flow.grid_hw)
    left.image(
        to_jpeg(overlay(result.image, grid, smooth=False)),
        caption=f"Before layer {before}: how much of the class token's output each patch holds (bright = most; "
        f"the patches together {grid.sum():.1%}).",
    )
    with right:
        kept = flow.held[2 * before, 0]
        st.metric("Held by the class token itself", f"{kept:.1%}")
        st.markdown("What the class token reads that carries most of its output:")
        downloads.table(flow.reads.set_index("layer"), key=f"{url.page}.cls_flow_reads")
        st.caption(
            "share: of the class token's update at that layer; carried: what of its output came through the "
            "edge (that share times what the class token's stream after the layer's attention holds)."
        )
    frame = held_by_layer(flow.held, flow.tokens, flow.n_prefix)
    downloads.chart(held_chart(frame), key=f"{url.page}.cls_flow_bars", file_name="class_token_flow")
