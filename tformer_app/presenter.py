"""Presenter mode, keyboard steps and a deck of prepared views: the app on a projector, driven with a clicker.

    presenter.keys(pages)               # the keys the browser keeps (Page Up / Down on a deck, Shift+P, Esc)
    presenter.switch()                  # the sidebar's switch (and ?present=1 in any link)
    presenter.style()                   # large type, one view per screen, no toolbar (when on)
    presenter.bar(page_path, pages)     # presenter mode's slim bar: every page, the slides, the way out
    presenter.stepper(url, steps)       # buttons with keys: ← → / Page Up, Page Down / ↑ ↓

The deck of slides itself (save this view as a slide, reorder, present, export / import) is tformer_app.decks'.

Keys that change the slide are counted in the browser (`KEYS_JS`), not by buttons: a slide change takes a
second, and a button pressed meanwhile acts on the page still on screen (its ◀ disabled on slide 1, its
page about to go). The browser sends the slide it wants (a number, not "one more"), so presses made during
a change add up and the deck ends where the keys say.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import streamlit as st
import streamlit.components.v2 as components

from .decks import DECK, GOTO, SHOWING, restore, show
from .decks import go as _go  # the bar's and the keys' way to a slide
from .decks import stop as _stop
from .markdown import escape
from .url import PRESENT_STATE, STALE_CLICK, UrlState

PRESENT = PRESENT_STATE  # session state; "present=1" in links
SWITCH = "_tformer.present.switch"  # the sidebar's switch (a widget: it shows PRESENT, and sets it)
KEYS_SEQ = "_tformer.keys.seq"  # session state: the last key command the server acted on
ROOM = "_tformer.room"  # session state: the main column's width in CSS pixels, as the browser measured it
MEASURED = "_tformer.room.measured"  # session state: set by the width's callback, for the run it starts
MEASURE_RUN = "_tformer.room.measure_run"  # session state: True during a run the width's measure asked for
DEFAULT_ROOM = 900  # the main column of a 1280-px window with the sidebar open, until the browser says
MIN_ROOM, MAX_ROOM = 200, 6000
ROOM_COOKIES = {False: "tformer_room", True: "tformer_room_presenting"}  # the width last measured, per mode
FONT_SCALE = 1.5  # presenter type against the app's own
HEATMAP_MARGIN_PX = 200  # beside a heatmap's cells: its token labels, axis titles, colour legend and padding
# The groups of app.py's pages as presenter mode's bar names them (a group not named here, Home's, has no label).
BAR_GROUPS = {"Learn": "Learn", "Explore": "Explore", "Interpret": "Interpret"}  # Train's one page says it
# Short names of the pages for presenter mode's bar (url path -> label): every page fits one row at 1280 px.
# Pages not named here (the operator's hidden page) are not in the bar.
SHORT_TITLES = {
    "": "Home",
    "early": "Before",
    "step-by-step": "Step by step",
    "positional": "Positional",
    "block": "Block",
    "text": "Text",
    "seq2seq": "Enc-dec",
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
/* The bar stays at the top as the page scrolls: Streamlit wraps it in a box of its own height, so that box
   is what sticks (a sticky element moves only within its parent). */
[data-testid="stLayoutWrapper"]:has(> .st-key-tformer-bar) { position: sticky; top: 0; z-index: 99; }
.st-key-tformer-bar { background: var(--st-background-color, #fff);
  border-bottom: 1px solid rgba(49, 51, 63, 0.2); padding: 0.1rem 0 0.3rem; gap: 0.4rem; }
.st-key-tformer-bar p, .st-key-tformer-bar [data-testid="stMarkdownContainer"] p { font-size: 15px; line-height: 1.2; }
.st-key-tformer-bar [data-testid="stPageLink"] a { padding: 0.1rem 0.2rem; gap: 0; }
.st-key-tformer-bar [data-testid="stPageLink"] a > span:has(> [data-testid^="stIcon"]) { display: none; }
/* A group's name, small and grey, before its pages; the page on screen in a pill. */
.st-key-tformer-bar [data-testid="stCaptionContainer"] p { font-size: 11px; text-transform: uppercase;
  letter-spacing: 0.04em; margin: 0 0 0 0.4rem; }
.st-key-tformer-bar-here { background: rgba(255, 75, 75, 0.12); border-radius: 0.5rem; padding: 0.15rem 0.4rem; }
/* One row: every page fits at 1280 px (short names, no icons); on a narrower screen the links scroll sideways in
   their own strip (Tab and a click bring a link into view), the slide controls and the way out stay at the
   right; a second row would push the view below a 720-px projector's first screen. */
.st-key-tformer-bar { flex-wrap: nowrap !important; }
.st-key-tformer-bar-pages { flex-wrap: nowrap !important; overflow-x: auto; overflow-y: hidden; min-width: 0;
  flex: 1 1 0 !important; min-height: 2.3rem; align-items: center; scrollbar-width: thin; gap: 0.15rem; }
.st-key-tformer-bar-pages > * { flex: 0 0 auto !important; width: auto !important; }
.st-key-tformer-bar button { min-height: 1.9rem; padding: 0.1rem 0.5rem; }
/* The line below the title: the key idea (20 px: one line at 1280 px), the keys, the settings' button. The
   settings open over the view, wide enough for a model box beside a sentence. */
.st-key-tformer-top [data-testid="stMarkdownContainer"] p { font-size: 20px; line-height: 1.3; }
.st-key-tformer-top { min-height: 2.4rem; flex-wrap: nowrap !important; }
/* The idea takes the room the keys leave and stays one line (a longer one ends in "…"), the row one row. */
.st-key-tformer-top > :first-child { flex: 1 1 0 !important; min-width: 0; }
.st-key-tformer-top > :first-child p { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
@media (max-width: 700px) {  /* a phone: the idea on a line of its own, the keys and settings under it */
  .st-key-tformer-top { flex-wrap: wrap !important; }
  .st-key-tformer-top > :first-child { flex: 1 1 100% !important; }
  .st-key-tformer-top > :first-child p { white-space: normal; }
}
.st-key-tformer-top button p, .st-key-tformer-top button { font-size: 16px !important; }
[data-testid="stPopoverBody"] { min-width: min(760px, 92vw); }
</style>"""
# On every page: the keys' element draws nothing and takes no room; the page starts just below the header bar
# (Streamlit leaves 6rem), so that a 720-px projector's first screen holds more than the controls.
ALWAYS_CSS = """<style>.st-key-tformer-keys { display: none; }
[data-testid="stMain"] [data-testid="stMainBlockContainer"] { padding-top: 3.75rem; }
[data-testid="stMain"] h1 { padding-top: 0.25rem; }
/* A slide's row in the sidebar: its title (cut with "…" when long) and its ↑ ↓ ✕ on one line. */
[class*="st-key-tformer-slide-"] { flex-wrap: nowrap !important; align-items: center; }
[class*="st-key-tformer-slide-"] > :first-child { flex: 1 1 0 !important; min-width: 0; }
[class*="st-key-tformer-slide-"] > :first-child p { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
[class*="st-key-tformer-slide-"] > :not(:first-child) { flex: 0 0 auto !important; width: auto !important; }
</style>"""
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
  // An arrow on a focused radio, checkbox or closed select of the page's settings would change that setting (an
  // uploaded picture's "Upload" switched back to "Sample" and the upload lost): on a page with step keys, the
  // arrows step the view instead. The setting loses the focus and the key goes to the page, as if pressed there.
  const settingTarget = (t) => t && t !== document.body && !t.closest('[class*="-steps"]') && (
    t.type === "radio" || t.type === "checkbox" || t.getAttribute("role") === "radio" ||
    t.getAttribute("role") === "checkbox" || t.getAttribute("role") === "switch" ||
    (t.getAttribute("role") === "combobox" && t.getAttribute("aria-expanded") !== "true"));
  const ARROWS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"];
  document.addEventListener("keydown", (e) => {
    if (!e.isTrusted || !ARROWS.includes(e.key) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (!settingTarget(e.target) || document.querySelector('[role="listbox"]')) return;  // a list open: its own
    if (!document.querySelector('[class*="st-key-"][class*="-steps"]')) return;
    e.preventDefault(); e.stopImmediatePropagation();
    e.target.blur();
    document.body.dispatchEvent(new KeyboardEvent("keydown", {
      key: e.key, code: e.code, shiftKey: e.shiftKey, bubbles: true, cancelable: true }));
  }, true);
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
    slides = restore(pages)  # this browser's saved deck, found on a session's first run: the bar, drawn next, shows it
    st.session_state[MEASURE_RUN] = st.session_state.pop(MEASURED, False)  # this run's, read by `measure_run`
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
            key="_tformer.keys", data=data, on_command_change=_command, on_room_change=_measured, height=0
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


def _measured() -> None:
    """The room's callback: this run was asked for by the browser's measure of the main column, not by the user
    (`measure_run`)."""
    st.session_state[MEASURED] = True


def measure_run() -> bool:
    """True when this run came from the browser's measure of the page's width alone (KEYS_JS), sent by whatever page
    that browser shows: it may be the page a student's browser is leaving as the class moves on, and it is not the
    user's choice of that page (tformer_app.class_session's fork check leaves it alone)."""
    return bool(st.session_state.get(MEASURE_RUN, False))


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


def bar(page_path: str, sections: dict[str, list[Any]]) -> None:
    """Presenter mode's slim bar above the page: every page in its group (Learn, Explore, ...), the current one
    marked, the slides (◀ k of n ▶, or present them) and the way out, by mouse or keyboard (Tab reaches them;
    Shift+P and Esc leave). It stays at the top as the page scrolls. Nothing outside presenter mode.
    sections: app.py's groups of st.Page (group name -> pages); pages not in SHORT_TITLES are left out."""
    if not presenting():
        return
    slides = st.session_state.get(DECK, [])
    showing = st.session_state.get(SHOWING)
    with st.container(key="tformer-bar", horizontal=True, gap=None, vertical_alignment="center"):
        with st.container(key="tformer-bar-pages", horizontal=True, gap=None, vertical_alignment="center"):
            for group, pages in sections.items():
                shown = [p for p in pages if p.url_path in SHORT_TITLES]
                if not shown:
                    continue
                if group in BAR_GROUPS:
                    st.caption(BAR_GROUPS[group])
                for page in shown:
                    label = SHORT_TITLES[page.url_path]
                    if page.url_path != page_path:
                        st.page_link(page, label=label, help=page.title)
                    else:
                        with st.container(key="tformer-bar-here", width="content"):
                            st.markdown(f"**{escape(label)}**")
        if slides and showing is None:
            st.button(f"Present the slides ({len(slides)})", key="_tformer.bar.start", on_click=_go, args=(0,))
        elif slides and isinstance(showing, int):
            st.button("◀", key="_tformer.bar.prev", on_click=_go, args=(showing - 1,), disabled=showing == 0)
            st.markdown(f"Slide {showing + 1}/{len(slides)}")
            last = showing >= len(slides) - 1
            st.button("▶", key="_tformer.bar.next", on_click=_go, args=(showing + 1,), disabled=last)
            st.button("Stop", key="_tformer.bar.stop", on_click=_stop)
        st.button(
            "Leave",
            key="_tformer.bar.leave",
            on_click=_leave,
            help="Leave presenter mode (Esc or Shift+P). Shift+P turns it on again; the sidebar's switch too.",
        )


def _leave() -> None:
    st.session_state[PRESENT] = False


TOP = "_tformer.top"  # session state: this run's top line (TopLine), or None; reset as each page starts


@dataclass(frozen=True)
class TopLine:
    """Presenter mode's one line below a page's title: its key idea, its keys, its settings folded away."""

    idea: Any  # st.empty(): the page's key idea in one line, once the page knows it
    keys: Any  # a container for the page's step buttons (the keys a clicker or the arrows press)
    settings: Any  # st.popover: the page's inputs and settings


def new_page() -> None:
    """A page's run starts (tformer_app.page.run_page): no top line yet."""
    st.session_state[TOP] = None


def settings_box(label: str) -> Any:
    """Where a page's inputs and settings go: in presenter mode a "Settings" popover at the end of one line below
    the title, with the page's key idea (`idea`) and its keys (`keys_place`) before it, so the first screen of a
    projector shows the view the keys change, not the controls; else the page itself (None).
    label: what the settings hold (the popover button's tooltip)."""
    if not presenting():
        return None
    if isinstance(st.session_state.get(TOP), TopLine):  # asked again in this run: the one line's settings
        return st.session_state[TOP].settings
    with st.container(horizontal=True, vertical_alignment="center", gap="small", key="tformer-top"):
        idea = st.empty()
        keys = st.container(horizontal=True, width="content", gap="small")
        box = st.popover("Settings", icon=":material/tune:", help=label, key="_tformer.top.settings")
    st.session_state[TOP] = TopLine(idea, keys, box)
    return box


def _top() -> TopLine | None:
    top = st.session_state.get(TOP)
    return top if presenting() and isinstance(top, TopLine) else None


def idea(markdown: str) -> None:
    """The page's key idea, in presenter mode, on the line below the title (markdown: escaped by the caller).
    Elsewhere nothing: the page says it in its own words."""
    top = _top()
    if top is not None:
        top.idea.markdown(markdown)


def keys_place() -> Any:
    """Where the page's main step buttons go: presenter mode's top line, else where the page draws (None)."""
    top = _top()
    return None if top is None else top.keys


def sidebar_state() -> Literal["collapsed", "auto"]:
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


def stepper(
    url: UrlState, name: str, steps: Sequence[Step], paging: tuple[Callable, Callable] | None = None, where: Any = None
) -> None:
    """A row of step buttons with their keys, and, unless a deck is being presented (the clicker then moves
    the slides), hidden Page Up / Page Down buttons doing `paging` (previous, next). where: a container to draw
    them in (`keys_place()`: presenter mode's top line), else here."""
    with (
        where if where is not None else contextlib.nullcontext(),
        st.container(horizontal=True, gap="small", key=f"{url.page}.{name}.steps", width="content"),
    ):
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


# ---- a page's first screen on a projector -----------------------------------------------------------------
SCREEN_PAD_PX = 88  # the main column's padding in presenter mode (PRESENTER_CSS): 1280 px leave a room of 1192


def first_line(label: str) -> tuple[Any, Any]:
    """Presenter mode's one line under a page's title: (the slot for the page's key idea, the page's settings
    (`settings_box(label)`)); (None, None) outside presenter mode."""
    settings = settings_box(label)
    top = _top()
    return (None, None) if top is None else (top.idea, settings)


def folded(settings: Any) -> Any:
    """A `with` block for a page's inputs: inside `settings_box`'s popover when it gave one, else on the page."""
    return settings if settings is not None else contextlib.nullcontext()


def screen_height() -> int:
    """The window's height in CSS px, as a 16:9 screen as wide as the room has it (a projector; the browser sends
    only the main column's width): 720 for a room of 1192 px."""
    return round((room() + SCREEN_PAD_PX) * 9 / 16)
