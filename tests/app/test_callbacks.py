"""Callbacks that arrive after the page moved on: a deck opened another slide (every page's view forgotten)
while the browser still showed the old page, and the lecturer clicked on it.

The race, as it was seen: a deck stepped from a Text attention slide to a Vision slide while the "Kind of model"
radio was clicked, and the radio's callback raised `KeyError: st.session_state has no key "text.arch"`. Here it
is driven deterministically: a run draws the page and then forgets every page's view (what opening a slide
does), and the next run carries a click made on what that run drew.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.proto.WidgetStates_pb2 import WidgetStates
from streamlit.testing.v1 import AppTest

from tests.app.pages import no_exception

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "text_attention.py")


def page_then_forget(path: str) -> None:
    """The Text attention page; when asked, every page's view is forgotten after it was drawn (a slide opened)."""
    from pathlib import Path

    import streamlit as st

    from tformer_app.url import forget_pages

    exec(compile(Path(path).read_text(), path, "exec"), {"__name__": "__main__"})
    if st.session_state.get("forget_after"):
        st.session_state["forget_after"] = False
        forget_pages()


def click(at: AppTest, what: str, before: WidgetStates) -> AppTest:
    """Run with the widget values the browser holds (`before`: those of the page on screen) and one click on it.

    AppTest would read every other widget's value from session state, which no longer has them: the browser
    keeps its own."""
    if what == "arch":
        widget = next(r for r in at.radio if r.label == "Kind of model").set_value("decoder")
    elif what == "query":
        widget = next(s for s in at.selectbox if s.label.startswith("Query token")).set_value(3)
    else:
        widget = next(b for b in at.button if b.key == "text.keys.Right").click()
    state = widget._widget_state
    states = WidgetStates()
    states.widgets.extend([w for w in before.widgets if w.id != state.id] + [state])
    return at._run(states)


@pytest.mark.parametrize("what", ["arch", "query", "next-head"])
def test_a_click_on_a_page_whose_view_was_forgotten_is_dropped_without_an_error(what):
    at = AppTest.from_function(page_then_forget, args=(PAGE,), default_timeout=120)
    at.query_params["views"] = "heatmap"
    at.run()
    no_exception(at)
    on_screen = at._tree.get_widget_states()
    at.session_state["forget_after"] = True
    at.run()  # drawn again, then forgotten: what the browser shows now belongs to a page that moved on
    no_exception(at)
    click(at, what, on_screen)
    no_exception(at)
    assert at.session_state["_tformer.stale_click"] is True  # the shell shows the slide again
    head = at.session_state["text.head"]
    assert head == 1 and at.session_state["text.arch"] == "encoder"  # the click dropped (the page's first head)
    # The session keeps working: the next click on the page as drawn now is taken.
    next(b for b in at.button if b.key == "text.keys.Right").click()
    at.run()
    no_exception(at)
    assert at.session_state["text.head"] == head + 1
