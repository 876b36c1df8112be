"""Text attention's "why does attention look at nothing?": attention sinks and massive activations, drawn in an
expander below the views, with a knockout (one activation set to its layer's median, or attention to the first
token blocked from a layer on) and the prediction before and after.

The expander runs its content only while it is open (Streamlit's lazy expander): a page that never opens it
computes nothing for it. The shares and ratios come from the page's cached trace, once for it (derived_views.sinks:
not again on every rerun while the expander is open); a knockout is one pass (the cached trace is the one before),
cached per (model, text, knockout) for the whole server in the results cache.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

import streamlit as st

import tformer_core as tc
from tformer_core import sinks
from tformer_views import sinks as sv
from tformer_views.tokens import display_token

from . import derived_views, downloads, presenter, results
from .markdown import escape
from .page import run_safely
from .url import UrlState

__all__ = ["EXPANDER", "INTRO", "KNOCKOUTS", "LINKED", "draw", "knockout"]

EXPANDER = "Attention sinks and massive activations: why does attention look at nothing?"
INTRO = (
    "Each row of attention weights must sum to 1, so a head with nothing useful to read still puts its weight "
    "somewhere. Language models learn to park it on the **first token**, whatever that token is (Xiao et al. "
    "2023, *attention sinks*), or on [CLS] and [SEP] in BERT. The first token's value vectors are small, so "
    "the weight there adds little: the head is, in effect, switched off. Beside the sinks sit **massive "
    "activations** (Sun et al. 2024): a few numbers of the residual stream, at the first token and in fixed "
    "dimensions, a thousand times the median, that every later layer reads as a fixed bias."
)
GRID_SHARE = 0.4  # of the main column, beside the per-layer bars
GRID_HEIGHT_PX = 420  # the grid's cells, all layers together (SmolLM2's 30 rows of 14 px)
GRID_MARGIN_PX = 150  # beside the grid's cells: the layer labels, the axis title, the colour legend
LINKED = ("sink_ko", "sink_layer", "sink_from")  # the expander's settings a link carries
KNOCKOUTS = {
    "activation": "Set one activation to its layer's median",
    "block": "Block attention to the first token from a layer on",
}


def _knock_out(
    model: tc.TracedModel, text: str, how: str, layer: int, position: int, dim: int, held: tc.Trace | None = None
) -> sinks.Knockout:
    """One knockout of `text`: "activation" sets [position, dim] entering `layer` to the layer's median; "block"
    blocks attention to the first token in `layer` and every later one. Two passes, or one with `held` (the page's
    cached trace of `text`, which holds what the first pass would give)."""
    if not isinstance(model, (tc.EncoderModel, tc.CausalLM)):
        raise tc.InputError(f"knockouts read text with an encoder or a decoder-only model, not a {model.kind} model")
    if how == "activation":
        return sinks.knock_out_activation(model, text, (layer, position, dim), held=held)
    return sinks.block_sink(model, text, from_layer=layer, held=held)


def knockout(
    source: str, text: str, how: str, layer: int, position: int = 0, dim: int = 0
) -> results.Request[sinks.Knockout]:
    """The results cache's request of one knockout: computed once per (model, text, knockout) for the server."""
    return results.Request.of("sinks_knockout", _knock_out, source, text, how, int(layer), int(position), int(dim))


def draw(url: UrlState, key: results.Request[tc.Trace], text: str, pair: str | None) -> None:
    """The expander, below the page's views, for the trace `key` caches; its content runs only while it is open."""
    linked = any(name in (url.incoming or {}) for name in LINKED)  # a link with its settings opens it, and reads them
    opened = f"{url.page}.sinks_open"
    if linked and opened not in st.session_state:
        st.session_state[opened] = True
    # `expanded` stays constant: Streamlit counts it in a stateful expander's identity, so a value that changed once
    # the link was read (the browser's next run) made a new expander, closed, and the link's settings were lost.
    box = st.expander(EXPANDER, key=opened, on_change="rerun")
    if not box.open:
        return
    with box:
        st.markdown(INTRO)
        view = run_safely(lambda: derived_views.sinks(key), "Attention sinks")
        if view is None:
            return
        st.markdown(f"**{escape(sv.summary(view))}**")
        _shares(view)
        _activations(view)
        _knockout(url, key, view, text, pair)


def _shares(view: sv.SinksView) -> None:
    layers, heads = view.shares[0].share.shape
    beside = not presenter.presenting()  # on a projector each chart takes the whole width, one under the other
    share = GRID_SHARE if beside else 1.0
    left, right = st.columns([GRID_SHARE, 1 - GRID_SHARE]) if beside else (st.container(), st.container())
    with left:
        # Rows of at least 12 px (every layer's label shows), at most 30; columns as wide as the column allows.
        scale = presenter.scale()
        cell = int(max(12, min(30 * scale, GRID_HEIGHT_PX * scale // max(layers, 1))))
        width = int(max(12, min(40 * scale, (presenter.room() * share - GRID_MARGIN_PX * scale) // heads)))
        grid = sv.share_grid(view.shares[0], cell=cell, cell_width=width)
        grid["usermeta"] = {"scale": scale}  # sized for presenter mode already: chart_fonts must not enlarge it
        downloads.chart(grid, key="sinks.chart.grid")
    with right:
        plot = int(presenter.room() * (1 - share if beside else 1.0)) - 150  # less its axes and legend
        downloads.chart(sv.per_layer_chart(view.shares, width=max(plot, 240)), key="sinks.chart.layers")
    st.caption(
        "Each cell: the mean, over the queries, of the weight a head puts on the first token. The first query of a "
        "decoder-only model is left out: it can see only itself, so its 1.0 there is no choice."
    )


def _activations(view: sv.SinksView) -> None:
    if view.activations is None:
        st.caption(f"Massive activations: {escape(view.missing)}")
        return
    downloads.chart(sv.activation_chart(view, width=int(560 * presenter.scale())), key="sinks.chart.activations")
    table = sv.activation_table(view)
    massive = table[table["massive"]]
    if len(massive):
        with st.popover(f"The {len(massive)} massive activations"):
            downloads.table(massive.drop(columns="massive"), digits=1, key="sinks.table.massive")
    st.caption(
        f"Massive: |x| ≥ {sinks.MASSIVE_ABS:,.0f} and ≥ {sinks.MASSIVE_RATIO:,.0f}× the median |x| of its layer, as "
        "Sun et al. (2024) count them. Each bar is the residual stream entering that layer."
    )


def _first_massive(view: sv.SinksView) -> int:
    """The layer whose largest activation is the one to knock out: the first massive one (where it appears;
    later layers carry it on), else the largest ratio."""
    big = view.activations
    if big is None:
        return 0
    massive = [layer for layer, is_massive in enumerate(big.massive) if is_massive]
    return massive[0] if massive else int(big.ratio.argmax())


def _choices(view: sv.SinksView) -> Sequence[str]:
    return list(KNOCKOUTS) if view.activations is not None else ["block"]


def _knockout(url: UrlState, key: results.Request[tc.Trace], view: sv.SinksView, text: str, pair: str | None) -> None:
    source = key.source
    st.markdown("**Knock it out: a real forward pass with the sink removed**")
    if pair:
        st.caption("The knockouts read one text: clear the second segment to run them.")
        return
    choices = _choices(view)
    how = st.radio("Knockout", choices, key=url.key("sink_ko", choices[0], choices=choices), format_func=KNOCKOUTS.get)
    n_layers = len(view.shares[0].per_layer)
    if how == "activation" and view.activations is not None:
        layer = st.selectbox(
            "Activation",
            range(n_layers),
            key=url.key("sink_layer", _first_massive(view), lo=0, hi=n_layers - 1),
            format_func=lambda layer: _activation_label(view, layer),
        )
        top = view.activations.top[int(layer)][0]
        request = knockout(source, text, how, top.layer, top.position, top.dim)
    else:
        sinking = view.shares[0].sink_layers()
        layer = st.slider(
            "From layer", 0, n_layers - 1, key=url.key("sink_from", sinking[0] if sinking else 0, lo=0, hi=n_layers - 1)
        )
        request = knockout(source, text, "block", int(layer))
    _run(url.page, key, request)


@st.fragment
def _run(page: str, key: results.Request[tc.Trace], request: results.Request[sinks.Knockout]) -> None:
    """The button and what it gives. A fragment: the click runs this part alone, not the whole page with its
    charts above (SmolLM2 at 1280 x 720, click to settled: 0.50 s with the page around it, 0.26 s alone). The
    settings above it are in the page's link, so they stay outside: a change of them runs the page, which writes
    the link and sends it to a class. It holds requests of a text, not results."""
    asked = f"{page}.sinks_asked"
    if st.button("Run the knockout", key=f"{page}.sinks_run", type="primary"):
        st.session_state[asked] = request
    if st.session_state.get(asked) == request:
        # The page's trace of this text (cached: the views above read it) stands for the knockout's first pass: one
        # pass, not two. Bound only here: the request kept in session state must not hold a trace alive.
        def knock_out() -> sinks.Knockout:
            held = results.result(key)
            return results.result(replace(request, compute=functools.partial(_knock_out, held=held)), "Knockout")

        knock = run_safely(knock_out, "Knockout")
        if knock is not None:
            _show(knock)


def _activation_label(view: sv.SinksView, layer: int) -> str:
    assert view.activations is not None
    a = view.activations.top[layer][0]
    mark = " · massive" if a.massive else ""
    return f"L{layer}: {a.value:,.0f} at {display_token(view.tokens[a.position])}, dim {a.dim} ({a.ratio:,.0f}×){mark}"


def _show(knock: sinks.Knockout) -> None:
    st.caption(escape(knock.what))
    before, after = knock.before, knock.after
    if before.target is not None and before.target_probability is not None and after.target_probability is not None:
        c1, c2 = st.columns(2)
        target = display_token(before.target)
        c1.metric(f"P({target}) before", f"{before.target_probability:.3f}")
        c2.metric(
            f"P({target}) after",
            f"{after.target_probability:.3f}",
            f"{after.target_probability - before.target_probability:+.3f}",
        )
        presenter.table(sv.knockout_table(knock))
    st.caption(
        f"The final hidden state{' at the predicted position' if before.position is not None else ' (its mean)'} "
        f"moved by {knock.hidden_change:.0%} of its length (cosine {knock.hidden_cosine:.3f} with the one before)."
    )
