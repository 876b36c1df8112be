"""Matrices on a lesson page: a formula, the numbers as a table beside them as a heatmap, and editable tables.

matrix_panel("Q", r"Q = XW^Q", Q, tokens, ["q1", "q2"], key_prefix="step")
inputs = Inputs(); inputs.parse("X", lambda: matrix_from_frame(edited, "X"))   # errors kept, not raised
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tformer_views.charts.spec import cell_px, heatmap, unique_labels
from tformer_views.lessons.tables import TableError

from . import downloads, presenter

log = logging.getLogger("tformer_app")
_REFUSED_EDITS = "_tformer.refused_edits"  # session state: editors whose edits were refused in the last run


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


class Inputs:
    """Parsed tables: each matrix by name, or None with its message in `errors` (keyed by the same name).

    One bad table does not stop the page: the parts that do not need it are still drawn.
    """

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.values: dict[str, np.ndarray | None] = {}
        self.errors: dict[str, str] = {}

    def parse(self, name: str, read: Callable[[], np.ndarray]) -> None:
        try:
            self.values[name] = read()
        except TableError as error:
            self.values[name] = None
            self.errors[name] = str(error)


def data_editor(where: Any, data: pd.DataFrame, key: str, **kwargs: Any) -> pd.DataFrame:
    """`where.data_editor(data, key=key, **kwargs)`, recovering from edits that do not fit the table.

    The browser sends an editor's edits as JSON naming rows and columns; Streamlit applies them when the page
    runs, and raises KeyError (or IndexError) for a column or row the table does not have (a crafted message,
    or a stale one after the table changed). Its state keeps those edits, so every later run raised again until
    the page was reloaded. Here the refused edits are logged and forgotten, the page runs again at once with
    the table as it was, and says so above it.
    """
    if key in st.session_state.get(_REFUSED_EDITS, set()):
        st.session_state[_REFUSED_EDITS].discard(key)
        where.warning("Edits that did not fit this table (a row or column it does not have) were left out.")
    try:
        return where.data_editor(data, key=key, **kwargs)
    except (KeyError, IndexError) as error:
        log.warning("refused edits of the table %s: %s: %s", key, type(error).__name__, str(error)[:100])
        st.session_state.pop(key, None)
        st.session_state.setdefault(_REFUSED_EDITS, set()).add(key)
        st.rerun()
