"""'How information flows to the prediction': tformer_core.flow's graph on a page, with a threshold and a click on an
edge that opens its head in the page's attention views.

    flow_panel.draw(url, source, fitted_text, pair, trace, c)   # Text attention, below the attention views

The flow needs the residual stream after every attention and FFN, which the page's cached trace leaves out
(results.views_read): it is its own request, one more pass of the model (Q and K kept, the weights recomputed
from them), cached for the whole server like the trace.
"""

from __future__ import annotations

import streamlit as st

import tformer_core as tc
from tformer_core.flow import Flow, flow_graph, information_flow
from tformer_core.trace import lean
from tformer_views.flow import EDGE_PARAM, flow_chart, strongest_edges
from tformer_views.tokens import display_token, display_tokens

from . import attention_panel, downloads, presenter, results
from .events import clicked_cell
from .markdown import escape
from .page import run_safely
from .url import UrlState
from .widgets import following_choice

MAX_TOKENS = 64  # the per-head split grows as layers x tokens^2 x heads x d_model: SmolLM2 at 64 tokens ~ 1 s
EXPLAINED = (
    "Each layer adds to every position's residual stream: its attention a part per source token (summed over "
    "heads), its FFN one part, and the stream itself is kept. An edge's **share** is how close its part is to the "
    "stream it adds up to (max(0, ‖whole‖₁ − ‖whole − part‖₁), normalised over the parts: Ferrando & Voita 2024, "
    "the LLM Transparency Tool's method), read from one forward pass. Edges above the threshold that lead to the "
    "chosen position are drawn; an edge's colour is the head with the largest share of it. Click an edge to open "
    "that head above. A share is not what removing the edge would change: that takes a patched pass per edge "
    "(Does this head matter?)."
)


def _flow(model: tc.TracedModel, text: str, pair: str | None) -> Flow:
    if isinstance(model, tc.EncoderModel):
        trace = model.trace(text, pair=pair or None, keep=lean)
    elif isinstance(model, tc.CausalLM):
        trace = model.trace(text, keep=lean)
    else:
        raise tc.InputError(
            f"the information flow reads text with an encoder or a decoder-only model, not a {model.kind} model"
        )
    return information_flow(model, trace)


def flow_request(source: str, text: str, pair: str | None) -> results.Request[Flow]:
    """The flow of one text (every layer's shares and top heads), one pass, cached for the whole server."""
    return results.Request.of("flow", _flow, source, text, pair)


def unavailable(model: tc.TracedModel, trace: tc.Trace, max_tokens: int | None = MAX_TOKENS) -> str | None:
    """Why the flow cannot be drawn for this model or input, or None. max_tokens: None where the page's own view
    of the flow stays small whatever the length (the Vision page's class token)."""
    if trace.meta.path != "tformer" or getattr(model.config, "norm", None) not in ("pre", "post"):
        return (
            "The information flow needs the model's own weights (W_O, its norms): this model runs through transformers."
        )
    if max_tokens is not None and len(trace.tokens) > max_tokens:
        return (
            f"The information flow is drawn for inputs of up to {max_tokens} tokens; this one has {len(trace.tokens)}."
        )
    return None


def draw(
    url: UrlState,
    source: str,
    model: tc.TracedModel,
    text: str,
    pair: str | None,
    trace: tc.Trace,
    selected: tuple[int, int],
    prefix: str = "",
    scroll: bool = True,
) -> None:
    """The section: the routes to a chosen position above a threshold, the strongest edges under them. trace: the
    page's pass of `text` (its tokens and predictions); selected: the page's (layer, head), outlined; a click on an
    edge sets the page's layer and head (URL names `prefix`layer, `prefix`head) and, with `scroll`, brings the
    attention views into sight."""
    st.subheader("How information flows to the prediction", anchor="information-flow")
    why_not = unavailable(model, trace)
    if why_not:
        st.caption(escape(why_not))
        return
    # Opened on request: the graph needs a pass of its own (the page's cached trace leaves the residual stream out).
    if not st.toggle("Show the routes from the input tokens to the prediction", key=url.key("flow", False)):
        return
    labels = display_tokens(trace.tokens)
    predicted = trace.meta.predict_position
    default = 0 if predicted is None else predicted % len(labels)
    to, threshold = _controls(url, labels, default)
    flow = run_safely(lambda: results.result(flow_request(source, text, pair), label="Information flow"), "Flow")
    if flow is None:
        return
    graph = flow_graph(flow, float(threshold), int(to))
    said = _prediction(trace, int(to))
    pick_key = f"{url.page}.chart.flow"

    def pick() -> None:
        cell = clicked_edge(st.session_state.get(pick_key))
        if cell is not None:
            attention_panel.select_head(url, prefix, *cell)
            if scroll:
                attention_panel.scroll_to_views(url, prefix)

    screen = presenter.screen_height() if presenter.presenting() else None
    chart = flow_chart(
        graph, labels, trace.n_heads, predicted=said, selected=selected, room=presenter.room(), screen=screen
    )
    if screen is not None:
        chart["usermeta"] = {"scale": presenter.scale()}  # sized for the projector's screen: not enlarged again
    downloads.chart(
        chart, key=pick_key, file_name="information_flow", on_select=url.callback(pick), selection_mode="edge"
    )
    st.caption(EXPLAINED + f" Dashed red: the chosen head's edges (layer {selected[0]}, head {selected[1]}).")
    table = strongest_edges(graph, labels)
    if len(table):
        st.markdown("Strongest attention edges on these routes:")
        st.dataframe(table, hide_index=True)


def _controls(url: UrlState, labels: list[str], default: int) -> tuple[int, float]:
    """(the position the routes lead to, the threshold), side by side."""
    left, right = st.columns([1, 2], vertical_alignment="bottom")
    to = following_choice(
        url,
        "flow_to",
        "Routes to",
        range(len(labels)),
        labels,
        default,
        follow_default=True,
        where=left,
        help="The position whose final residual stream the graph leads to: a decoder's last token (its next-token "
        "prediction), an encoder's [MASK] or its [CLS].",
    )
    threshold = right.slider(
        "Threshold (share of an update)",
        0.0,
        0.5,
        step=0.01,
        key=url.key("flow_threshold", 0.04, lo=0.0, hi=0.5),
        help="Edges whose share of the update they feed is at most this are left out; so is everything that no "
        "longer leads to the chosen position.",
    )
    return int(to), float(threshold)


def clicked_edge(event: object) -> tuple[int, int] | None:
    """(layer, head) of the attention edge a click on the flow chart chose, or None (nothing, or an edge without a
    head)."""
    cell = clicked_cell(event, EDGE_PARAM, ("layer", "head"))
    return cell if cell is not None and cell[1] >= 0 else None


def _prediction(trace: tc.Trace, position: int) -> str:
    """The model's top prediction at `position` as shown above the graph ("" where the model predicts nothing there)."""
    if not trace.has_head or (trace.kind == "encoder" and position not in trace.meta.mask_positions):
        return ""
    label, _ = trace.predictions(1, position)[0]
    return display_token(label)
