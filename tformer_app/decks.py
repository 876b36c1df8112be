"""The deck of slides: prepared views, saved in order, kept on the server for the lecturer's browser, presented
with a clicker.

    decks.restore(pages)                 # this browser's deck, before the page and the bar (presenter.keys)
    decks.deck(page_path, title, pages)  # the sidebar's slides: add this view, reorder, present, export / import
    decks.show(i, slides, pages)         # open slide i (presenter.keys, before the page runs)
    decks.go(i), decks.stop()            # present from slide i / stop presenting (the bar's buttons too)

A slide is a link: a page and its query string (every view keeps its state in its address). A deck is a
list of them; exported, it is a small JSON file that opens the same slides later, on any server. The keys
that step a presented deck (Page Up / Page Down) and presenter mode's bar are tformer_app.presenter's.

Every change (add, move, remove, open a file) is saved at once in the server's store (tformer_app.deck_store)
under the deck's token, an unguessable string the browser keeps in a cookie (`COOKIE`, written by a small element
of the page): a reload, a typed address, a new tab or a restarted server open the same deck. The deck's link
(`?deck=<token>`) opens it in another browser (the projector's), which keeps it from then on. A change is made on
the deck as saved: one changed meanwhile in another browser is shown first, and the change asked for again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import streamlit as st
import streamlit.components.v2 as components

from . import deck_store, logs
from .deck_file import DECK_FORMAT, MAX_SLIDES, DeckError, read_deck
from .deck_store import TOKEN_FORM, DeckStoreError, StoreDown, new_token, shown_token
from .markdown import escape
from .url import MAX_LINK, forget_pages

DECK = "_tformer.deck"  # session state: list of slides
SHOWING = "_tformer.showing"  # session state: index of the slide on screen while presenting, or None
GOTO = "_tformer.goto"  # session state: the slide to open before the page runs (a key, a button)
TOKEN = "_tformer.deck.token"  # session state: the deck's token in the store, once it was saved or opened
EXPIRES = "_tformer.deck.expires"  # session state: when the saved deck expires (Unix time)
OPENED = "_tformer.deck.opened"  # session state: this session looked for its browser's deck (its first run)
NOTE = "_tformer.deck.note"  # session state: (kind, Markdown, a link or "") said in the panel until the next save
COOKIE_VALUE = "_tformer.deck.cookie"  # session state: what the browser's cookie is to hold ("" forgets it)
IMPORTED = "_tformer.deck.imported"  # session state: the hash of the file opened last (opened once)
JOIN_PARAM = "class"  # a class's join link (tformer_app.class_session.CLASS_PARAM): never opened by a slide
DECK_PARAM = "deck"  # a deck's link: /?deck=<token>; never opened by a slide either
COOKIE = "tformer_deck"  # the browser's: the token of its deck
COOKIE_MAX_AGE_S = 400 * 86400  # the longest a browser keeps a cookie (Chrome's cap)
OPEN_FAILED = {"link": "The deck link could not be opened", "cookie": "The deck this browser kept could not be opened"}


def go(i: int) -> None:
    """Show slide i (clamped to the deck) from the next run on: `presenter.keys` opens it before the page runs."""
    slides = st.session_state.get(DECK, [])
    if slides:
        st.session_state[SHOWING] = st.session_state[GOTO] = min(max(int(i), 0), len(slides) - 1)


def stop() -> None:
    st.session_state[SHOWING] = None


def show(i: int, slides: list[dict], pages: dict[str, Any]) -> None:
    """Open slide i: its page with its query string, every page's remembered view forgotten so the link rules.
    A slide is a view, never a class: a join code in its link (?class=, a deck from someone's class) is dropped. Nor
    a deck: a ?deck= it carries is dropped by `restore` (only a link the browser opened opens a deck)."""
    slide = slides[i]
    st.session_state[SHOWING] = i
    forget_pages()
    params = {k: v for k, v in parse_qsl(slide["query"]) if k != JOIN_PARAM}
    st.switch_page(pages[slide["page"]], query_params=params)


# ---- this browser's deck, from the store -----------------------------------------------------------------------
def restore(pages: Collection[str]) -> list[dict]:
    """This session's deck, looked for on its first run, before the page and presenter mode's bar are drawn: the one
    a link's ?deck= names (this browser keeps it from then on), else the one its cookie names. pages: the app's url
    paths. Returns the deck's slides (session state DECK)."""
    first = OPENED not in st.session_state
    st.session_state[OPENED] = True
    link = st.query_params.get(DECK_PARAM)
    if link is not None:
        del st.query_params[DECK_PARAM]  # the token leaves the address bar; a reload finds the deck by its cookie
    if first and link is not None:  # a link the browser opened: a slide carrying ?deck= opens no deck
        _open(link, tuple(pages), "link")
    elif first and (kept := _browser_token()):
        _open(kept, tuple(pages), "cookie")
    return st.session_state.get(DECK, [])


def _browser_token() -> str:
    """The deck token this browser kept (its cookie, as the page was opened), or ""."""
    token = st.context.cookies.get(COOKIE)
    return token if isinstance(token, str) else ""


def _store() -> deck_store.DeckStore:
    return deck_store.open_store()


def _open(token: str, pages: tuple[str, ...], source: str) -> None:
    """Open the saved deck `token` names (source: "link" or "cookie"); a token or a deck that cannot be opened is said
    in the panel and logged with its cause, and a cookie that names no deck is forgotten (not one a store that
    failed a moment could not read)."""
    try:
        saved = _store().load(token, pages)
    except DeckStoreError as error:
        logs.failure(f"opening the deck of this browser's {source} ({shown_token(token)})", error)
        again = " Reload the page to try again." if isinstance(error, StoreDown) else ""
        _note("warning", f"{OPEN_FAILED[source]}: {escape(error)}.{again}")
        if source == "cookie" and not isinstance(error, StoreDown):
            st.session_state[COOKIE_VALUE] = ""
        return
    earlier = _browser_token() if source == "link" else ""
    st.session_state.update({DECK: saved.slides, TOKEN: token, EXPIRES: saved.expires, COOKIE_VALUE: token})
    st.session_state[SHOWING] = None
    if earlier != token and TOKEN_FORM.fullmatch(earlier):
        _note(
            "info",
            f"This browser keeps the link's deck ({len(saved.slides)} slides) from now on. The deck it kept before "
            "stays on the server until it expires; its link:",
            deck_link(earlier),
        )


def deck_link(token: str) -> str:
    """The address that opens the deck `token` in any browser: this server's (as the browser opened it), ?deck=."""
    parts = urlsplit(str(st.context.url or ""))
    base = f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else ""
    return f"{base}/?{DECK_PARAM}={token}"


def _note(kind: str, text: str, link: str = "") -> None:
    """Say `text` (Markdown, its user strings escaped) in the panel, with `link` to copy, until the next save."""
    st.session_state[NOTE] = (kind, text, link)


def _change(edit: Callable[..., None], pages: tuple[str, ...], *args: Any) -> None:
    """A change of the deck (a button's callback): made on the deck as saved, and saved at once."""
    if _in_step(pages):
        edit(st.session_state[DECK], *args)
        _save(pages)


def _in_step(pages: tuple[str, ...]) -> bool:
    """Whether this tab shows the deck as saved. A deck changed meanwhile in another browser (the projector's, the
    laptop's) is shown as it is saved now, and the change is not made: its slide numbers were the old deck's."""
    token = st.session_state.get(TOKEN)
    if token is None:
        return True
    try:
        saved = _store().load(token, pages)
    except DeckStoreError:  # expired meanwhile (saved again as new), or the store away (the save says so)
        return True
    if saved.slides == st.session_state.get(DECK):
        return True
    st.session_state.update({DECK: saved.slides, EXPIRES: saved.expires, SHOWING: None})
    _note(
        "info",
        f"This deck was changed in another browser meanwhile: here it is as saved there ({len(saved.slides)} "
        "slides). Make your change again.",
    )
    return False


def _save(pages: tuple[str, ...]) -> None:
    """Save the deck under this browser's token (a new one for its first save); a failure is said and logged."""
    token = st.session_state.get(TOKEN) or new_token()
    try:
        saved = _store().save(token, st.session_state[DECK], pages)
    except DeckStoreError as error:
        logs.failure(f"saving deck {shown_token(token)}", error)
        _note(
            "warning",
            f"This change is not saved on the server: {escape(error)}. The deck stays in this tab while it is open; "
            "*Export the deck* keeps a copy.",
        )
        return
    st.session_state.update({TOKEN: token, EXPIRES: saved.expires, COOKIE_VALUE: token})
    st.session_state.pop(NOTE, None)


def _forget() -> None:
    """This browser no longer keeps the deck (a shared computer's); it stays on the server, under its link."""
    token, expires = st.session_state.pop(TOKEN, None), st.session_state.pop(EXPIRES, None)
    st.session_state.update({DECK: [], SHOWING: None, COOKIE_VALUE: ""})
    if token is not None:
        until = _date(expires)
        _note(
            "info",
            f"This browser no longer keeps the deck. It stays on the server until {until}; its link:",
            deck_link(token),
        )


def _date(when: float | None) -> str:
    moment = time.localtime(when or time.time())
    return f"{moment.tm_mday} {time.strftime('%B %Y', moment)}"


# ---- the sidebar's panel -----------------------------------------------------------------------------------------
def deck(page_path: str, title: str, pages: Collection[str]) -> None:
    """The sidebar's slides: add this view, reorder, remove, present (◀ ▶ and Page Up / Page Down), export
    and import; the deck's link. pages: the url paths a slide may open (the keys of url path -> st.Page will do)."""
    slides: list[dict] = st.session_state.setdefault(DECK, [])
    paths = tuple(pages)
    note = st.session_state.get(NOTE)
    opened = st.session_state.get(SHOWING) is not None or note is not None
    with st.expander(f"Slides ({len(slides)})", expanded=opened, key="_tformer.deck"):
        if note is not None:
            _say(*note)
        query = urlencode(st.query_params.to_dict())
        st.button(
            "Add this view",
            key="_tformer.deck.add",
            on_click=_change,
            args=(_add, paths, page_path, title, query),
            disabled=len(slides) >= MAX_SLIDES or len(query) > MAX_LINK,
        )
        for i, slide in enumerate(slides):
            _slide_row(i, slide, len(slides), paths)
        if slides:
            _present_controls(slides)
            st.download_button(
                "Export the deck",
                json.dumps({"format": DECK_FORMAT, "version": 1, "slides": slides}, indent=1),
                file_name="tformer-deck.json",
                mime="application/json",
                key="_tformer.deck.export",
                on_click="ignore",
            )
        _kept_here()
        uploaded = st.file_uploader("Open a deck", type=["json"], key="_tformer.deck.import")
        if uploaded is not None:
            _import(uploaded.getvalue(), paths)
    _keep_cookie()


def _say(kind: str, text: str, link: str = "") -> None:
    with st.container(horizontal=True, gap="small", vertical_alignment="center"):
        (st.warning if kind == "warning" else st.info)(text)
        st.button("OK", key="_tformer.deck.note.ok", on_click=_dismiss)
    if link:
        st.code(link, language=None, wrap_lines=True)


def _dismiss() -> None:
    st.session_state.pop(NOTE, None)


def _kept_here() -> None:
    """Where the deck is kept and until when, its link, and the way to forget it in this browser."""
    token = st.session_state.get(TOKEN)
    if token is None:
        return
    days = _store().settings.days
    st.caption(
        f"Saved on this server for this browser until {_date(st.session_state.get(EXPIRES))} ({days:g} days after "
        "its last change). Its link opens it in another browser (the projector's); whoever has the link can "
        "change the deck:"
    )
    st.code(deck_link(token), language=None, wrap_lines=True)
    st.button(
        "Forget it in this browser",
        key="_tformer.deck.forget",
        on_click=_forget,
        type="tertiary",
        help="On a shared computer (a lecture hall's): this browser no longer opens the deck, which stays on the "
        "server under its link until it expires.",
    )


def _add(slides: list[dict], page_path: str, title: str, query: str) -> None:
    slides.append({"page": page_path, "title": title, "query": query})


def _move(slides: list[dict], i: int, by: int) -> None:
    j = min(max(i + by, 0), len(slides) - 1)
    slides[i], slides[j] = slides[j], slides[i]


def _remove(slides: list[dict], i: int) -> None:
    del slides[i]
    st.session_state[SHOWING] = None


def _slide_row(i: int, slide: dict, n: int, pages: tuple[str, ...]) -> None:
    with st.container(horizontal=True, gap="small", key=f"tformer-slide-{i}"):  # one line (presenter.ALWAYS_CSS)
        showing = st.session_state.get(SHOWING) == i
        # "1\." : a paragraph, not a Markdown list (whose number a one-line cut would hide)
        st.markdown(f"{'**' if showing else ''}{i + 1}\\. {escape(slide['title'])}{'**' if showing else ''}")
        up, down, remove = (_move, pages, i, -1), (_move, pages, i, 1), (_remove, pages, i)
        st.button("↑", key=f"_tformer.deck.up.{i}", on_click=_change, args=up, disabled=i == 0, type="tertiary")
        st.button("↓", key=f"_tformer.deck.down.{i}", on_click=_change, args=down, disabled=i == n - 1, type="tertiary")
        st.button("✕", key=f"_tformer.deck.remove.{i}", on_click=_change, args=remove, type="tertiary")


def _present_controls(slides: list[dict]) -> None:
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


def _import(data: bytes, pages: tuple[str, ...]) -> None:
    """Replace the deck by an exported one, after checking every slide (tformer_app.deck_file), and save it."""
    try:
        checked = read_deck(data, pages)
    except DeckError as error:
        logs.failure("opening a deck file", error)
        st.error(f"This file cannot be opened as a deck: {escape(error)}")
        return
    if st.session_state.get(IMPORTED) != hash(data):
        st.session_state.update({DECK: checked, IMPORTED: hash(data), SHOWING: None})
        _save(pages)
        st.rerun()


# The browser keeps the deck's token in a cookie (read by the server from the next page load on, as
# st.context.cookies): written by this element, which draws nothing, when it differs ("" deletes it) and again
# after each save (`stamp`: the deck's new expiry), so that the cookie outlives the deck it names.
COOKIE_JS = """
export default function (component) {
  const d = component.data;
  if (!d || !d.name) return;
  const k = window.__tformerDeckCookie || (window.__tformerDeckCookie = {});
  const now = document.cookie.split("; ").find((c) => c.startsWith(d.name + "="));
  const want = d.value ? `${d.name}=${d.value}` : "";
  if ((d.value ? now === want : !now) && k.stamp === d.stamp) return;
  k.stamp = d.stamp;
  const secure = location.protocol === "https:" ? "; Secure" : "";
  document.cookie = d.value
    ? `${want}; path=/; max-age=${d.maxAge}; SameSite=Lax${secure}`
    : `${d.name}=; path=/; max-age=0; SameSite=Lax${secure}`;
}
"""
_cookie_component = components.component("tformer_deck_cookie", js=COOKIE_JS)
COOKIE_CSS = "<style>.st-key-tformer-deck-cookie { display: none; }</style>"


def _keep_cookie() -> None:
    value = st.session_state.get(COOKIE_VALUE)
    if value is None:
        return
    max_age = min(_store().settings.ttl_s + 7 * 86400, COOKIE_MAX_AGE_S)  # a week past the deck: its end is said
    data = {"name": COOKIE, "value": value, "maxAge": max_age, "stamp": st.session_state.get(EXPIRES)}
    with st.container(key="tformer-deck-cookie"):
        st.html(COOKIE_CSS)
        _cookie_component(key="_tformer.deck.cookie_element", data=data, height=0)
