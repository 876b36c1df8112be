"""Page state in the URL: every widget a page registers is mirrored in the query string, so a link
reproduces the view (a lecturer puts it on a slide; a student opens exactly that)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from .markdown import escape


class UrlState:
    """Widget values mirrored in the URL's query parameters, so a view can be shared by its link.

        url = UrlState("text")                      # one per page; widget keys become "text.<name>"
        st.text_input("Sentence", key=url.key("q", default="The cat sat."))
        ...
        url.publish()                               # after the widgets: write them into the URL

    On a session's first visit, a value found in the URL (and valid for `cast` / `choices`) seeds
    the widget; afterwards the widget's own state rules and the URL follows it.
    """

    def __init__(self, page: str) -> None:
        self.page = page
        self.names: list[str] = []

    def key(
        self, name: str, default: Any, cast: Callable[[str], Any] | None = None, choices: Sequence[Any] | None = None
    ) -> str:
        widget_key = f"{self.page}.{name}"
        if name not in self.names:
            self.names.append(name)
        if widget_key not in st.session_state:
            value = default
            raw = st.query_params.get(name)
            if raw is not None:
                value = _parse(raw, default, cast)
                if choices is not None and value not in choices:
                    value = default
            st.session_state[widget_key] = value
        elif choices is not None and st.session_state[widget_key] not in choices:
            st.session_state[widget_key] = default  # e.g. a head index beyond a newly loaded model's heads
        return widget_key

    def value(self, name: str) -> Any:
        return st.session_state[f"{self.page}.{name}"]

    def set(self, name: str, value: Any) -> None:
        st.session_state[f"{self.page}.{name}"] = value

    def publish(self) -> None:
        """Write every registered value into the URL (replacing the query string)."""
        params = {name: _format(st.session_state[f"{self.page}.{name}"]) for name in self.names}
        if dict(st.query_params) != params:
            st.query_params.from_dict(params)


def int_key(url: UrlState, name: str, default: int, lo: int, hi: int) -> str:
    """A URL-backed key for a number input limited to lo..hi.

    A value from a link outside lo..hi is clamped, with a warning (a number input given an
    out-of-range value would raise).
    """
    key = url.key(name, default)
    value = st.session_state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        fixed = min(max(int(value), lo), hi) if isinstance(value, (int, float)) else default
        st.warning(f"{escape(name)} = {escape(value)} is outside {lo}..{hi}; using {fixed}.")
        st.session_state[key] = fixed
    return key


def int_list(raw: str) -> list[int]:
    """A URL value "1,4,7" as [1, 4, 7] (UrlState's `cast` for lists of numbers that may start empty)."""
    return [int(s) for s in raw.split(",") if s.strip()]


def _parse(raw: str, default: Any, cast: Callable[[str], Any] | None) -> Any:
    try:
        if cast is not None:
            return cast(raw)
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, (list, tuple)):
            items = [s for s in raw.split(",") if s != ""]
            kind = type(default[0]) if default else str
            return [kind(s) for s in items]
        return raw
    except (TypeError, ValueError):
        return default


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
