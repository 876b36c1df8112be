"""Text attention's comparison: the chosen head on a second sentence beside the first, and their difference.

The second sentence is in the link ("compare"); its trace is cached like the first's (results.text_trace),
so choosing another layer or head runs no model.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

import tformer_core as tc
from tformer_views import text as tv
from tformer_views.charts.spec import heatmap

from . import downloads, presenter, results
from .attention_panel import Controls
from .markdown import escape
from .page import run_safely
from .url import UrlState


def second_trace(url: UrlState, source: str, model: tc.TracedModel, pair: str | None) -> tc.Trace | None:
    """The folded box for a second sentence, and its trace (read with the first's second segment, if any);
    None while the box is empty or the sentence cannot be read (the reason shown)."""
    key = url.key("compare", "")
    url.described["compare"] = "the sentence compared"
    with st.expander("Compare with another sentence", expanded=bool(st.session_state[key])):
        text = st.text_input(
            "Another sentence: the same layer and head on both, side by side, and their difference",
            key=key,
            placeholder="e.g. The animal didn't cross the street because it was too wide.",
        )
    if not text.strip():
        return None
    fitted = run_safely(lambda: tv.fit_text(model, text, pair), "Compared sentence")
    if fitted is None:
        return None
    return run_safely(lambda: results.result(results.text_trace(source, fitted.text, fitted.pair)), "Compared sentence")


def _chart(matrix: tv.HeadMatrix, title: str, key: str, diverging: bool = False, share: float = 0.5) -> None:
    spec = heatmap(
        matrix.weights,
        matrix.query_labels,
        matrix.key_labels,
        title,
        masked=matrix.masked,
        domain=None if diverging else (0.0, 1.0),  # a difference: its own range, symmetric around 0
        diverging=diverging,
        cell_size=presenter.cell_size(max(len(matrix.queries), len(matrix.keys)), share=share),
    )
    downloads.chart(spec, key=key)


def draw(url: UrlState, source: str, model: tc.TracedModel, first: tc.Trace, c: Controls, pair: str | None) -> None:
    """The comparison under the views, when a second sentence is given: the chosen head on each (special tokens
    hidden as the controls say, the long input's window too), side by side, then second - first where they line
    up."""
    second = second_trace(url, source, model, pair)
    if second is None:
        return
    where = f"layer {c.layer}, head {c.head}"
    st.subheader(f"Two sentences · {where}", anchor="compare")
    matrices: list[Any] = []
    for trace in (first, second):
        full = tv.head_matrix(trace, c.layer, c.head, c.stack, hide_special=c.hide)
        matrices.append(full.window(c.window))
    for column, matrix, name in zip(st.columns(2), matrices, ("First", "Second"), strict=True):
        with column:
            _chart(matrix, f"{name} sentence: {where}", f"text.chart.compare_{name.lower()}")
    diff = tv.difference(*matrices)
    if diff is None:
        n1, n2 = (len(m.queries) for m in matrices)
        st.info(
            f"The sentences show {n1} and {n2} tokens: their positions do not line up one for one, so no difference "
            "is drawn. Sentences of as many tokens (a word swapped for another of one token) compare cell by cell."
        )
        return
    _chart(diff, f"Second − first: {where}", "text.chart.compare_difference", diverging=True, share=1.0)
    changed = [label for label in diff.query_labels if "→" in label]
    st.caption(
        f"Red: the second sentence gives the cell more weight; blue: less. Tokens that differ: "
        f"{escape(', '.join(changed)) if changed else 'none'}. Largest change: {abs(diff.weights).max():.3f}."
    )
