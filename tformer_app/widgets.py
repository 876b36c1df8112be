"""Widgets several pages share: the model chooser."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from tformer_core.checkpoints.errors import CheckpointError
from tformer_core.checkpoints.sources import display_name, local_model_names

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


def choose_model(url: UrlState, suggestions: Sequence[str], default: str, placeholder: str, help: str) -> str:
    """A bundled or suggested model, a local folder, or any hub id typed in; returns the source.

    The choice is kept in the URL as "model"; the loader validates whatever was typed.
    """
    url.key("model", default)
    current = short_name(str(url.value("model")).strip() or default)
    options = list(dict.fromkeys([*suggestions, *local_model_names()])) + [OTHER]
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
