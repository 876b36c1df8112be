"""The frame around every page: title, introduction, URL state, errors shown in place, the sidebar's status."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import streamlit as st
import streamlit.components.v1 as components
import torch

import tformer_core as tc
from tformer_core.errors import InputError

from . import class_session, logs, presenter
from .markdown import escape
from .models import is_server_model, loaded_models
from .url import UrlState, notices

DEFAULT_TEXT_MODEL = "minilm"
TEXT_MODEL_SUGGESTIONS = ("minilm", "bert-base-uncased", "roberta-base", "distilbert-base-uncased", "gpt2")
DEFAULT_DECODER_MODEL = "smollm2"  # the Text attention page's decoder-only default (bundled, offline)
DECODER_MODEL_SUGGESTIONS = ("smollm2", "gpt2")


# Nothing wider than its column: a chart drawn at its own size (a heatmap of many tokens, the head view) that
# does not fit scrolls sideways inside its own box instead of pushing the page past the window (a phone, a
# projector); charts that fit their width (autosize "fit") shrink instead (downloads.chart).
LAYOUT_CSS = """<style>
[data-testid="stMain"] [data-testid="stVegaLiteChart"] { max-width: 100%; overflow-x: auto; overflow-y: hidden; }
</style>"""


def run_page(title: str, intro: str, name: str, draw: Callable[[UrlState], None]) -> None:
    """A page: its title and introduction, then draw(url) with the page's URL state.

    The URL is written even when drawing stops early (a bad input), so the link still shows what
    the user chose; not when another run cut this one short (that run writes it).
    """
    st.html(LAYOUT_CSS)
    presenter.new_page()
    if presenter.presenting():  # the first screen is the view's: the introduction behind the title's "?"
        st.title(title, help=intro)
    else:
        st.title(title)
        st.caption(intro)
    url = UrlState(name)
    notice = st.empty()  # filled after drawing: what the link changed, what it cannot carry
    drawn = False
    try:
        draw(url)
        drawn = True
    finally:
        # Not when another run cut this one short (a click, a key): that run draws the page and writes the URL.
        url.publish(drawn)
        line = notices(url) if drawn else None
        if line:
            notice.info(line)
    _scroll_if_asked()


def part(url: UrlState, draw: Callable[[], None]) -> None:
    """draw(), a part of the page that runs alone when one of its own widgets changes (a Streamlit fragment): the
    rest of the page, its charts and pictures above, is neither run nor sent nor drawn again (the Vision page's
    flow toggle: 0.80 s with the whole page around it, 0.50 s alone, click to settled). Its settings still go into
    the page's link and, for a lecturer, to the class, as at the end of a whole run; a following student's change
    of them still makes that student explore on their own.

    draw: what the part shows, its widgets keyed by `url`. It is kept until the page runs in full again, a closed
    tab's for as long as Streamlit keeps the session to be resumed, and run with what it holds then: let it hold
    names and small values (a model's name, a text), never a file or a result (a picture's bytes, a trace), which
    would stay in memory outside every budget (a copy of each photo a class uploaded did)."""
    st.session_state[_WHOLE_RUN] = True
    _part(url, draw, [])


_WHOLE_RUN = "_tformer.whole_run"  # session state: set by the page's whole run just before it runs a part


@st.fragment
def _part(url: UrlState, draw: Callable[[], None], registered: list[str]) -> None:
    alone = not st.session_state.pop(_WHOLE_RUN, False)
    if alone:  # the settings the part drew last time are drawn again, or not (a slider shown only while toggled)
        url.names[:] = [name for name in url.names if name not in registered]
    before = set(url.names)
    draw()
    registered[:] = [name for name in url.names if name not in before]
    if alone:
        url.publish_part()
        class_session.after_part(st.session_state.get(VISIT, (0, ""))[1])


VISIT = "_tformer.visit"  # session state: (number, url path) of the page on screen, a new number per page opened


def count_visit(path: str) -> None:
    """The shell's note of the page it runs: a page opened (not a rerun of the one on screen) is a new visit."""
    number, last = st.session_state.get(VISIT, (0, None))
    if path != last:
        st.session_state[VISIT] = (number + 1, path)


def once_per_session(name: str) -> bool:
    """True throughout the first visit that asks, False on later ones: a notice said once in a session (it stays
    while that page is on screen), not on every visit."""
    visit = st.session_state.get(VISIT, (0, None))[0]
    return st.session_state.setdefault(f"_tformer.once.{name}", visit) == visit


_SCROLL = "_tformer.scroll_to"
# Runs in an invisible component's frame (same origin as the page), after the elements it looks for may still
# be on their way: it tries for two seconds.
_SCROLL_SCRIPT = """<script>
const target = %s; let tries = 0;
const find = () => {
  const element = window.parent.document.getElementById(target);
  if (element) { element.scrollIntoView({behavior: "smooth", block: "start"}); }
  else if (tries++ < 40) { setTimeout(find, 50); }
};
find();
</script>"""


def scroll_to(anchor: str) -> None:
    """Bring the element with this anchor into sight once the page has been drawn again (for callbacks: a
    click on a thumbnail selects a head whose views are higher up the page)."""
    st.session_state[_SCROLL] = anchor


def _scroll_if_asked() -> None:
    anchor = st.session_state.pop(_SCROLL, None)
    if anchor:
        components.html(_SCROLL_SCRIPT % json.dumps(anchor), height=0)


def run_safely(compute: Callable[[], Any], what: str) -> Any | None:
    """compute(), or None with an inline message (never a traceback): the input's problem for an InputError,
    else a short "something went wrong" note with an id that the server's log also has (a bug, not the input).
    Either is logged (tformer_app.logs)."""
    try:
        return compute()
    except InputError as error:
        logs.failure(what, error)
        st.error(f"{escape(what)}: {escape(error)}")
    except logs.ReportedBug as bug:
        st.error(logs.bug_note(what, bug.note_id))
    except Exception as error:  # a bug (ours or a library's), even a ValueError: never blamed on the input
        st.error(logs.bug_note(what, logs.bug(what, error)))
    return None


def device_summary() -> str:
    """One line of Markdown: where the models run."""
    device = tc.default_device()
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"Device: **{device.type.upper()}** ({escape(label)}) · torch {torch.__version__.split('+')[0]}"


def models_summary() -> str:
    """One line of Markdown: the models this server holds (drawn after the page ran, so it includes its model).

    Only the server's own models are named (bundled ones, and local folders by their folder name, never
    their path); hub models are counted, not named: their ids are what other users typed.
    """
    loaded = loaded_models()
    named = sorted({m for m in loaded if is_server_model(m)})
    others = len(loaded) - len([m for m in loaded if is_server_model(m)])
    if not loaded:
        return "Models loaded: none yet"
    line = "Models loaded: " + ", ".join(escape(m) for m in named)
    if others:
        line += (", and " if named else "") + f"{others} from the hub"
    return line
