"""The lecture's head on Text attention: of every layer and head, the one whose query ("it") weighs the lecture's
noun ("animal") most, found from the cached trace's rows, and the line that states it on the first screen."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

import tformer_core as tc
from tformer_app import attention_panel as panel
from tformer_app import derived_views, presenter, results
from tformer_app.markdown import escape
from tformer_views import search

__all__ = ["LectureHead", "lecture_head", "say_the_lecture_head"]


@dataclass(frozen=True)
class LectureHead:
    """The head whose query ("it") weighs the lecture's noun ("animal") most, of all layers and heads."""

    layer: int
    head: int
    weight: float
    query: int
    key: int


def lecture_head(key: results.Request[tc.Trace], trace: tc.Trace, query: int | None) -> LectureHead | None:
    """The head linking `query` ("it") to the lecture's noun ("animal") most, when the sentence has them."""
    if query is None or not trace.n_layers:
        return None
    noun = search.default_key(trace.tokens, query, -1)
    if noun < 0:
        return None
    rows = derived_views.query_rows(key, trace.main_stack, query)  # [layers, heads, keys]
    layer, head, weight = search.ranked_heads(rows[..., noun], 1)[0]
    return LectureHead(layer, head, weight, query, noun)


def say_the_lecture_head(found: LectureHead | None, trace: tc.Trace, c: panel.Controls, labels: list[str]) -> None:
    """One line with the lecture's answer, while its head is the one shown: the page's key idea on its first
    screen, before the views that show it (in presenter mode, on the line below the title; else the key idea of
    any head)."""
    if found is None or (c.layer, c.head) != (found.layer, found.head) or c.query != found.query:
        presenter.idea(f"Layer {c.layer}, head {c.head}: how much each token attends to every other (a row sums to 1).")
        return
    q, k = escape(labels[found.query]), escape(labels[found.key])
    if presenter.presenting():
        presenter.idea(
            f"**{q} → {k}**: layer {found.layer}, head {found.head} gives “{k}” {found.weight:.2f} of “{q}”'s "
            f"attention, the most of all {trace.n_layers * trace.n_heads} heads."
        )
        return
    st.markdown(
        f"**{q} → {k}**: in layer {found.layer}, head {found.head}, “{q}” gives “{k}” {found.weight:.2f} of its "
        f"attention, more than in any other of the {trace.n_layers * trace.n_heads} heads. The views below show "
        "that head."
    )
