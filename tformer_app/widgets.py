"""Widgets several pages share: the model chooser, and choices of tokens that follow the input."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import streamlit as st

from tformer_core.bundled import BUNDLED_MODELS
from tformer_core.checkpoints import BUNDLED_TEXT, bart, bert, dinov2, gpt2, llama, marian, t5, vit
from tformer_core.checkpoints.errors import CheckpointError
from tformer_core.checkpoints.hfconfig import read_json
from tformer_core.checkpoints.sources import display_name, local_models, looks_like_path

from . import session_models
from .markdown import escape
from .models import hub_unreachable
from .url import UrlState

OTHER = "__other__"
# What a checkpoint's config.json model_type makes of it, for the model lists: a page offers the folders of the
# kinds it can show (a folder of another kind it cannot, so it is not listed; one of a type not known here is).
KINDS = {
    "encoder": bert.MODEL_TYPES,
    "decoder": gpt2.MODEL_TYPES + llama.MODEL_TYPES,
    "encoder-decoder": marian.MODEL_TYPES + bart.MODEL_TYPES + t5.MODEL_TYPES,
    "vit": vit.MODEL_TYPES + dinov2.MODEL_TYPES,
}
NEEDS_INTERNET = " (needs the internet)"
TRAINED_HERE = " (trained in this session)"


def local_model_names_of(kinds: Sequence[str] | None) -> list[str]:
    """This server's model folders a page can show: all (kinds None), or those not of another known kind."""
    others = {t for kind, types in KINDS.items() if kinds is not None and kind not in kinds for t in types}
    names = []
    for name, folder in local_models():
        try:
            model_type = read_json(folder / "config.json").get("model_type")
        except CheckpointError:
            model_type = None  # a broken folder is reported when someone chooses it
        if model_type not in others:
            names.append(name)
    return names


def kind_of(source: str) -> str | None:
    """What one of this server's model folders is (a KINDS key), read from its config.json; None for anything
    else (a hub id, a folder of a type not known here, a broken one)."""
    folders = dict(local_models())
    if short_name(source) not in folders:
        return None
    try:
        model_type = read_json(folders[short_name(source)] / "config.json").get("model_type")
    except CheckpointError:
        return None
    return next((kind for kind, types in KINDS.items() if model_type in types), None)


def needs_internet(source: str) -> bool:
    """True for a hub id this server cannot load now: the hub is off or unreachable and its files are not in
    the hub's local cache (a bundled model or a local folder never needs it)."""
    if source in BUNDLED_TEXT or source in BUNDLED_MODELS or source == OTHER or looks_like_path(source):
        return False
    if session_models.is_session_name(source):  # trained on the Train page: in this session's memory
        return False
    if not hub_unreachable():
        return False
    from huggingface_hub import try_to_load_from_cache

    try:
        return not isinstance(try_to_load_from_cache(source, "config.json"), str)
    except (ValueError, OSError):  # not a valid id: the loader says so when it is chosen
        return True


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


def choose_model(
    url: UrlState,
    suggestions: Sequence[str],
    default: str,
    placeholder: str,
    help: str,
    stacked: bool = False,
    kinds: Sequence[str] | None = None,
) -> str:
    """A bundled or suggested model, a local folder, or any hub id typed in; returns the source.

    The choice is kept in the URL as "model"; the loader validates whatever was typed. stacked: the box for
    a typed id under the list (in a narrow column), not beside it. kinds: what the page can show ("encoder",
    "decoder", "encoder-decoder", "vit"; see KINDS): the server's folders of other kinds are not offered. A
    hub id the server cannot reach now is offered marked as needing the internet.
    """
    url.key("model", default)
    current = short_name(str(url.value("model")).strip() or default)
    # This session's models from the Train page come last (no other session lists or loads them).
    options = list(dict.fromkeys([*suggestions, *local_model_names_of(kinds), *session_models.names()])) + [OTHER]
    choice_key, other_key = f"{url.page}.model_choice", f"{url.page}.model_other"
    marked = {o: needs_internet(o) for o in options}

    def offline(option: str) -> bool:
        return marked.get(option, False)

    if choice_key not in st.session_state:
        st.session_state[choice_key] = current if current in options else OTHER
        st.session_state[other_key] = "" if current in options else current
    else:
        # Told every run, as UrlState.key tells its widgets: a box the browser mounts afresh (a first run cut short
        # by a click) starts at the list's first model, shows it, and sends it back with the next change of any
        # other widget, which switched the page's model (the vision page's vit-tiny became DeiT-Tiny when the
        # patch size was typed; the heads page's translator became smollm2 when the grid was clicked).
        for key in (choice_key, other_key):
            st.session_state[key] = st.session_state.get(key, "")
    left, right = (st, st) if stacked else st.columns([1, 1])
    choice = left.selectbox(
        "Model",
        options,
        key=choice_key,
        help=help,
        format_func=lambda o: "Another hub id or local folder…" if o == OTHER else o + _note(o, offline(o)),
    )
    source = choice
    if choice == OTHER:
        typed = right.text_input("Hub id or folder", key=other_key, placeholder=placeholder)
        source = typed.strip() or default
    url.set("model", source)
    return source


def _note(option: str, offline: bool) -> str:
    """What the model list says after a model's name: trained in this session, or that it needs the internet."""
    if session_models.is_session_name(option):
        return TRAINED_HERE
    return NEEDS_INTERNET if offline else ""


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
    value = _followed_value(state, picked, digest, options, labels, default, follow_default, where)
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
        label,
        options,
        format_func=lambda i: f"{i}: {labels[i]}",
        key=widget,
        on_change=url.callback(chose),
        help=help,
        **kwargs,
    )
    st.session_state[state] = choice
    st.session_state[f"{state}.digest"], st.session_state[f"{state}.label"] = digest, labels[choice]
    return int(choice)


def _followed_value(
    state: str,
    picked: str,
    digest: str,
    options: list[int],
    labels: Sequence[str],
    default: int,
    follow_default: bool,
    where: Any,
) -> int:
    """following_choice's value on this run: after a new input (a new `digest` of the labels), the token chosen
    before where the new input has it, else `default` (said in a caption when the user had chosen it)."""
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
    return int(value)


def choose_token(url: UrlState, name: str, value: int) -> None:
    """Choose position `value` for the `following_choice` box `name` from code (a click on a chart), as if
    the user had picked it (a callback: it runs before the page is drawn again)."""
    state = f"{url.page}.{name}"
    st.session_state[state] = int(value)
    st.session_state[f"{state}.picked"] = True
