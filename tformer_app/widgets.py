"""Widgets several pages share: the model chooser, and choices of tokens that follow the input."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import streamlit as st

from tformer_core.checkpoints.errors import CheckpointError
from tformer_core.checkpoints.sources import display_name, local_model_names

from . import session_models
from .markdown import escape
from .url import UrlState

OTHER = "__other__"


def short_name(source: str) -> str:
    """A local model's name as the lists show it ("models/deit-tiny-patch16-224") for a path to it (an old
    link); any other source as it is. The path itself is never shown."""
    if not source.startswith(("/", "./", "../", "~")):
        return source
    try:
        return display_name(source)
    except CheckpointError:
        return source  # outside the model folders: the loader refuses it with its own message


def replace_model(url: UrlState, unavailable: str, instead: str) -> None:
    """Show `instead` wherever `unavailable` was chosen (in the link, or in this session's box); call it
    before `choose_model` draws the box, so that the box and the link name the model actually shown."""
    url.key("model", instead)
    if short_name(str(url.value("model")).strip()) == unavailable:
        url.set("model", instead)
    choice_key = f"{url.page}.model_choice"
    if st.session_state.get(choice_key) == unavailable:
        st.session_state[choice_key] = instead


def choose_model(url: UrlState, suggestions: Sequence[str], default: str, placeholder: str, help: str) -> str:
    """A bundled or suggested model, a local folder, or any hub id typed in; returns the source.

    The choice is kept in the URL as "model"; the loader validates whatever was typed.
    """
    url.key("model", default)
    current = short_name(str(url.value("model")).strip() or default)
    # This session's models from the Train page come last (no other session lists or loads them).
    options = list(dict.fromkeys([*suggestions, *local_model_names(), *session_models.names()])) + [OTHER]
    choice_key, other_key = f"{url.page}.model_choice", f"{url.page}.model_other"
    if choice_key not in st.session_state:
        st.session_state[choice_key] = current if current in options else OTHER
        st.session_state[other_key] = "" if current in options else current
    left, right = st.columns([1, 1])
    choice = left.selectbox(
        "Model",
        options,
        key=choice_key,
        help=help,
        format_func=lambda o: "Another hub id or local folder…" if o == OTHER else o,
    )
    source = choice
    if choice == OTHER:
        typed = right.text_input("Hub id or folder", key=other_key, placeholder=placeholder)
        source = typed.strip() or default
    url.set("model", source)
    return source


def following_choice(
    url: UrlState,
    name: str,
    label: str,
    options: Sequence[int],
    labels: Sequence[str],
    default: int,
    *,
    follow_default: bool = False,
    where: Any = st,
    help: str | None = None,
) -> int:
    """A selectbox over positions (tokens, keys) whose labels depend on the input, kept in the link as `name`.

    It always shows the labels of the current input: the widget is keyed by the labels, so a new sentence
    makes a new box (Streamlit otherwise keeps showing the old text of the chosen position). When the
    input changes, the choice follows its token: the same token if the new input has it, else `default`,
    and the page says so. follow_default: until the user picks one, the choice is `default` on every run
    (e.g. the strongest key, which changes with the head).
    """
    options = [int(o) for o in options]
    state = url.key(name, default, choices=options)
    digest = hashlib.blake2b("\0".join(labels).encode(), digest_size=8).hexdigest()
    picked = f"{state}.picked"  # the user (or a link) chose this value
    if picked not in st.session_state:
        st.session_state[picked] = bool(url.incoming and name in url.incoming)
    previous, remembered = st.session_state.get(f"{state}.digest"), st.session_state.get(f"{state}.label")
    value = st.session_state[state]
    if previous not in (None, digest):  # a new input: follow the token, not the position
        same = [o for o in options if labels[o] == remembered]
        if st.session_state[picked]:  # the user's own choice: keep the word, or say why it changed
            value = same[0] if same else default
            if not same:
                where.caption(f"{escape(remembered)} is not in the new input: now {value} ({escape(labels[value])}).")
        else:
            value = default
        st.session_state[picked] = bool(same) and st.session_state[picked]
    elif follow_default and not st.session_state[picked]:
        value = default
    widget = f"{state}@{digest}"

    def chose() -> None:
        st.session_state[picked] = True
        st.session_state[state] = st.session_state[widget]

    if widget in st.session_state:
        st.session_state[widget] = value  # set before the box is drawn: it shows what the state says
        kwargs: dict[str, Any] = {}
    else:
        kwargs = {"index": options.index(value)}
    choice = where.selectbox(
        label, options, format_func=lambda i: f"{i}: {labels[i]}", key=widget, on_change=chose, help=help, **kwargs
    )
    st.session_state[state] = choice
    st.session_state[f"{state}.digest"], st.session_state[f"{state}.label"] = digest, labels[choice]
    return int(choice)


def choose_token(url: UrlState, name: str, value: int) -> None:
    """Choose position `value` for the `following_choice` box `name` from code (a click on a chart), as if
    the user had picked it (a callback: it runs before the page is drawn again)."""
    state = f"{url.page}.{name}"
    st.session_state[state] = int(value)
    st.session_state[f"{state}.picked"] = True
