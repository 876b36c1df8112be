"""Models trained on the Train page, kept in the session that trained them and nowhere else.

A trained model is named "session:<what>-<random>" (`store`); the model choosers of the other pages list
this session's names (`names`), and tformer_app.models hands the model to a page of this session only (`get`).
The name cannot be a hub id (":" is not allowed in one), and its random part keeps the results cached
for it apart from every other session's: a link with the name opened in another session gets a message
saying the model belongs to the session that trained it, never the model or its results.

At most one model per kind (text, image) per session: a new one replaces the last (memory stays bounded:
at most two small models per session, a few MB).
"""

from __future__ import annotations

import secrets

import streamlit as st

from tformer_core.checkpoints.errors import CheckpointError
from tformer_core.models.base import TracedModel

PREFIX = "session:"
_STATE = "_tformer.session_models"  # name -> model, in this session's state


def is_session_name(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def _models() -> dict[str, TracedModel]:
    return st.session_state.setdefault(_STATE, {})


def store(model: TracedModel, what: str) -> str:
    """Keep `model` in this session under a new name, replacing this session's earlier model of `what`."""
    models = _models()
    for name in [n for n in models if n.startswith(f"{PREFIX}{what}-")]:
        del models[name]
    name = f"{PREFIX}{what}-{secrets.token_hex(3)}"
    model.source = name
    models[name] = model
    return name


def names() -> list[str]:
    """This session's trained models, by name."""
    try:
        return list(_models())
    except Exception:  # no session (a script run outside Streamlit): none
        return []


def get(name: str) -> TracedModel:
    """This session's model `name`; CheckpointError when it is not this session's (or its session ended)."""
    try:
        model = _models().get(name)
    except Exception:
        model = None
    if model is None:
        raise CheckpointError(
            f"{name} was trained on the Train page in another session (or in one that has ended): a trained "
            "model stays private to the session that trained it. Train one on the Train page."
        )
    return model
