"""Matrices on a lesson page: a formula, the numbers as a table beside them as a heatmap, and editable tables.

matrix_panel("Q", r"Q = XW^Q", Q, tokens, ["q1", "q2"], key_prefix="step")
inputs = Inputs(); inputs.parse("X", lambda: matrix_from_frame(edited, "X"))   # errors kept, not raised
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tformer_views.charts.spec import cell_px, heatmap, unique_labels
from tformer_views.lessons.tables import Inputs

from . import downloads, presenter
from .markdown import escape

__all__ = ["Inputs", "data_editor", "matrix_panel"]  # Inputs: the views' parsed tables, as pages import it

log = logging.getLogger("tformer_app")
_REFUSED_EDITS = "_tformer.refused_edits"  # session state: editor key -> why its edits were refused in the last run


def matrix_panel(
    name: str,
    latex: str | None,
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    key_prefix: str,
    file_prefix: str | None = None,
    caption: str = "",
    col_title: str = "",
    row_title: str = "token",
    domain: tuple[float, float] | None = None,
    diverging: bool = True,
) -> None:
    """A formula, then the numbers as a table (with a CSV download) beside them as a heatmap.

    `name` labels the table's corner (tests find tables by it) and names the files and keys: the CSV is
    "<file_prefix>_<name>.csv" (file_prefix defaults to key_prefix).
    """
    if latex:
        st.latex(latex)
    if caption:
        st.caption(caption)
    rows, cols = unique_labels(rows), [str(c) for c in cols]
    left, right = st.columns([1, 1])
    frame = pd.DataFrame(matrix, index=pd.Index(rows, name=name), columns=cols)
    presenter.table(frame.style.format("{:.4g}"), left)
    slug = "".join(ch if ch.isalnum() else "_" for ch in name)
    with left:
        downloads.matrix_download(
            matrix, rows, cols, f"{file_prefix or key_prefix}_{slug}.csv", key=f"{key_prefix}.csv.{slug}"
        )
    with right:
        chart = heatmap(
            matrix,
            rows,
            cols,
            name,
            row_title=row_title,
            col_title=col_title,
            domain=domain,
            diverging=diverging and domain is None,
            cell_size=cell_px(max(len(rows), len(cols)), 250),  # half of a 1280-px page's row
        )
        downloads.chart(chart, key=f"{key_prefix}.chart.{slug}")


MAX_EDITOR_ROWS = 256  # rows a table may grow to by added rows (the lessons' tables take at most 16 or 32 tokens)
_INDEX = "_index"  # how Streamlit names the index column in an editor's edits
_SCALAR = (str, int, float, bool, type(None))


def edits_problem(state: Any, data: pd.DataFrame, dynamic: bool) -> str | None:
    """Why an editor's edits (`state`: Streamlit's {"edited_rows", "added_rows", "deleted_rows"}) do not fit the
    table `data`, or None when they do. They come from the browser, or from anyone who speaks its protocol: rows
    and columns that do not exist (a row -1 would edit the last), values that are not single values, rows added
    to a table of fixed size or past MAX_EDITOR_ROWS."""
    if not isinstance(state, dict):
        return "edits that are not a table of changes"
    edited, added, deleted = (state.get(k) for k in ("edited_rows", "added_rows", "deleted_rows"))
    edited, added, deleted = edited or {}, added or [], deleted or []
    if not isinstance(edited, dict) or not isinstance(added, list) or not isinstance(deleted, list):
        return "edits that are not a table of changes"
    columns = {str(c) for c in data.columns} | {_INDEX}
    if (added or deleted) and not dynamic:
        return "rows added to or deleted from a table of fixed size"
    if len(data) + len(added) > MAX_EDITOR_ROWS:
        return f"{len(added):,} rows added (this table takes at most {MAX_EDITOR_ROWS} rows)"
    for row, changes in edited.items():
        if not _row_in(row, len(data)):
            return f"an edit of row {str(row)[:20]!r}, which the table does not have"
        problem = _changes_problem(changes, columns)
        if problem:
            return problem
    for changes in added:
        problem = _changes_problem(changes, columns)
        if problem:
            return problem
    if not all(_row_in(row, len(data) + len(added)) for row in deleted):
        return "the deletion of a row the table does not have"
    return None


def _row_in(row: object, n_rows: int) -> bool:
    try:
        number = int(row)  # type: ignore[call-overload]  # the browser's JSON names rows as text
    except (TypeError, ValueError):
        return False
    return not isinstance(row, (bool, float)) and 0 <= number < n_rows


def _changes_problem(changes: object, columns: set[str]) -> str | None:
    if not isinstance(changes, dict):
        return "a row's edits that are not a table of columns and values"
    unknown = [str(c)[:20] for c in changes if str(c) not in columns]
    if unknown:
        return f"an edit of the column {unknown[0]!r}, which the table does not have"
    if not all(isinstance(v, _SCALAR) for v in changes.values()):
        return "a cell given a value that is not a single number or text"
    return None


def data_editor(where: Any, data: pd.DataFrame, key: str, **kwargs: Any) -> pd.DataFrame:
    """`where.data_editor(data, key=key, **kwargs)`, recovering from edits that do not fit the table.

    The browser sends an editor's edits as JSON naming rows and columns; Streamlit applies them when the page
    runs, and raised KeyError, IndexError, ValueError or AttributeError for a column or row the table does not
    have, or a value or structure it did not expect (a crafted message, or a stale one after the table
    changed); a row -1 edited the last row. Its state keeps those edits, so every later run raised again until
    the page was reloaded. Here the edits are checked first (`edits_problem`): edits that do not fit are logged
    and forgotten, the page runs again at once with the table as it was, and says so above it in one line.
    """
    refused = st.session_state.get(_REFUSED_EDITS, {}).pop(key, None)
    if refused is not None:
        where.warning(f"Edits that did not fit this table were left out: {escape(refused)}.")
    problem: str | None = None
    try:
        state = st.session_state.get(key)
    except (ValueError, TypeError, AttributeError) as error:  # the browser's JSON did not even parse
        state, problem = None, f"edits that cannot be read ({type(error).__name__})"
    else:
        problem = None if state is None else edits_problem(state, data, kwargs.get("num_rows") == "dynamic")
    if problem is None:
        try:
            return where.data_editor(data, key=key, **kwargs)
        except (KeyError, IndexError) as error:  # a case the check does not foresee: still never a traceback
            problem = f"{type(error).__name__}: {str(error)[:100]}"
    log.warning("refused edits of the table %s: %s", key, problem)
    st.session_state.pop(key, None)
    st.session_state.setdefault(_REFUSED_EDITS, {})[key] = problem
    st.rerun()
