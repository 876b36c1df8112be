"""Presenter mode, keyboard steps and a deck of prepared views: the app on a projector, driven with a clicker.

    presenter.keys(pages)               # the keys the browser keeps (Page Up / Down on a deck, Shift+P, Esc)
    presenter.switch()                  # the sidebar's switch (and ?present=1 in any link)
    presenter.style()                   # large type, one view per screen, no toolbar (when on)
    presenter.bar(page_path, pages)     # presenter mode's slim bar: every page, the slides, the way out
    presenter.stepper(url, steps)       # buttons with keys: ← → / Page Up, Page Down / ↑ ↓
    presenter.deck(page_path, title)    # save this view as a slide, reorder, present, export / import

A slide is a link: a page and its query string (every view keeps its state in its address). A deck is a
list of them; exported, it is a small JSON file that opens the same slides later, on any server.

Keys that change the slide are counted in the browser (`KEYS_JS`), not by buttons: a slide change takes a
second, and a button pressed meanwhile acts on the page still on screen (its ◀ disabled on slide 1, its
page about to go). The browser sends the slide it wants (a number, not "one more"), so presses made during
a change add up and the deck ends where the keys say.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import streamlit as st
import streamlit.components.v2 as components

from . import logs
from .deck_file import DECK_FORMAT, MAX_SLIDES, DeckError, read_deck
from .markdown import escape
from .url import MAX_LINK, PRESENT_STATE, STALE_CLICK, UrlState, forget_pages

PRESENT = PRESENT_STATE  # session state; "present=1" in links
SWITCH = "_tformer.present.switch"  # the sidebar's switch (a widget: it shows PRESENT, and sets it)
DECK = "_tformer.deck"  # session state: list of slides
SHOWING = "_tformer.showing"  # session state: index of the slide on screen while presenting, or None
GOTO = "_tformer.goto"  # session state: the slide to open before the page runs (a key, a button)
KEYS_SEQ = "_tformer.keys.seq"  # session state: the last key command the server acted on
ROOM = "_tformer.room"  # session state: the main column's width in CSS pixels, as the browser measured it
DEFAULT_ROOM = 900  # the main column of a 1280-px window with the sidebar open, until the browser says
MIN_ROOM, MAX_ROOM = 200, 6000
ROOM_COOKIES = {False: "tformer_room", True: "tformer_room_presenting"}  # the width last measured, per mode
JOIN_PARAM = "class"  # a class's join link (tformer_app.class_session.CLASS_PARAM): never opened by a slide
FONT_SCALE = 1.5  # presenter type against the app's own
HEATMAP_MARGIN_PX = 200  # beside a heatmap's cells: its token labels, axis titles, colour legend and padding
# Short names of the pages for presenter mode's bar (url path -> label).
# Pages not named here (the operator's hidden page) are not in the bar.
SHORT_TITLES = {
    "": "Home",
    "early": "Before",
    "step-by-step": "Step by step",
    "positional": "Positional",
    "block": "Block",
    "text": "Text",
    "seq2seq": "Encoder-decoder",
    "vision": "Vision",
    "distance": "Distance",
    "shift": "Shift",
    "mae": "MAE",
    "detr": "DETR",
    "heads": "Heads",
    "train": "Train",
}

# Large type for what the class reads (text, captions, headings, formulas; charts get theirs from
# `chart_fonts`), compact widgets for the lecturer, no toolbar or menu, the page at full width. The header's
# ">" that opens the sidebar stays; the bar (`bar`) sits above the page in small type.
PRESENTER_CSS = """<style>
[data-testid="stToolbarActions"], [data-testid="stMainMenu"], [data-testid="stAppDeployButton"],
[data-testid="stDecoration"] { display: none; }
[data-testid="stHeader"] { background: transparent; }  /* only its ">" is left */
[data-testid="stHeader"], [data-testid="stHeader"] * { pointer-events: none; }
[data-testid="stHeader"] [data-testid="stExpandSidebarButton"],
[data-testid="stHeader"] [data-testid="stExpandSidebarButton"] * { pointer-events: auto; }
[data-testid="stMain"] [data-testid="stMainBlockContainer"] { padding: 0.5rem 2rem 1rem 3.5rem; max-width: 100%; }
[data-testid="stVerticalBlock"] { gap: 0.5rem; }
[data-testid="stMain"] [data-testid="stMarkdown"] p,
[data-testid="stMain"] [data-testid="stMarkdown"] li { font-size: 24px; line-height: 1.35; }
[data-testid="stMain"] [data-testid="stCaptionContainer"] p { font-size: 20px; }
[data-testid="stMain"] h1 { font-size: 40px; padding: 0; }
[data-testid="stMain"] h2 { font-size: 40px; }
[data-testid="stMain"] h3 { font-size: 34px; }
[data-testid="stMain"] .katex { font-size: 1.6em; }
[data-testid="stMain"] [data-testid="stWidgetLabel"] p { font-size: 14px; }
[data-testid="stMain"] [data-testid="stTable"] :is(td, th) { font-size: 22px; }
.st-key-tformer-bar { position: sticky; top: 0; z-index: 99; background: var(--st-background-color, #fff);
  border-bottom: 1px solid rgba(49, 51, 63, 0.2); padding: 0.1rem 0 0.3rem; }
.st-key-tformer-bar p, .st-key-tformer-bar [data-testid="stMarkdownContainer"] p { font-size: 15px; line-height: 1.2; }
.st-key-tformer-bar [data-testid="stPageLink"] a { padding: 0.1rem 0.35rem; }
/* One row whatever the number of pages: the links scroll sideways in their own strip (Tab and a click bring a
   link into view), the slide controls and the way out stay at the right; a second row would push the view
   below a 720-px projector's first screen. */
.st-key-tformer-bar { flex-wrap: nowrap !important; }
.st-key-tformer-bar-pages { flex-wrap: nowrap !important; overflow-x: auto; overflow-y: hidden; min-width: 0;
  flex: 1 1 0 !important; min-height: 2.3rem; align-items: center; scrollbar-width: thin; }
.st-key-tformer-bar-pages > * { flex: 0 0 auto !important; width: auto !important; }
.st-key-tformer-bar button { min-height: 1.9rem; padding: 0.1rem 0.5rem; }
</style>"""
# On every page: the keys' element draws nothing and takes no room; the page starts just below the header bar
# (Streamlit leaves 6rem), so that a 720-px projector's first screen holds more than the controls.
ALWAYS_CSS = """<style>.st-key-tformer-keys { display: none; }
[data-testid="stMain"] [data-testid="stMainBlockContainer"] { padding-top: 3.75rem; }
[data-testid="stMain"] h1 { padding-top: 0.25rem; }</style>"""
# Buttons whose keys act without being seen (Page Up / Page Down: what a presentation clicker sends).
HIDDEN_KEY_CSS = "<style>%s { display: none; }</style>"

# The keys the browser keeps for the deck and presenter mode, run in the page (Streamlit's components v2):
# Page Up / Page Down while a deck is presented, Shift+P (presenter mode on / off), Esc (leave it). State lives
# on `window`, so it outlives the element when a slide opens another page. What the server last acted on comes
# in `data` (showing, n, seq, present); a key sends what it wants as the state value "command", numbered: the
# server acts on a number it has not seen, once. Keys typed into a text box (but Esc), or Esc closing a list,
# are not ours.
KEYS_JS = """
export default function (component) {
  const { data, setStateValue } = component;
  const k = window.__tformerKeys || (window.__tformerKeys = { seq: 0, pending: {}, timer: null });
  // The main column's width (its content box), sent once the page is idle (a new width must not cut a run
  // short) when it differs from what the server has by more than a few per cent: charts are sized to it
  // (`room`). A scroll bar coming and going does not count. A cookie keeps it for the next visit's first run.
  // `measuring` says a measure is due (the browser tests wait for it, as for a run).
  k.measure = () => {
    clearTimeout(k.timer);
    k.measuring = true;
    k.timer = setTimeout(() => {
      const state = document.querySelector('[data-testid="stApp"]')?.getAttribute("data-test-script-state");
      if (state === "running" || state === "rerunRequested") { k.measure(); return; }
      k.measuring = false;
      const main = document.querySelector('[data-testid="stMainBlockContainer"]');
      if (!main || !k.data) return;
      const style = getComputedStyle(main);
      const px = Math.round(main.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight));
      if (px <= 0 || Math.abs(px - (k.data.room || 0)) <= 40) return;
      document.cookie = `${k.data.cookie}=${px}; path=/; max-age=31536000; SameSite=Lax`;
      k.data = { ...k.data, room: px };
      k.sendRoom(px);
    }, 150);
  };
  if (!k.observer) {
    // Only a change of width counts: the column grows taller as the page draws, and that is no reason to wait.
    k.observer = new ResizeObserver((entries) => {
      const width = Math.round(entries[entries.length - 1].contentRect.width);
      if (width !== k.observedWidth) { k.observedWidth = width; k.measure(); }
    });
  }
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  if (main && k.observed !== main) { k.observer.disconnect(); k.observer.observe(main); k.observed = main; }
  k.send = (command) => setStateValue("command", command);
  k.sendRoom = (px) => setStateValue("room", px);
  k.data = data;
  if (data.seq >= k.seq) { k.seq = data.seq; k.pending = {}; }  // the server has caught up with every key
  k.measure();
  if (k.listening) return;
  k.listening = true;
  const typing = (t) => t && (t.isContentEditable || t.tagName === "TEXTAREA" || t.tagName === "SELECT" ||
    (t.tagName === "INPUT" && !["checkbox", "radio", "range", "button", "submit", "file"].includes(t.type)));
  const listOpen = () => document.querySelector('[data-baseweb="popover"], [role="listbox"], [role="dialog"]');
  const send = (what) => { k.seq += 1; Object.assign(k.pending, what); k.send({ seq: k.seq, ...k.pending }); };
  document.addEventListener("keydown", (e) => {
    const d = k.data;
    if (!d || e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.key !== "Escape" && typing(e.target)) return;
    const present = "present" in k.pending ? k.pending.present : d.present;
    if ((e.key === "PageDown" || e.key === "PageUp") && d.showing !== null && !e.shiftKey) {
      e.preventDefault(); e.stopImmediatePropagation();
      const from = "slide" in k.pending ? k.pending.slide : d.showing;
      const to = Math.min(Math.max(from + (e.key === "PageDown" ? 1 : -1), 0), d.n - 1);
      if (to !== from) send({ slide: to });
    } else if (e.key === "Escape" && present && !listOpen()) {
      e.preventDefault(); e.stopImmediatePropagation();
      send({ present: false });
    } else if (e.shiftKey && (e.key === "P" || e.key === "p")) {
      e.preventDefault(); e.stopImmediatePropagation();
      send({ present: !present });
    }
  }, true);
}
"""
_keys_component = components.component("tformer_keys", js=KEYS_JS)


def presenting() -> bool:
    return bool(st.session_state.get(PRESENT, False))


def switch() -> None:
    """The sidebar's switch; a link's present=1 turns it on for the session it opens.

    The mode itself is kept apart from the switch (PRESENT, not the widget's key): opening a slide switches
    pages without the browser's widget values, and a widget's value would be lost there."""
    if PRESENT not in st.session_state:
        st.session_state[PRESENT] = st.query_params.get("present") == "1"
    st.session_state[SWITCH] = presenting()  # set before it is drawn: the switch shows the mode
    st.toggle(
        "Presenter mode",
        key=SWITCH,
        on_change=_switched,
        help="Large type, one view at a time, a bar with every page and the slides; keys to step (← → ↑ ↓, Page "
        "Up / Page Down); Shift+P turns it on and off, Esc leaves it. In every link made meanwhile.",
    )


def _switched() -> None:
    st.session_state[PRESENT] = bool(st.session_state[SWITCH])


def style() -> None:
    st.html(ALWAYS_CSS + (PRESENTER_CSS if presenting() else ""))


def keys(pages: dict[str, Any]) -> None:
    """The keys the browser keeps (KEYS_JS), and the slide they or a button asked for, opened before the page
    runs. Call it in the shell after st.navigation and before the page. pages: url path -> st.Page."""
    slides = st.session_state.get(DECK, [])
    if st.session_state.pop(STALE_CLICK, False) and st.session_state.get(SHOWING) is not None:
        _go(st.session_state[SHOWING])  # a click on the page a slide replaced: the slide stays on screen
    cookie = ROOM_COOKIES[presenting()]
    if ROOM not in st.session_state:  # a new session: the width the browser measured on its last visit
        _store_room(st.context.cookies.get(cookie))
    data = {
        "showing": st.session_state.get(SHOWING) if slides else None,  # the slide about to open, if one is
        "n": len(slides),
        "seq": int(st.session_state.get(KEYS_SEQ, 0)),
        "present": presenting(),
        "room": st.session_state.get(ROOM),
        "cookie": cookie,
    }
    with st.container(key="tformer-keys"):  # hidden: it draws nothing
        result = _keys_component(
            key="_tformer.keys", data=data, on_command_change=_command, on_room_change=_ignore, height=0
        )
    _store_room(result.get("room") if hasattr(result, "get") else None)
    target = st.session_state.pop(GOTO, None)
    if target is not None and target < len(slides):
        show(target, slides, pages)


def _store_room(px: Any) -> None:
    """Keep the main column's width the browser reported (a number, or the cookie's text), if it is one."""
    try:
        value = int(float(px))
    except (TypeError, ValueError, OverflowError):
        return
    if MIN_ROOM <= value <= MAX_ROOM:
        st.session_state[ROOM] = value


def _ignore() -> None:
    """The room's callback: none needed (a callback names the state values the element keeps)."""


def room() -> int:
    """The width of the page's main column in CSS pixels, as the browser last measured it (DEFAULT_ROOM before it
    did, and in tests without a browser): charts size themselves to it, so they fit at 1280 px and grow at 1920."""
    return int(st.session_state.get(ROOM, DEFAULT_ROOM))


def _command() -> None:
    """A command from KEYS_JS (a callback: it runs before the script): acted on once, whatever came first."""
    command = (st.session_state.get("_tformer.keys") or {}).get("command")
    if not isinstance(command, dict) or not isinstance(command.get("seq"), int):
        return
    if command["seq"] <= st.session_state.get(KEYS_SEQ, 0):
        return
    st.session_state[KEYS_SEQ] = command["seq"]
    if isinstance(command.get("present"), bool):
        st.session_state[PRESENT] = command["present"]
    showing = st.session_state.get(SHOWING)
    if isinstance(command.get("slide"), int) and showing is not None and command["slide"] != showing:
        _go(command["slide"])


def bar(page_path: str, pages: dict[str, Any]) -> None:
    """Presenter mode's slim bar above the page: every page, the slides (◀ k of n ▶, or present them) and the
    way out, by mouse or keyboard (Tab reaches them; Shift+P and Esc leave). Nothing outside presenter mode."""
    if not presenting():
        return
    slides = st.session_state.get(DECK, [])
    showing = st.session_state.get(SHOWING)
    with st.container(key="tformer-bar", horizontal=True, gap="small", vertical_alignment="center"):
        with st.container(key="tformer-bar-pages", horizontal=True, gap="small", vertical_alignment="center"):
            for path, page in pages.items():
                if path not in SHORT_TITLES:
                    continue
                if path != page_path:
                    st.page_link(page, label=SHORT_TITLES.get(path, getattr(page, "title", path)))
                else:
                    st.markdown(f"**{escape(SHORT_TITLES.get(path, path))}**")
        if slides and showing is None:
            st.button(f"Present the slides ({len(slides)})", key="_tformer.bar.start", on_click=_go, args=(0,))
        elif slides and isinstance(showing, int):
            st.button("◀", key="_tformer.bar.prev", on_click=_go, args=(showing - 1,), disabled=showing == 0)
            st.markdown(f"Slide {showing + 1} of {len(slides)}")
            last = showing >= len(slides) - 1
            st.button("▶", key="_tformer.bar.next", on_click=_go, args=(showing + 1,), disabled=last)
            st.button("Stop", key="_tformer.bar.stop", on_click=_stop)
        st.button(
            "Leave presenter mode",
            key="_tformer.bar.leave",
            on_click=_leave,
            help="Esc or Shift+P. Shift+P turns it on again; the sidebar's switch too.",
        )


def _go(i: int) -> None:
    """Show slide i (clamped to the deck) from the next run on: `keys` opens it before the page runs."""
    slides = st.session_state.get(DECK, [])
    if slides:
        st.session_state[SHOWING] = st.session_state[GOTO] = min(max(int(i), 0), len(slides) - 1)


def _stop() -> None:
    st.session_state[SHOWING] = None


def _leave() -> None:
    st.session_state[PRESENT] = False


def settings_box(label: str) -> Any:
    """Where a page's inputs and settings go: in presenter mode a closed expander (the first screen shows the
    view, not the controls: the keys step it), else the page itself (None)."""
    return st.expander(label, expanded=False) if presenting() else None


def sidebar_state() -> str:
    """The sidebar as a page opens: collapsed on a projector (its ">" opens it), else Streamlit's choice."""
    if PRESENT not in st.session_state:
        st.session_state[PRESENT] = st.query_params.get("present") == "1"
    return "collapsed" if presenting() else "auto"


def chart_fonts(spec: dict) -> dict:
    """A chart as presenter mode draws it, else as it is: its type 1.5 times larger (axis, legend and title
    fonts); a chart drawn at its own size (a heatmap of a lesson's matrix) 1.5 times larger with the numbers in
    its cells, unless its builder sized it for presenter mode already (usermeta "scale")."""
    if not presenting():
        return spec
    size = {"labelFontSize": round(11 * FONT_SCALE), "titleFontSize": round(11 * FONT_SCALE)}
    config = dict(spec.get("config") or {})
    for part in ("axis", "legend", "header"):
        config[part] = {**size, **config.get(part, {})}
    config["title"] = {"fontSize": round(13 * FONT_SCALE), **config.get("title", {})}
    config["text"] = {"fontSize": round(11 * FONT_SCALE), **config.get("text", {})}
    own_size = (spec.get("autosize") or {}).get("type") == "pad"
    if own_size and "scale" not in (spec.get("usermeta") or {}):
        spec = _enlarged(spec, FONT_SCALE)
    return {**spec, "config": config}


def _enlarged(spec: dict, k: float) -> dict:
    """The chart k times larger: its width and height (so its cells), and the text its layers print."""
    out = {**spec, "usermeta": {**(spec.get("usermeta") or {}), "scale": k}}
    for side in ("width", "height"):
        if isinstance(out.get(side), (int, float)):
            out[side] = round(out[side] * k)
    layers = []
    for layer in out.get("layer", []):
        mark = layer.get("mark")
        if isinstance(mark, dict) and mark.get("type") == "text" and isinstance(mark.get("fontSize"), (int, float)):
            layer = {**layer, "mark": {**mark, "fontSize": round(mark["fontSize"] * k)}}
        layers.append(layer)
    if "layer" in out:
        out["layer"] = layers
    return out


def table(data: Any, where: Any = st) -> None:
    """A table of numbers: a data grid, or in presenter mode an HTML table whose type grows with the presenter's
    (a grid draws its cells on a canvas at its own size)."""
    if presenting():
        where.table(data)
    else:
        where.dataframe(data)


def scale() -> float:
    """How much larger charts are drawn: 1.5 in presenter mode, else 1."""
    return FONT_SCALE if presenting() else 1.0


def cell_size(n: int, share: float = 1.0, most: int = 56) -> int:
    """Pixels per cell of a heatmap n cells wide drawn in `share` of the main column (`room`), its labels and
    legend beside it: at least 12 (every label still shows), at most `most` (1.5 times that in presenter mode).
    So a heatmap fits its column at 1280 px and grows on a wider screen."""
    plot = room() * share - HEATMAP_MARGIN_PX
    return int(max(12, min(most * scale(), plot // max(n, 1))))


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
    with st.container(horizontal=True, gap="small", key=f"{url.page}.{name}.steps", width="content"):
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

    return url.callback(act)


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

    return url.callback(act)


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
            st.button(
                "Present from slide 1",
                key="_tformer.deck.start",
                on_click=_go,
                args=(0,),
                help="Page Up / Page Down then move through the slides (a clicker sends them).",
            )
            return
        st.caption(f"Slide {showing + 1} of {len(slides)}")
        st.button("◀", key="_tformer.deck.prev", on_click=_go, args=(showing - 1,), disabled=showing == 0)
        st.button("▶", key="_tformer.deck.next", on_click=_go, args=(showing + 1,), disabled=showing >= len(slides) - 1)
        st.button("Stop", key="_tformer.deck.stop", on_click=_stop)


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


# ---- a page's first screen on a projector -----------------------------------------------------------------
SCREEN_PAD_PX = 88  # the main column's padding in presenter mode (PRESENTER_CSS): 1280 px leave a room of 1192


def first_line(label: str) -> tuple[Any, Any]:
    """Presenter mode's one line under a page's title: (an empty slot for the page's key idea, the page's closed
    settings (`settings_box(label)`)) side by side; (None, None) outside presenter mode."""
    if not presenting():
        return None, None
    idea, box = st.columns([3, 1], vertical_alignment="top")
    with box:
        settings = settings_box(label)
    return idea.empty(), settings


def folded(settings: Any) -> Any:
    """A `with` block for a page's inputs: inside `settings_box`'s closed expander when it gave one, else on the
    page."""
    return settings if settings is not None else contextlib.nullcontext()


def screen_height() -> int:
    """The window's height in CSS px, as a 16:9 screen as wide as the room has it (a projector; the browser sends
    only the main column's width): 720 for a room of 1192 px."""
    return round((room() + SCREEN_PAD_PX) * 9 / 16)
