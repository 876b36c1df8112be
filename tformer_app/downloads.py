"""Drawing charts and tables, and the files a user can take away: SVG / PNG of every chart, CSV of every matrix.

Exports are rendered on the server and only when their button is clicked (`on_click="ignore"`: the
click does not rerun the page), so drawing a page costs nothing for the files it offers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import streamlit as st

from tformer_views.charts.export import to_svg
from tformer_views.charts.raster import chart_png
from tformer_views.charts.spec import grid_heatmap, thin

from . import presenter


def chart(spec: dict, key: str, file_name: str | None = None, **selection: Any) -> Any:
    """Draw a Vega-Lite chart (tformer_views.charts) with SVG and PNG downloads under it; returns
    st.vega_lite_chart's result. `selection`: on_select / selection_mode, for clickable charts."""
    # Streamlit takes the datasets out of what it gets. Frames go as Arrow tables converted on this thread:
    # given a long frame, pyarrow's own conversion starts a pool of threads for it, on every rerun.
    datasets = {name: _arrow(data) for name, data in (spec.get("datasets") or {}).items()}
    shown = presenter.chart_fonts({**spec, "datasets": datasets})
    event = st.vega_lite_chart(shown, width=_width(spec), key=key, **selection)
    export_buttons(spec, key, file_name or key.rsplit(".", 1)[-1])
    return event


def _width(spec: dict) -> int | Literal["content"]:
    """A chart that fits its width (autosize "fit" or "fit-x") has its spec's width at most, less in a narrower
    column; any other is drawn at its own size (where the column is narrower, it scrolls in its own box)."""
    fits = str((spec.get("autosize") or {}).get("type", "")).startswith("fit")
    return int(spec["width"]) if fits and isinstance(spec.get("width"), (int, float)) else "content"


def _arrow(data: Any) -> Any:
    return pa.Table.from_pandas(data, preserve_index=False, nthreads=1) if isinstance(data, pd.DataFrame) else data


def export_buttons(spec: dict, key: str, file_name: str) -> None:
    """SVG and PNG download buttons for a chart (Streamlit's own chart toolbar saves PNG only).

    PNG: raster.chart_png, resvg's picture with the head view's thousands of lines drawn in numpy (a second,
    not half a minute), at most 12 million pixels."""
    with st.container(horizontal=True, gap="small"):
        for kind, mime, render in (("svg", "image/svg+xml", to_svg), ("png", "image/png", chart_png)):
            st.download_button(
                kind.upper(),
                functools.partial(render, spec),
                file_name=f"{file_name}.{kind}",
                mime=mime,
                key=f"{key}.{kind}",
                on_click="ignore",
                type="tertiary",
                icon=":material/download:",
                # No tooltip: "SVG" / "PNG" with the download icon say it, and a page draws two buttons a chart
                # on every rerun (the encoder-decoder page 26): without, a head switch settled 5-10 % sooner.
            )


def file_download(label: str, data: bytes | Callable[[], bytes], file_name: str, mime: str, key: str) -> None:
    """A download button for a file: bytes the page already has (a picture it showed), or a function that
    makes them when the button is clicked (an encoding the page does not need to draw)."""
    st.download_button(
        label,
        data if callable(data) else lambda: data,
        file_name=file_name,
        mime=mime,
        key=key,
        on_click="ignore",
        type="tertiary",
        icon=":material/download:",
    )


# In presenter mode a table of at most this many rows is an HTML table at the presenter's type (a data grid draws its
# cells on a canvas at its own small size); a longer one stays a grid, which scrolls.
PRESENTED_ROWS = 40


def table(frame: pd.DataFrame, digits: int = 4, key: str | None = None) -> None:
    """A table whose numbers the browser formats to `digits` decimals; in presenter mode, up to PRESENTED_ROWS rows,
    an HTML table at the presenter's type with the numbers formatted here.

    Not a pandas Styler otherwise: a Styler formats every cell on the server, which for a 512-row table
    takes longer than the rest of a rerun.
    """
    floats = [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]
    if presenter.presenting() and len(frame) <= PRESENTED_ROWS:
        st.table(frame.style.format(precision=digits, subset=floats))
        return
    config = {str(c): st.column_config.NumberColumn(format=f"%.{digits}f") for c in floats}
    st.dataframe(frame, column_config=config, key=key)


def matrix_download(
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    file_name: str,
    label: str = "Download CSV",
    key: str | None = None,
) -> None:
    """A button that downloads the matrix shown (with its row and column labels) as CSV.

    The CSV is written only when the button is clicked (a 512 x 512 matrix takes longer to format
    than the rest of a rerun), and the click does not rerun the page.
    """

    def csv() -> bytes:
        return pd.DataFrame(np.asarray(matrix), index=list(rows), columns=list(cols)).to_csv().encode("utf-8")

    st.download_button(
        label, csv, file_name=file_name, mime="text/csv", key=key, on_click="ignore", icon=":material/download:"
    )


CORNER = 8  # the numbers of the top-left corner of each big matrix are printed as a table


def corner(name: str, matrix: np.ndarray, rows: list[str], cols: list[str]) -> None:
    """The top-left CORNER x CORNER numbers of a matrix as a table (its corner cell says `name`)."""
    k_r, k_c = min(CORNER, matrix.shape[0]), min(CORNER, matrix.shape[1])
    frame = pd.DataFrame(matrix[:k_r, :k_c], index=pd.Index(rows[:k_r], name=name), columns=cols[:k_c])
    st.dataframe(frame.style.format("{:.4f}"))


def big_heatmap(
    matrix: np.ndarray, title: str, row_title: str, col_title: str, key: str, square: bool = False, width: int = 520
) -> None:
    """A large matrix as a heatmap (thinned to a light payload, saying so) with its full CSV."""
    sub, rows, cols = thin(matrix, keep_rows=not square)
    side = min(width, 420)
    spec = grid_heatmap(
        sub,
        rows,
        cols,
        title,
        row_title=row_title,
        col_title=col_title,
        height=side if square else 320,
        width=side if square else width,
    )
    chart(spec, key=f"pe.chart.{key}")
    if sub.shape != matrix.shape:
        step = cols[1] - cols[0]
        st.caption(
            f"Drawn: one {'row and column' if square else 'column'} in {step} of {matrix.shape[0]} × "
            f"{matrix.shape[1]} (keeps the chart light); the CSV has every number."
        )
    matrix_download(
        matrix,
        [str(i) for i in range(matrix.shape[0])],
        [str(j) for j in range(matrix.shape[1])],
        f"{key}.csv",
        key=f"pe.csv.{key}",
    )
