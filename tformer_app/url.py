"""Page state in the URL: every widget a page registers is mirrored in the query string, so a link
reproduces the view (a lecturer puts it on a slide; a student opens exactly that).

A link is input like any other: every value read from it is checked against what its widget accepts
(a number within the widget's range, an option that exists, a finite number), and a value that is
changed or dropped is said on the page in one line, as are parameters the page does not know. A value
too long to travel in a link (a pasted essay) stays out of it, with a note: servers and proxies refuse
addresses past a few kilobytes.
"""

from __future__ import annotations

import functools
import logging
import math
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from .markdown import escape

MAX_LINK_VALUE = 2000  # characters of one value, URL-encoded, that a link carries
MAX_LINK = 6000  # characters of the whole query string (nginx's default header buffer is 8 KB)
PRESENT_STATE = "_tformer.present"  # presenter mode (tformer_app.presenter): "present=1" in every link
PRESENT_PARAM = "present"  # the link's parameter for it
CUT = "cut"  # the link's parameter naming the values too long for it (left out; `notices`)
_KEYS = "_tformer.url_keys"  # every session-state key a page's UrlState manages, to forget them all at once
STALE_CLICK = "_tformer.stale_click"  # session state: a callback of a page whose view was forgotten was dropped
WRITTEN = "_tformer.url_written"  # session state: the link a page wrote last, and the widget keys behind it
log = logging.getLogger("tformer_app")


class UrlState:
    """Widget values mirrored in the URL's query parameters, so a view can be shared by its link.

        url = UrlState("text")                      # one per page; widget keys become "text.<name>"
        st.text_input("Sentence", key=url.key("q", default="The cat sat."))
        ...
        url.publish()                               # after the widgets: write them into the URL

    On a session's first visit, a value found in the URL (and valid for `cast` / `choices` / `lo`..`hi`)
    seeds the widget; afterwards the widget's own state rules and the URL follows it.
    """

    def __init__(self, page: str) -> None:
        self.page = page
        self.names: list[str] = []
        self._notes_key = f"{page}.__link_notes"
        self._link_key = f"{page}.__link"
        if self._notes_key not in st.session_state:  # the session's first visit
            st.session_state[self._notes_key] = []
            st.session_state[self._link_key] = dict(st.query_params)
        # What the link brought, read until the page has drawn once in full (`publish`): a first run cut short by
        # another (a click, the browser's first measure of the page) must not lose it. Later runs write the URL.
        self.incoming: dict[str, str] | None = st.session_state.get(self._link_key)
        self.left_out: list[str] = []  # this run's values too long for the link
        self.omitted: dict[str, Any] = {}  # name -> default: left out of the link while the value is its default
        self.described: dict[str, str] = {}  # name -> how the page's notes call it ("your edits of X")
        self._waiting: str | None = None  # what the page waits for before its other settings (`wait_for`)
        self._undrawn: set[str] = set()  # settings this run does not draw (`undrawn`)

    @property
    def notes(self) -> list[str]:
        """One line per value of the link that was changed or dropped (Markdown, escaped)."""
        return st.session_state[self._notes_key]

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def key(
        self,
        name: str,
        default: Any,
        cast: Callable[[str], Any] | None = None,
        choices: Sequence[Any] | None = None,
        lo: float | None = None,
        hi: float | None = None,
        omit_default: bool = False,
    ) -> str:
        """The widget key for `name`, its value seeded from the link on the first visit.

        cast: how to read the URL's string (default: from the type of `default`). choices: the values the
        widget offers (a list value keeps only its items among them). lo, hi: a number's range (clamped).
        omit_default: the link carries the value only when it differs from `default` (an edit of a table).
        """
        widget_key = f"{self.page}.{name}"
        first_this_run = name not in self.names
        if first_this_run:
            self.names.append(name)
        st.session_state.setdefault(_KEYS, set()).update((widget_key, self._notes_key, self._link_key))
        if omit_default:
            self.omitted[name] = default
        if widget_key not in st.session_state:
            value = default
            raw = self.incoming.get(name) if self.incoming is not None else None
            if raw is not None:
                value = self._from_link(name, raw, default, cast, choices, lo, hi)
            st.session_state[widget_key] = value
        elif choices is not None and not _allowed(current := st.session_state[widget_key], choices):
            # e.g. a head index beyond a newly loaded model's heads; a list keeps what is still offered
            st.session_state[widget_key] = (
                [v for v in current if v in choices] if isinstance(current, list) else default
            )
        elif lo is not None and hi is not None and not lo <= st.session_state[widget_key] <= hi:
            st.session_state[widget_key] = type(default)(min(max(st.session_state[widget_key], lo), hi))  # new limits
        elif first_this_run:
            # Every run tells the widgets their values: a value set here reaches the browser only with the run that
            # set it, and a box the browser mounts afresh later (a first run cut short by a click or the browser's
            # first measure; Streamlit mounting the page's boxes again) starts from its default, a number box
            # from its minimum, shows it and sends it back with the next change of any other widget (the lesson's
            # 8 x 8 image became 1 x 1). Told each run, a box shows the page's value at once.
            # Only at a run's first ask: a later one (a value read after its widget was drawn) may not set it.
            st.session_state[widget_key] = st.session_state[widget_key]
        return widget_key

    def _from_link(
        self,
        name: str,
        raw: str,
        default: Any,
        cast: Callable[[str], Any] | None,
        choices: Sequence[Any] | None,
        lo: float | None,
        hi: float | None,
    ) -> Any:
        shown = escape(_short(raw))
        fallback = escape(_format(default) or "none")  # the default the page uses instead, said in words when empty
        try:
            value = _parse(raw, default, cast)
        except (TypeError, ValueError, OverflowError):
            self._note(f"{escape(name)}={shown} is not a valid value; using {fallback}")
            return default
        if isinstance(value, float) and not math.isfinite(value):
            self._note(f"{escape(name)}={shown} is not a finite number; using {fallback}")
            return default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            clamped = min(max(value, lo), hi) if lo is not None and hi is not None else value
            if clamped != value:
                clamped = type(default)(clamped) if isinstance(default, (int, float)) else clamped
                self._note(f"{escape(name)}={shown} is outside {lo:g}..{hi:g}; using {escape(_format(clamped))}")
                value = clamped
        if choices is not None and isinstance(value, list):
            kept = [v for v in value if v in choices]
            if len(kept) != len(value):
                dropped = [v for v in value if v not in choices]
                self._note(f"{escape(name)}: left out {escape(_short(_format(dropped)))} (not offered here)")
            return kept
        if choices is not None and not _allowed(value, choices):
            self._note(f"{escape(name)}={shown} is not one of the choices here; using {fallback}")
            return default
        return value

    def value(self, name: str) -> Any:
        return st.session_state[f"{self.page}.{name}"]

    def callback(self, action: Callable[..., None]) -> Callable[..., None]:
        """`action` as a widget callback that tolerates the page having moved on.

        A widget's callback runs at the start of the next script run, whatever page that run shows. When a
        deck opened a slide meanwhile (`forget_pages`: this page's view forgotten), a click that the browser
        sent from the page still on screen reaches a page whose state is gone: the click is dropped (and
        `STALE_CLICK` set, so the shell can show the slide again) instead of failing with a KeyError.
        """

        @functools.wraps(action)
        def run(*args: Any, **kwargs: Any) -> None:
            if self._notes_key not in st.session_state:  # this page's view was forgotten
                _dropped(self.page, action, "its view was forgotten")
                return
            try:
                action(*args, **kwargs)
            except KeyError as error:
                if "st.session_state" not in str(error):
                    raise
                _dropped(self.page, action, str(error))

        return run

    def set(self, name: str, value: Any) -> None:
        st.session_state[f"{self.page}.{name}"] = value

    def publish(self, drawn: bool = True) -> None:
        """Write every registered value into the URL (replacing the query string).

        A value longer than MAX_LINK_VALUE characters (URL-encoded), or one that would take the link past
        MAX_LINK, is left out of the link, and `left_out` names it for the page to say so. drawn: the page
        drew in full (or stopped on purpose); until then the link stays the page's input.
        """
        if not drawn:
            return
        pending: dict[str, str] = {}
        if self.incoming is not None:
            unread = [n for n in self.incoming if n not in self.names and n not in (PRESENT_PARAM, CUT)]
            pending = {n: str(self.incoming[n]) for n in unread if n in self._undrawn}
            pending |= self._unread([n for n in unread if n not in self._undrawn])
        params, length = {}, 0
        for name in self.names:
            value = st.session_state[f"{self.page}.{name}"]
            if name in self.omitted and value == self.omitted[name]:
                continue
            text = _format(value)
            size = len(urllib.parse.quote_plus(text)) + len(name) + 2
            if size > MAX_LINK_VALUE or length + size > MAX_LINK:
                self.left_out.append(name)
                continue
            params[name], length = text, length + size
        if self.left_out:  # a link made now says what it could not carry
            params[CUT] = ",".join(self.left_out)
        params |= pending
        if st.session_state.get(PRESENT_STATE):
            params[PRESENT_PARAM] = "1"
        if dict(st.query_params) != params:
            st.query_params.from_dict(params)
        if not pending:
            st.session_state.pop(self._link_key, None)
        st.session_state[WRITTEN] = {
            "params": params,
            "keys": {name: f"{self.page}.{name}" for name in self.names},
            "omitted": dict(self.omitted),
        }

    def publish_part(self) -> None:
        """`publish` after a part of the page ran alone (tformer_app.page.part): the link written again from every
        setting's value now, as the whole run wrote it."""
        self.incoming = st.session_state.get(self._link_key)
        self.left_out = []
        self.publish()

    def wait_for(self, what: str) -> None:
        """The page stops before the settings that apply once `what` is there (an upload, which no link carries):
        the link's values it has not read yet are kept (in the link too) for when it is, and the page says why."""
        self._waiting = what

    def undrawn(self, *names: str) -> None:
        """Settings of this page that this run does not draw (a view not shown, presenter mode's one view off):
        a link's values for them are no error; they stay in the link, and apply when they are drawn (a slide
        saved with every view, presented one view at a time, keeps its heatmap's matrix for when it is shown)."""
        self._undrawn.update(names)

    def _unread(self, unknown: list[str]) -> dict[str, str]:
        """The note on the link's values this run did not read, with its true reason; returns those to keep."""
        assert self.incoming is not None
        names = escape(", ".join(_short(n, 40) for n in unknown))
        cut = [n for n in str(self.incoming.get(CUT, "")).split(",") if n]
        if cut:
            what = escape(", ".join(self.described.get(n, n) for n in cut))
            self._note(
                f"{what} did not fit in the link (too long for an address) and was left out, so the page shows its "
                "own" + (f"; {names} went with it and cannot be used" if unknown else "")
            )
        elif self._waiting is not None and unknown:
            self._note(
                f"{escape(self._waiting)} is not in links (it stays in the browser it came from): the link's "
                f"{names} apply once there is one here"
            )
            return {n: str(self.incoming[n]) for n in unknown}
        elif unknown:
            self._note(f"ignored {names} (not a setting of this page)")
        return {}


def foreseen_link() -> dict[str, str] | None:
    """The link the page on screen will write in this run, read at the run's start (before the page runs) from
    the link it wrote last and its widgets' values now: a click changed a widget's value before the run
    began. None when it cannot be told (no page wrote a link yet, a widget it drew is gone). A class session
    sends the lecturer's new view to the students with it, without waiting for the page to draw; what the page
    then writes is sent too if it differs (a change that moves other settings)."""
    written = st.session_state.get(WRITTEN)
    if not written:
        return None
    params = dict(written["params"])
    left_out = set(params.get(CUT, "").split(","))
    for name, key in written["keys"].items():
        if key not in st.session_state:
            return None
        value = st.session_state[key]
        if name in written["omitted"] and value == written["omitted"][name]:
            params.pop(name, None)
        elif name not in left_out and len(urllib.parse.quote_plus(text := _format(value))) <= MAX_LINK_VALUE:
            params[name] = text
    return params


def _dropped(page: str, action: Callable, why: str) -> None:
    log.info("a click on page %r (%s) came after the page moved on (%s): dropped", page, action.__name__, why)
    st.session_state[STALE_CLICK] = True


def forget_pages() -> None:
    """Forget every page's remembered view in this session, so that the next page opened takes its view from
    its link (a slide of a deck), as a first visit does. Widgets' own keys that follow (digests) go with them."""
    keys = st.session_state.get(_KEYS, set())
    for key in list(st.session_state.keys()):
        if key in keys or any(str(key).startswith(f"{k}.") or str(key).startswith(f"{k}@") for k in keys):
            del st.session_state[key]
    st.session_state[_KEYS] = set()


def notices(url: UrlState) -> str | None:
    """One line for the page about its link (values changed or dropped, values too long to share), or None."""
    parts = []
    if url.notes:
        parts.append("From the link: " + "; ".join(url.notes) + ".")
    if url.left_out:
        names = ", ".join(url.described.get(name, name) for name in url.left_out)
        parts.append(
            f"Not in the link (too long to share in an address): {escape(names)}; the link keeps the other settings."
        )
    return " ".join(parts) or None


def int_key(url: UrlState, name: str, default: int, lo: int, hi: int) -> str:
    """A URL-backed key for a number input limited to lo..hi (a value from a link is clamped, and said so)."""
    return url.key(name, default, cast=_whole, lo=lo, hi=hi)


def int_list(raw: str) -> list[int]:
    """A URL value "1,4,7" as [1, 4, 7] (UrlState's `cast` for lists of numbers that may start empty)."""
    return [int(s) for s in raw.split(",") if s.strip()]


def finite_float(raw: str) -> float:
    """A URL value as a finite number (UrlState's `cast`): "inf" or "nan" raise ValueError, so the default is used."""
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _whole(raw: str) -> int:
    return round(finite_float(raw))


def _allowed(value: Any, choices: Sequence[Any]) -> bool:
    if isinstance(value, list):
        return all(v in choices for v in value)
    try:
        return value in choices
    except TypeError:
        return False


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse(raw: str, default: Any, cast: Callable[[str], Any] | None) -> Any:
    if cast is not None:
        return cast(raw)
    if isinstance(default, bool):
        lowered = raw.lower()
        if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(raw)
        return lowered in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return _whole(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, (list, tuple)):
        items = [s for s in raw.split(",") if s != ""]
        kind = type(default[0]) if default else str
        return [kind(s) for s in items]
    return raw


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
