"""Vega-Lite chart specifications built from numpy: plain dicts, no Streamlit and no Altair here.

A chart is a Vega-Lite dict whose data are DataFrames under spec["datasets"] (a page sends them as
Arrow; `export.json_spec` turns them into records for files). Writing the dicts directly, rather than
through Altair, keeps a page rerun fast (Altair's schema work took most of one) and keeps Altair's
process-wide settings out of a server that many sessions share. The tests validate every builder's
output against the Vega-Lite schema (`export.validate`).

Matrices go in long form (row, col, value, row_token, col_token), as in the Annotated Transformer.
Masked cells are drawn grey and labelled with their value: "-inf" for a score or softmax input (-inf
cannot travel as a JSON number: it is sent as null with its text), "0" for a weight (`masked=`), so a
masked cell is visibly different from a very small or very negative one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "AUTOSIZE",
    "AXES_PX",
    "FIT_WIDTH",
    "MASKED_COLOUR",
    "MAX_ANNOTATED_CELLS",
    "MAX_GRID_CELLS",
    "VEGA_LITE_SCHEMA",
    "cell_px",
    "cell_text",
    "channel",
    "fitting",
    "grid_heatmap",
    "heatmap",
    "layered",
    "line_chart",
    "matrix_frame",
    "named_data",
    "thin",
    "unique_labels",
]

VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"  # the version Streamlit 1.67 draws
AUTOSIZE = {"type": "pad", "contains": "padding"}  # the chart at its own size, axes and legend around it
# A chart that fits its width: the spec's width is the whole chart's (axes and legend included), the most it
# takes; in a narrower column (a phone, a projector's side-by-side columns) the plot shrinks to fit, its height
# stays. The app draws such a chart at most that wide (tformer_app.downloads.chart).
FIT_WIDTH = {"type": "fit-x", "contains": "padding"}
# Room for the axes and legend beside a plot, added to its width when the chart fits its width.
AXES_PX = 150
MASKED_COLOUR = "#bbbbbb"  # colour.MASKED_RGB

# Above this many cells, numbers are not printed inside the cells (they would be unreadable).
MAX_ANNOTATED_CELLS = 400
# A dense grid sends one row of data per cell: `thin` keeps a chart's payload under this many cells.
MAX_GRID_CELLS = 32_768


def fitting(spec: dict, plot_width: int, margin: int = AXES_PX) -> dict:
    """The chart made to fit its width: at most `plot_width` + `margin` (its axes and legend) wide, narrower in
    a narrower column."""
    return {**spec, "width": int(plot_width) + int(margin), "autosize": FIT_WIDTH}


def cell_px(n: int, room: int = 560) -> int:
    """A heatmap's cell for n rows or columns in about `room` pixels: 12 (every label still shows) to 40."""
    return max(12, min(40, int(room) // max(n, 1)))


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made unique for an ordinal axis without changing how they look.

    Vega-Lite merges equal category names ("the" twice in a sentence would share one row), so
    repeats get zero-width spaces appended: same text on screen, distinct categories.
    """
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        label = str(label)
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label + "\u200b" * n)
    return out


def cell_text(values: np.ndarray) -> np.ndarray:
    """Short labels printed inside heatmap cells: whole numbers as such, else 2 decimals (3 digits when large).

    The exact value is in each cell's tooltip and in the tables and CSV files beside the charts.
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    safe = np.where(finite, v, 0.0)
    whole = finite & (np.abs(safe) < 1e6) & (safe == np.round(safe))
    text = np.where(np.abs(safe) >= 100, np.char.mod("%.3g", safe), np.char.mod("%.2f", safe))
    text = np.where(whole, np.char.mod("%d", np.round(np.where(whole, safe, 0.0)).astype(np.int64)), text)
    special = np.where(np.isnan(v), "nan", np.where(v > 0, "+inf", "-inf"))
    return np.where(finite, text, special)


def matrix_frame(
    matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], labels: bool = True, masked: np.ndarray | None = None
) -> pd.DataFrame:
    """(n_rows, n_cols) matrix -> long DataFrame: row, col (indices), row_token, col_token, value, text, label.

    Non-finite values (masked scores) and the cells `masked` marks (masked weights, which are 0) become
    missing values (null in the browser: drawn grey) with their own text ("-inf", "0"). text: the value to
    4 significant digits (tooltips); label: cell_text (only with `labels`: big heatmaps carry no numbers).

    Kept small because it is sent on every rerun: 32-bit indices, token columns as categories (one
    copy of each token, then a byte per cell), and for more than MAX_ANNOTATED_CELLS cells, float32
    values and no text column unless some cell is not finite (tooltips then format the value).
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"a heatmap needs a 2-D matrix, got shape {m.shape}")
    if m.shape != (len(rows), len(cols)):
        raise ValueError(f"matrix shape {m.shape} does not match {len(rows)} row and {len(cols)} column labels")
    r, c = np.meshgrid(np.arange(m.shape[0], dtype=np.int32), np.arange(m.shape[1], dtype=np.int32), indexing="ij")
    flat = m.ravel()
    finite = np.isfinite(flat)
    shown = finite if masked is None else finite & ~np.asarray(masked, dtype=bool).ravel()
    small = flat.size <= MAX_ANNOTATED_CELLS
    row_labels, col_labels = unique_labels(rows), unique_labels(cols)
    frame = pd.DataFrame(
        {
            "row": r.ravel(),
            "col": c.ravel(),
            "row_token": pd.Categorical.from_codes(r.ravel(), row_labels),
            "col_token": pd.Categorical.from_codes(c.ravel(), col_labels),
            "value": np.where(shown, flat, np.nan).astype(np.float64 if small else np.float32),  # NaN -> null
        }
    )
    if small or not shown.all():
        special = np.where(np.isnan(flat), "nan", np.where(flat > 0, "+inf", "-inf"))
        frame["text"] = np.where(finite, np.char.mod("%.4g", np.where(finite, flat, 0.0)), special)
    if labels:
        frame["label"] = cell_text(flat)
    return frame


# ---- building blocks ------------------------------------------------------------------------------
def named_data(frame: pd.DataFrame, datasets: dict[str, Any]) -> dict[str, str]:
    """Put `frame` into `datasets` under a name made from its content; returns the {"name": ...} reference."""
    digest = hashlib.blake2b(digest_size=12)
    for column, values in frame.items():  # the columns' raw bytes: a tenth of pandas' per-value hashing
        digest.update(repr(column).encode())
        if isinstance(values.dtype, pd.CategoricalDtype):
            digest.update(values.cat.codes.to_numpy().tobytes())
            digest.update("\0".join(map(str, values.cat.categories)).encode())
        elif values.dtype.kind in "biufcmM":
            digest.update(values.to_numpy().tobytes())
        else:
            digest.update("\0".join(map(str, values)).encode())
    name = f"data-{digest.hexdigest()}-{len(frame)}"
    datasets[name] = frame
    return {"name": name}


def channel(name: str, kind: str, **props: Any) -> dict:
    """An encoding channel on a data field: channel("value", "quantitative", title=None)."""
    return {"field": name, "type": kind, **props}


def layered(layers: list[dict], datasets: dict[str, Any], title: str | list[str] = "", **props: Any) -> dict:
    """A top-level layered Vega-Lite spec at its natural size (width, height, params... in `props`)."""
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "title": title,
        "layer": layers,
        "datasets": datasets,
        "autosize": AUTOSIZE,
        **props,
    }


# ---- charts -------------------------------------------------------------------------------------
def _colour_domain(values: pd.Series, diverging: bool) -> tuple[float, float] | None:
    """The data's range (symmetric around 0 when diverging; widened when every value is equal)."""
    finite = values.dropna()
    if not len(finite):
        return None
    lo, hi = float(finite.min()), float(finite.max())
    if diverging:
        bound = max(abs(lo), abs(hi)) or 1.0
        return -bound, bound
    return (lo - 1.0, hi + 1.0) if lo == hi else (lo, hi)


def _cell_numbers(data: dict, x: dict, y: dict, tooltip: list, domain, scheme: str, diverging: bool, px: int) -> dict:
    """The layer that prints each cell's value: dark text on light cells, light text on dark ones."""
    mid = (domain[0] + domain[1]) / 2 if domain else 0.0
    light_is_high = scheme in ("blues", "greens", "oranges", "greys", "purples", "reds") and not diverging
    dark_text = f"datum.value === null || datum.value {'<' if light_is_high else '>'} {mid}"
    if diverging:
        dark_text = f"datum.value === null || abs(datum.value) < {0.5 * (domain[1] if domain else 1.0)}"
    text_colour = {"condition": {"test": dark_text, "value": "black"}, "value": "white"}
    encoding = {"x": x, "y": y, "text": channel("label", "nominal"), "color": text_colour, "tooltip": tooltip}
    # A third of the cell: 12 px in the usual 36-40 px cells, larger in the larger cells of a wide screen.
    return {"data": data, "mark": {"type": "text", "fontSize": max(7, min(18, px // 3))}, "encoding": encoding}


def _token_axes(
    rows: Sequence[str], cols: Sequence[str], row_title: str, col_title: str, width: int, height: int
) -> tuple[dict, dict]:
    """The x (keys) and y (queries) channels of a heatmap: every token label drawn when the cells are tall /
    wide enough for it, else Vega-Lite thins them."""
    x_axis = {"labelAngle": -45, "labelOverlap": width < 12, "labelLimit": 120}
    y_axis = {"labelOverlap": height < 12, "labelLimit": 120}
    return (
        channel("col_token", "ordinal", sort=unique_labels(cols), title=col_title, axis=x_axis),
        channel("row_token", "ordinal", sort=unique_labels(rows), title=row_title, axis=y_axis),
    )


def heatmap(
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    title: str | list[str] = "",
    *,
    row_title: str = "query",
    col_title: str = "key",
    scheme: str = "viridis",
    domain: tuple[float, float] | None = None,
    annotate: bool | None = None,
    cell_size: int | None = None,
    cell_width: int | None = None,
    diverging: bool = False,
    masked: np.ndarray | None = None,
    clickable: bool = False,
) -> dict:
    """A heatmap with the tokens on both axes, hover tooltips, optional numbers in the cells (Vega-Lite dict);
    a title given as a list is drawn one line each.

    masked: cells a mask forbids ([rows, cols] bools), drawn grey with their value (a weight's 0);
    non-finite cells (a masked score's -inf) are drawn grey too. clickable: a click on a cell selects it
    (selection parameter "pair" with the fields row and col, the cell's indices in `rows` and `cols`).

    domain: fixed colour range (e.g. (0, 1) for attention weights); default: the data's range,
    symmetric around 0 when `diverging`. annotate: print values in cells (default: small matrices).
    cell_size: pixels per cell (default: fits about 560 px, at least 12 px so every label shows);
    cell_width: narrower columns than rows (e.g. Q/K/V's dimensions).
    """
    n_rows, n_cols = len(rows), len(cols)
    annotate = (n_rows * n_cols <= MAX_ANNOTATED_CELLS) if annotate is None else annotate
    df = matrix_frame(matrix, rows, cols, labels=annotate, masked=masked)
    domain = domain if domain is not None else _colour_domain(df["value"], diverging)
    scale: dict[str, Any] = {"scheme": "redblue" if diverging else scheme, "reverse": diverging}
    if domain:
        scale["domain"] = [float(domain[0]), float(domain[1])]
    height = cell_size or cell_px(max(n_rows, n_cols))
    width = cell_width or height
    x, y = _token_axes(rows, cols, row_title, col_title, width, height)
    datasets: dict[str, Any] = {}
    data = named_data(df, datasets)
    if "text" in df:
        value_tip = channel("text", "nominal", title="value")
    else:
        value_tip = channel("value", "quantitative", title="value", format=".4~g")
    tooltip = [channel("row_token", "nominal", title=row_title), channel("col_token", "nominal", title=col_title)]
    tooltip.append(value_tip)
    colour = {
        "condition": {"test": "datum.value === null", "value": MASKED_COLOUR},
        **channel("value", "quantitative", scale=scale, title=None),
    }
    encoding = {"x": x, "y": y, "color": colour, "tooltip": tooltip}
    # "invalid": "show": Vega-Lite drops rows whose colour value is null unless told not to; the masked
    # cells would be left white, under their "-inf" text.
    layers = [{"name": "cells", "data": data, "mark": {"type": "rect", "invalid": "show"}, "encoding": encoding}]
    if annotate:
        layers.append(_cell_numbers(data, x, y, tooltip, domain, scheme, diverging, min(width, height)))
    click = {"name": "pair", "views": ["cells"], "select": {"type": "point", "fields": ["row", "col"], "on": "click"}}
    extra = {"params": [click]} if clickable else {}
    return layered(layers, datasets, title, width=width * n_cols, height=height * n_rows, **extra)


def line_chart(
    frame: pd.DataFrame,
    x: str,
    y: str,
    series: str,
    title: str = "",
    x_title: str | None = None,
    y_title: str | None = None,
    width: int = 560,
    height: int = 260,
    reference: pd.DataFrame | None = None,
) -> dict:
    """Curves of `y` over `x`, one colour per `series` (long-form frame); points on short curves.

    reference: a frame with the same x and y columns, drawn as a dashed black curve on top (what a
    formula predicts). The plot is `width` wide where there is room, narrower in a narrower column.
    """
    datasets: dict[str, Any] = {}
    x_channel = channel(x, "quantitative", title=x_title or x)
    y_channel = channel(y, "quantitative", title=y_title or y)
    layers = [
        {
            "data": named_data(frame, datasets),
            "mark": {"type": "line", "point": len(frame) <= 200},
            "encoding": {
                "x": x_channel,
                "y": y_channel,
                "color": channel(series, "nominal", title=series),
                "tooltip": [channel(x, "quantitative"), channel(y, "quantitative"), channel(series, "nominal")],
            },
        }
    ]
    if reference is not None:
        layers.append(
            {
                "data": named_data(reference, datasets),
                "mark": {"type": "line", "color": "black", "strokeDash": [6, 4]},
                "encoding": {"x": x_channel, "y": y_channel},
            }
        )
    return fitting(layered(layers, datasets, title, height=height), width)


def _round_ticks(values: np.ndarray) -> list[int]:
    """About ten axis labels at round numbers (multiples of 1, 2, 5, 8, 10, 16, ...) that are on the axis."""
    stride = int(values[1] - values[0]) if len(values) > 1 else 1  # thinned axes hold multiples of it
    span = (int(values[-1]) - int(values[0])) if len(values) else 0
    nice = stride * next(
        (n for n in (1, 2, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512) if span / (n * stride) <= 10), 1024
    )
    return [int(v) for v in values if v % nice == 0]


def grid_heatmap(
    matrix: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    title: str,
    *,
    row_title: str,
    col_title: str,
    diverging: bool = True,
    width: int = 520,
    height: int = 320,
) -> dict:
    """A heatmap for large numeric grids (positions x dimensions): fixed size, a few axis labels.

    `heatmap` labels every row and column; with hundreds of positions that is unreadable, so this one
    labels about ten ticks per axis and never prints numbers in cells. rows / cols: the index of each
    row and column of `matrix` (a thinned grid keeps its original numbers). The plot is `width` wide where
    there is room, narrower in a narrower column (its height stays).
    """
    m = np.asarray(matrix, dtype=np.float64)
    r, c = np.meshgrid(rows, cols, indexing="ij")
    frame = pd.DataFrame({"row": r.ravel(), "col": c.ravel(), "value": m.ravel()})
    # A few outlier cells (learned embeddings have some) would wash out the rest: the colours span the
    # 99th percentile of |value| and clamp beyond; the tooltip still shows the true value.
    bound = float(np.percentile(np.abs(m), 99)) if m.size else 1.0
    bound = bound or float(np.max(np.abs(m), initial=0.0)) or 1.0
    if diverging:
        scale = {"scheme": "redblue", "domain": [-bound, bound], "reverse": True, "clamp": True}
    else:
        scale = {"scheme": "viridis"}
    datasets: dict[str, Any] = {}
    layer = {
        "data": named_data(frame, datasets),
        "mark": {"type": "rect"},
        "encoding": {
            "x": channel("col", "ordinal", title=col_title, axis={"values": _round_ticks(cols), "labelAngle": 0}),
            "y": channel("row", "ordinal", title=row_title, axis={"values": _round_ticks(rows)}),
            "color": channel("value", "quantitative", scale=scale, title=None),
            "tooltip": [
                channel("row", "ordinal", title=row_title),
                channel("col", "ordinal", title=col_title),
                channel("value", "quantitative", format=".4f"),
            ],
        },
    }
    return fitting(layered([layer], datasets, title, height=height), width)


def thin(
    matrix: np.ndarray, max_cells: int = MAX_GRID_CELLS, keep_rows: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sub-matrix, row indices, column indices) with at most max_cells cells, taking every s-th column.

    Columns are dropped first and rows are all kept when keep_rows (striding the positions of a
    sinusoid would alias its fast dimensions; each column is its own frequency, so skipping
    some loses nothing else). Otherwise rows and columns get the same stride (square matrices).
    """
    n_rows, n_cols = matrix.shape
    if n_rows * n_cols <= max_cells:
        return matrix, np.arange(n_rows), np.arange(n_cols)
    if keep_rows:
        col_step = math.ceil(n_rows * n_cols / max_cells)
        rows, cols = np.arange(n_rows), np.arange(0, n_cols, col_step)
    else:
        step = math.ceil(math.sqrt(n_rows * n_cols / max_cells))
        rows, cols = np.arange(0, n_rows, step), np.arange(0, n_cols, step)
    return matrix[np.ix_(rows, cols)], rows, cols
