"""The inputs of "Attention, step by step" on the Streamlit side: editors started from a preset (tables, or
text areas to paste numbers into), and the edits a shared link carries.

    example, sig = link_edits(url, preset_example, sig)   # a link's edits, on the session's first visit
    inputs = edit_tables(example, sig, n_heads, "tables")  # the editors; Inputs holds what parsed and the errors
    record_edits(url, preset_example, inputs)              # what differs from the preset, into the link

Editors are keyed by a digest of the preset's settings, so a new preset (or number of heads) starts them
again; what to put in them and what the link keeps is decided in tformer_views.lessons.worked_example.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pandas as pd
import streamlit as st

from tformer_views.lessons import attention as ls
from tformer_views.lessons import tables as lt
from tformer_views.lessons import worked_example as we
from tformer_views.lessons.tables import Inputs

from .markdown import escape
from .tables import data_editor
from .url import UrlState

LINK_EDITS = "step.link_edits"  # session state: (the preset's signature, the edits its link brought)
TEXT_SIG = "step._text_sig"  # session state: the digest of the preset the text areas were filled from


def link_edits(url: UrlState, example: ls.Example, sig: tuple) -> tuple[ls.Example, tuple]:
    """The example with the edits a shared link carries (e_X=1,0,2;0,1,1 ...: only what differs from the
    preset), read on the session's first visit; they hold until the preset or its settings change."""
    for name in we.EDITABLE:
        url.key(f"e_{name}", "", cast=str, omit_default=True)
        url.described[f"e_{name}"] = f"your edits of {ls.latex_name(name) if name != 'tokens' else 'the tokens'}"
    if url.incoming is not None:
        edits, problems = we.read_link_edits(example, {name: url.value(f"e_{name}") for name in we.EDITABLE})
        for problem in problems:
            st.warning(f"The link's edits could not be read: {escape(problem)}")
        st.session_state[LINK_EDITS] = (sig, edits)
    stored_sig, edits = st.session_state.get(LINK_EDITS, (None, {}))
    if stored_sig != sig or not edits:
        return example, sig
    edited, digest = we.with_edits(example, edits)
    return edited, (*sig, digest)


def record_edits(url: UrlState, example: ls.Example, inputs: Inputs) -> None:
    """Put in the link what the user changed from the preset (nothing for the preset's own numbers)."""
    for name, text in we.link_texts(example, inputs.tokens, inputs.values).items():
        url.set(f"e_{name}", text)


def edit_tables(ex: ls.Example, sig: tuple, n_heads: int, mode: str) -> Inputs:
    """The editable inputs, started from the preset: data editors, or text areas to paste numbers into."""
    digest = hashlib.sha1(repr(sig).encode()).hexdigest()[:10]  # a new preset gives fresh editors
    matrices = we.example_matrices(ex, n_heads)
    if mode == "text":
        return edit_as_text(ex, matrices, digest, n_heads)
    return edit_as_tables(ex, matrices, digest, n_heads)


def _bias_label(ex: ls.Example) -> str:
    return "Biases b^Q, b^K, b^V" + (" (this model has them)" if ex.has_bias else " (all 0 here)")


def _fill_text(ex: ls.Example, matrices: we.Matrices, digest: str) -> None:
    """Text areas keep what was typed across reruns; a new preset replaces it."""
    if st.session_state.get(TEXT_SIG) == digest:
        return
    st.session_state["step.paste.tokens"] = " ".join(ex.tokens)
    if not ex.given_qkv and ex.X is not None:
        st.session_state["step.paste.X"] = lt.format_matrix_text(ex.X)
    for name, (matrix, _, _) in matrices.items():
        st.session_state[f"step.paste.{name}"] = lt.format_matrix_text(matrix)
    st.session_state[TEXT_SIG] = digest


def edit_as_text(ex: ls.Example, matrices: we.Matrices, digest: str, n_heads: int) -> Inputs:
    out = Inputs()
    _fill_text(ex, matrices, digest)
    st.caption(
        "One row per line, numbers separated by spaces or commas (brackets are ignored). "
        "A new preset or number of heads starts the text again."
    )

    def paste(where: Any, name: str, label: str, **kwargs: Any) -> None:
        text = where.text_area(label, key=f"step.paste.{name}", **kwargs)
        out.parse(name, lambda: lt.parse_matrix_text(text, ls.latex_name(name)))

    if ex.given_qkv:
        out.tokens = lt.parse_tokens(st.text_input("Tokens (separated by spaces)", key="step.paste.tokens"))
        for column, name in zip(st.columns(3), we.GIVEN):
            paste(column, name, f"{name}  (n × {'d_v' if name == 'V' else 'd_k'})")
        if n_heads > 1:
            paste(st, "W_o", "W^O  (h·d_v × d_model)")
        return out
    left, right = st.columns([1, 2])
    out.tokens = lt.parse_tokens(left.text_input("Tokens (separated by spaces)", key="step.paste.tokens"))
    out.parse("X", lambda: lt.parse_matrix_text(right.text_area("X  (n × d_model)", key="step.paste.X"), "X"))

    for column, name in zip(st.columns(3), we.W_NAMES):
        paste(column, name, f"{ls.latex_name(name)}  (d_model × d_k)")
    with st.expander(_bias_label(ex), expanded=ex.has_bias):
        for column, name in zip(st.columns(3), we.B_NAMES):
            paste(column, name, ls.latex_name(name), height=68)
    if n_heads > 1:
        paste(st, "W_o", "W^O  (h·d_v × d_model)")
    return out


def _token_table(ex: ls.Example, digest: str, n_heads: int, out: Inputs) -> None:
    """The table that holds the tokens, one per row: X, or Q when Q, K, V are given."""
    first = "Q" if ex.given_qkv else "X"
    values = getattr(ex, first)
    prefix = "q" if ex.given_qkv else "x"
    x_frame = pd.DataFrame(values, columns=we.col_labels(prefix, values.shape[1], n_heads if ex.given_qkv else 1))
    x_frame.insert(0, "token", list(ex.tokens))
    if ex.given_qkv:
        st.markdown("$Q$ (n × d_k), one row per token:")
    edited = data_editor(st, x_frame, key=f"step.edit.{first}.{digest}", num_rows="dynamic", hide_index=True)
    out.tokens = lt.tokens_from_column(edited["token"].tolist()) if "token" in edited else []
    out.parse(first, lambda: lt.matrix_from_frame(edited, first, skip=["token"]))


def edit_as_tables(ex: ls.Example, matrices: we.Matrices, digest: str, n_heads: int) -> Inputs:
    out = Inputs()
    st.caption(
        f"Edit any cell. Add or delete rows of {'Q' if ex.given_qkv else 'X'} to change the tokens. "
        "Each table's toolbar also downloads it. "
        "A new preset or number of heads starts the tables again."
    )
    _token_table(ex, digest, n_heads, out)

    def editor(name: str, where: Any, label: str, **kwargs: Any) -> None:
        matrix, rows, cols = matrices[name]
        where.markdown(label)
        frame = data_editor(
            where,
            # "K given": the corner of the input table, apart from the K computed below it
            pd.DataFrame(
                matrix, index=pd.Index(rows, name=ls.latex_name(name) + (" given" * (name in we.GIVEN))), columns=cols
            ),
            key=f"step.edit.{name}.{digest}",
            **kwargs,
        )
        out.parse(name, lambda: lt.matrix_from_frame(frame, ls.latex_name(name)))

    if ex.given_qkv:
        for column, name in zip(st.columns(2), ("K", "V")):
            editor(name, column, f"${name}$ (n × d_{name.lower() if name == 'V' else 'k'})", num_rows="dynamic")
        if n_heads > 1:
            editor("W_o", st, "$W^O$ (h·d_v × d_model): mixes the concatenated heads back to d_model")
        return out

    for column, name in zip(st.columns(3), we.W_NAMES):
        editor(name, column, f"${ls.latex_name(name)}$ (d_model × d_{'v' if name == 'W_v' else 'k'})")
    with st.expander(_bias_label(ex), expanded=ex.has_bias):
        for column, name in zip(st.columns(3), we.B_NAMES):
            editor(name, column, f"${ls.latex_name(name)}$")
    if n_heads > 1:
        editor("W_o", st, "$W^O$ (h·d_v × d_model): mixes the concatenated heads back to d_model")
    return out
