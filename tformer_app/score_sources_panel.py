"""Why this weight, from its sources: drawn under the "Why this weight" view of the attention panel (Text attention,
the Encoder-decoder page's encoder, decoder and cross-attention).

    score_sources_panel.draw(url, rerun, cell, prefix)

The numbers come from tformer_views.why_sources (a cached request in tformer_app.results): the largest query-side
sources, key-side sources and pairs with their shares, the check (the parts' sum beside the model's own softmax
input), and a button that removes one source in a real forward pass, beside the linear prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from tformer_core.errors import InputError
from tformer_core.score_sources import Cell
from tformer_views import why_sources as ws

from . import derived_views, downloads, results
from .logs import log
from .markdown import escape
from .url import UrlState

__all__ = ["Rerun", "draw"]


@dataclass(frozen=True)
class Rerun:
    """How to run the shown input again: the model's `source`, what its trace takes (`inputs`) and its keywords
    (`options`, (name, value) pairs). A page hands it to the panel with the trace it shows."""

    source: str
    inputs: tuple[Any, ...]
    options: tuple[tuple[str, Any], ...] = ()


def draw(
    url: UrlState,
    rerun: Rerun,
    cell: Cell,
    prefix: str,
    opt_in: bool = False,
    cached: results.Request[Any] | None = None,
) -> None:
    """The sources of `cell`'s softmax input: the check, the top query-side and key-side sources and pairs, and
    the remove button. cached: the request whose cached result holds the trace shown; the split reads it (no pass)
    when it keeps every part the split needs, else `rerun` runs one. opt_in: behind a toggle, off by default (a view
    a class steps through, where every step would otherwise cost a pass)."""
    label = "Where the score comes from" + ("" if cached is not None else " (one more pass)")
    if opt_in and not st.toggle(label, key=url.key(f"{prefix}sources", False)):
        return
    st.markdown("**Where the score comes from**")
    try:
        s = _split(rerun, cell, cached)
    except InputError as refused:  # a masked cell: its input is -inf
        st.caption(escape(str(refused)))
        return
    st.caption(
        f"q and k are sums of the parts that wrote the residual stream (embeddings, every earlier head and FFN, "
        f"biases), each norm's divisor frozen at its value in this pass: the score {s.score:.4f} is the sum of "
        f"{len(s.query_sources)} × {len(s.key_sources)} terms = {s.total:.4f} (difference {s.error:.1e}). "
        "A share is a term over the sum of its family's absolute values."
    )
    left, right = st.columns(2)
    with left:
        st.caption(f"Query side (through q of {escape(s.query_label)})")
        downloads.table(ws.ranked_sources(s, "query"), key=f"{prefix}sources_q")
    with right:
        st.caption(f"Key side (through k of {escape(s.key_label)})")
        downloads.table(ws.ranked_sources(s, "key"), key=f"{prefix}sources_k")
    st.caption("The largest pairs (query source, key source)")
    downloads.table(ws.ranked_pairs(s), key=f"{prefix}sources_pairs")
    _removal(url, rerun, cell, s, prefix)


def _split(rerun: Rerun, cell: Cell, cached: results.Request[Any] | None) -> Any:
    """The split from the cached trace when it holds every part (a click costs no pass: the page's text traces
    keep the FFN outputs for this), else from a pass of its own keeping them (a generation step's trace)."""
    if cached is not None:
        try:
            return derived_views.score_sources(cached, cell)
        except ValueError as missing:  # "the trace does not hold ...": that trace was kept leaner
            log.info("the cached trace cannot be split (%s): running a pass that keeps the sources", missing)
    return results.result(results.score_sources(rerun.source, rerun.inputs, rerun.options, cell), "Splitting")


def _removal(url: UrlState, rerun: Rerun, cell: Cell, s: Any, prefix: str) -> None:
    top = list(dict.fromkeys([*ws.ranked_sources(s, "query", 5)["source"], *ws.ranked_sources(s, "key", 5)["source"]]))
    chosen_key = url.key(f"{prefix}remove_source", top[0], choices=list(s.sources))
    options = list(dict.fromkeys([*top, *s.sources]))
    pick, go = st.columns([3, 1], vertical_alignment="bottom")
    name = pick.selectbox("Source to remove", options, key=chosen_key, format_func=lambda n: f"{n}: {ws.describe(n)}")
    done_key = f"{url.page}.{prefix}removed"
    go.button(
        "Remove this source",
        key=f"{url.page}.{prefix}remove_button",
        on_click=lambda: st.session_state.__setitem__(done_key, (cell, name)),
    )
    if st.session_state.get(done_key) != (cell, name):
        return
    removed = results.result(results.source_removal(rerun.source, rerun.inputs, rerun.options, cell, name), "Running")
    a, b, c = st.columns(3)
    a.metric("Weight in this pass", f"{removed.weight:.4f}")
    b.metric("Linear prediction", f"{removed.linear_weight:.4f}", f"{removed.linear_weight - removed.weight:+.4f}")
    c.metric("Real pass without it", f"{removed.real_weight:.4f}", f"{removed.real_weight - removed.weight:+.4f}")
    st.caption(
        f"Without {escape(name)} ({escape(ws.describe(name))}): the linear prediction takes its terms out of the "
        f"query's row (softmax input {removed.linear_score:.4f}); the real pass takes it out where it enters, at every "
        f"position, so every later layer and norm changes too (softmax input {removed.real_score:.4f})."
    )
