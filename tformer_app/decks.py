"""The deck of slides: prepared views, saved in order, presented with a clicker.

    decks.deck(page_path, title, pages)  # the sidebar's slides: add this view, reorder, present, export / import
    decks.show(i, slides, pages)         # open slide i (presenter.keys, before the page runs)
    decks.go(i), decks.stop()            # present from slide i / stop presenting (the bar's buttons too)

A slide is a link: a page and its query string (every view keeps its state in its address). A deck is a
list of them; exported, it is a small JSON file that opens the same slides later, on any server. The keys
that step a presented deck (Page Up / Page Down) and presenter mode's bar are tformer_app.presenter's.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlencode

import streamlit as st

from . import logs
from .deck_file import DECK_FORMAT, MAX_SLIDES, DeckError, read_deck
from .markdown import escape
from .url import MAX_LINK, forget_pages

DECK = "_tformer.deck"  # session state: list of slides
SHOWING = "_tformer.showing"  # session state: index of the slide on screen while presenting, or None
GOTO = "_tformer.goto"  # session state: the slide to open before the page runs (a key, a button)
JOIN_PARAM = "class"  # a class's join link (tformer_app.class_session.CLASS_PARAM): never opened by a slide


def go(i: int) -> None:
    """Show slide i (clamped to the deck) from the next run on: `presenter.keys` opens it before the page runs."""
    slides = st.session_state.get(DECK, [])
    if slides:
        st.session_state[SHOWING] = st.session_state[GOTO] = min(max(int(i), 0), len(slides) - 1)


def stop() -> None:
    st.session_state[SHOWING] = None


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
            st.button(
                "Present from slide 1",
                key="_tformer.deck.start",
                on_click=go,
                args=(0,),
                help="Page Up / Page Down then move through the slides (a clicker sends them).",
            )
            return
        st.caption(f"Slide {showing + 1} of {len(slides)}")
        st.button("◀", key="_tformer.deck.prev", on_click=go, args=(showing - 1,), disabled=showing == 0)
        st.button("▶", key="_tformer.deck.next", on_click=go, args=(showing + 1,), disabled=showing >= len(slides) - 1)
        st.button("Stop", key="_tformer.deck.stop", on_click=stop)


def show(i: int, slides: list[dict], pages: dict[str, Any]) -> None:
    """Open slide i: its page with its query string, every page's remembered view forgotten so the link rules.
    A slide is a view, never a class: a join code in its link (?class=, a deck from someone's class) is dropped."""
    slide = slides[i]
    st.session_state[SHOWING] = i
    forget_pages()
    params = {k: v for k, v in parse_qsl(slide["query"]) if k != JOIN_PARAM}
    st.switch_page(pages[slide["page"]], query_params=params)


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
