"""Presenter mode, keyboard steps and a deck of prepared views: the app on a projector, driven with a clicker.

    presenter.switch()                  # the sidebar's switch (and ?present=1 in any link)
    presenter.style()                   # large type, one view per screen, no toolbar (when on)
    presenter.stepper(url, steps)       # buttons with keys: ← → / Page Up, Page Down / ↑ ↓
    presenter.deck(page_path, title)    # save this view as a slide, reorder, present, export / import

A slide is a link: a page and its query string (every view keeps its state in its address). A deck is a
list of them; exported, it is a small JSON file that opens the same slides later, on any server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

import streamlit as st

from . import logs
from .deck_file import DECK_FORMAT, MAX_SLIDES, DeckError, read_deck
from .markdown import escape
from .url import MAX_LINK, PRESENT_STATE, UrlState, forget_pages

PRESENT = PRESENT_STATE  # session state; "present=1" in links
DECK = "_tformer.deck"  # session state: list of slides
SHOWING = "_tformer.showing"  # session state: index of the slide on screen while presenting, or None
FONT_SCALE = 1.5  # presenter type against the app's own

# Large type for what the class reads (text, captions, headings, formulas; charts get theirs from
# `chart_fonts`), compact widgets for the lecturer, no toolbar or Deploy button, the page at full width.
PRESENTER_CSS = """<style>
[data-testid="stToolbar"], [data-testid="stAppDeployButton"], [data-testid="stDecoration"] { display: none; }
[data-testid="stMainBlockContainer"] { padding: 3.5rem 2rem 1rem; max-width: 100%; }  /* below the header bar */
[data-testid="stVerticalBlock"] { gap: 0.5rem; }
[data-testid="stMain"] [data-testid="stMarkdown"] p,
[data-testid="stMain"] [data-testid="stMarkdown"] li { font-size: 24px; line-height: 1.35; }
[data-testid="stMain"] [data-testid="stCaptionContainer"] p { font-size: 20px; }
[data-testid="stMain"] h1 { font-size: 48px; padding: 0; }
[data-testid="stMain"] h2 { font-size: 40px; }
[data-testid="stMain"] h3 { font-size: 34px; }
[data-testid="stMain"] .katex { font-size: 1.6em; }
[data-testid="stMain"] [data-testid="stWidgetLabel"] p { font-size: 14px; }
</style>"""
# Buttons whose keys act without being seen (Page Up / Page Down: what a presentation clicker sends).
HIDDEN_KEY_CSS = "<style>%s { display: none; }</style>"


def presenting() -> bool:
    return bool(st.session_state.get(PRESENT, False))


def switch() -> None:
    """The sidebar's switch; a link's present=1 turns it on for the session it opens."""
    if PRESENT not in st.session_state:
        st.session_state[PRESENT] = st.query_params.get("present") == "1"
    st.toggle(
        "Presenter mode",
        key=PRESENT,
        help="Large type, one view at a time, keys to step (say ← → ↑ ↓, Page Up / Page Down); in every link.",
    )


def style() -> None:
    if presenting():
        st.html(PRESENTER_CSS)


def sidebar_state() -> str:
    """The sidebar as a page opens: collapsed on a projector (its ">" opens it), else Streamlit's choice."""
    if PRESENT not in st.session_state:
        st.session_state[PRESENT] = st.query_params.get("present") == "1"
    return "collapsed" if presenting() else "auto"


def chart_fonts(spec: dict) -> dict:
    """A chart with its type 1.5 times larger in presenter mode (axis, legend and title fonts), else as it is."""
    if not presenting():
        return spec
    size = {"labelFontSize": round(11 * FONT_SCALE), "titleFontSize": round(11 * FONT_SCALE)}
    config = dict(spec.get("config") or {})
    for part in ("axis", "legend", "header"):
        config[part] = {**size, **config.get(part, {})}
    config["title"] = {"fontSize": round(13 * FONT_SCALE), **config.get("title", {})}
    config["text"] = {"fontSize": round(11 * FONT_SCALE), **config.get("text", {})}
    return {**spec, "config": config}


def scale() -> float:
    """How much larger charts are drawn: 1.5 in presenter mode, else 1."""
    return FONT_SCALE if presenting() else 1.0


def cell_size(n: int) -> int | None:
    """A heatmap's cell in pixels in presenter mode (1.5 times the usual, at most 60 px), else None (usual)."""
    return max(18, min(60, int(FONT_SCALE * 560) // max(n, 1))) if presenting() else None


# ---- keys ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """A button and its key: `action` runs as a callback (before the page is drawn again)."""

    label: str
    key: str  # Streamlit's shortcut name: "Left", "Right", "Up", "Down", "PageUp", "PageDown"
    action: Callable[[], None]
    help: str = ""


def stepper(url: UrlState, name: str, steps: Sequence[Step], paging: tuple[Callable, Callable] | None = None) -> None:
    """A row of step buttons with their keys, and, unless a deck is being presented (the clicker then moves
    the slides), hidden Page Up / Page Down buttons doing `paging` (previous, next)."""
    with st.container(horizontal=True, gap="small", key=f"{url.page}.{name}.steps"):
        for step in steps:
            st.button(
                step.label,
                key=f"{url.page}.{name}.{step.key}",
                shortcut=step.key,
                on_click=step.action,
                help=step.help,
                type="tertiary",
            )
        if paging is not None and st.session_state.get(SHOWING) is None:
            for key, action in zip(("PageUp", "PageDown"), paging):
                button = f"{url.page}.{name}.{key}"
                st.button(key, key=button, shortcut=key, on_click=action)
                st.html(HIDDEN_KEY_CSS % f".st-key-{_css_key(button)}")


def _css_key(key: str) -> str:
    """Streamlit's CSS class for an element key (st-key-<key> with characters outside [A-Za-z0-9_-] as -)."""
    return "".join(c if c.isalnum() or c in "_-" else "-" for c in key)


def clamped(url: UrlState, name: str, step: int, low: int, high: int) -> Callable[[], None]:
    """A callback moving the URL value `name` by `step`, kept within low..high (a decoding step: no wrapping)."""

    def act() -> None:
        url.set(name, min(max(int(url.value(name)) + step, low), high))

    return act


def cycle(url: UrlState, name: str, n: int, step: int, carry: tuple[str, int] | None = None) -> Callable[[], None]:
    """A callback moving the URL value `name` by `step` within 0..n-1; past either end it wraps, and with
    `carry` = (other name, its count) it moves the other value too (the next head after the last one is
    head 0 of the next layer)."""

    def act() -> None:
        value = int(url.value(name)) + step
        if carry is not None and not 0 <= value < n:
            other, count = carry
            url.set(other, (int(url.value(other)) + (1 if value >= n else -1)) % count)
        url.set(name, value % n)

    return act


# ---- the deck -------------------------------------------------------------------------------------------
def deck(page_path: str, title: str, pages: dict[str, object]) -> None:
    """The sidebar's slides: add this view, reorder, remove, present (◀ ▶ and Page Up / Page Down), export
    and import. pages: url path -> st.Page, the pages a slide may open."""
    slides: list[dict] = st.session_state.setdefault(DECK, [])
    with st.expander(
        f"Slides ({len(slides)})", expanded=st.session_state.get(SHOWING) is not None, key="_tformer.deck"
    ):
        query = urlencode(st.query_params.to_dict())
        st.button(
            "Add this view",
            key="_tformer.deck.add",
            on_click=_add,
            args=(page_path, title, query),
            disabled=len(slides) >= MAX_SLIDES or len(query) > MAX_LINK,
        )
        for i, slide in enumerate(slides):
            _slide_row(i, slide, len(slides), pages)
        if slides:
            _present_controls(slides, pages)
            st.download_button(
                "Export the deck",
                json.dumps({"format": DECK_FORMAT, "version": 1, "slides": slides}, indent=1),
                file_name="tformer-deck.json",
                mime="application/json",
                key="_tformer.deck.export",
                on_click="ignore",
            )
        uploaded = st.file_uploader("Open a deck", type=["json"], key="_tformer.deck.import")
        if uploaded is not None:
            _import(uploaded.getvalue(), pages)


def _add(page_path: str, title: str, query: str) -> None:
    st.session_state[DECK].append({"page": page_path, "title": title, "query": query})


def _move(i: int, by: int) -> None:
    slides = st.session_state[DECK]
    j = min(max(i + by, 0), len(slides) - 1)
    slides[i], slides[j] = slides[j], slides[i]


def _remove(i: int) -> None:
    del st.session_state[DECK][i]
    st.session_state[SHOWING] = None


def _slide_row(i: int, slide: dict, n: int, pages: dict[str, object]) -> None:
    with st.container(horizontal=True, gap="small"):
        showing = st.session_state.get(SHOWING) == i
        st.markdown(f"{'**' if showing else ''}{i + 1}. {escape(slide['title'])}{'**' if showing else ''}")
        st.button("↑", key=f"_tformer.deck.up.{i}", on_click=_move, args=(i, -1), disabled=i == 0, type="tertiary")
        st.button("↓", key=f"_tformer.deck.down.{i}", on_click=_move, args=(i, 1), disabled=i == n - 1, type="tertiary")
        st.button("✕", key=f"_tformer.deck.remove.{i}", on_click=_remove, args=(i,), type="tertiary")


def _present_controls(slides: list[dict], pages: dict[str, object]) -> None:
    showing = st.session_state.get(SHOWING)
    with st.container(horizontal=True, gap="small"):
        if showing is None:
            if st.button("Present from slide 1", key="_tformer.deck.start", shortcut="Shift+P"):
                show(0, slides, pages)
            return
        st.caption(f"Slide {showing + 1} of {len(slides)}")
        if st.button("◀", key="_tformer.deck.prev", shortcut="PageUp", disabled=showing == 0):
            show(showing - 1, slides, pages)
        if st.button("▶", key="_tformer.deck.next", shortcut="PageDown", disabled=showing >= len(slides) - 1):
            show(showing + 1, slides, pages)
        if st.button("Stop", key="_tformer.deck.stop"):
            st.session_state[SHOWING] = None
            st.rerun()


def show(i: int, slides: list[dict], pages: dict[str, object]) -> None:
    """Open slide i: its page with its query string, every page's remembered view forgotten so the link rules."""
    slide = slides[i]
    st.session_state[SHOWING] = i
    forget_pages()
    st.switch_page(pages[slide["page"]], query_params=dict(parse_qsl(slide["query"])))


def _import(data: bytes, pages: dict[str, object]) -> None:
    """Replace the deck by an exported one, after checking every slide (tformer_app.deck_file)."""
    try:
        checked = read_deck(data, pages)
    except DeckError as error:
        logs.failure("opening a deck file", error)
        st.error(f"This file cannot be opened as a deck: {escape(error)}")
        return
    if st.session_state.get("_tformer.deck.imported") != hash(data):
        st.session_state[DECK] = checked
        st.session_state["_tformer.deck.imported"] = hash(data)
        st.session_state[SHOWING] = None
        st.rerun()
