"""Charts shared by the app's pages, built from numpy: Vega-Lite specifications, no Streamlit here.

A chart is either an Altair chart or a plain Vega-Lite dict whose data are DataFrames under
spec["datasets"]. The charts redrawn whenever a user switches layer or head (heatmaps, and the
text views in text_views.py) are written as plain dicts: building them through Altair took most of
a page rerun. `vega_lite_spec` turns either kind into what a page sends; `to_svg` / `to_png`
render either kind on the server for the export buttons; `validate` checks a spec against the
Vega-Lite schema (the tests do, since the page does not spend the time).

Matrices go in long form (row, col, value, row_token, col_token), as in the Annotated Transformer.
Masked cells (-inf scores) cannot travel as JSON numbers; they are sent as nulls, drawn grey and
labelled "-inf", so a masked score is visibly different from a very negative one.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Sequence, Union

import altair as alt
import numpy as np
import pandas as pd

Chart = Union[alt.TopLevelMixin, dict]
VEGA_LITE_SCHEMA = alt.SCHEMA_URL
AUTOSIZE = {"type": "pad", "contains": "padding"}  # the chart at its own size, axes and legend around it

# Above this many cells, numbers are not printed inside the cells (they would be unreadable).
MAX_ANNOTATED_CELLS = 400


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
    text = np.where(whole, np.char.mod("%d", np.round(safe).astype(np.int64)), text)
    special = np.where(np.isnan(v), "nan", np.where(v > 0, "+inf", "-inf"))
    return np.where(finite, text, special)


def matrix_frame(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str], labels: bool = True) -> pd.DataFrame:
    """(n_rows, n_cols) matrix -> long DataFrame: row, col (indices), row_token, col_token, value, text, label.

    Non-finite values (masked scores) become missing values (null in the browser) with text
    "-inf" / "+inf" / "nan". text: the value to 4 significant digits (tooltips); label: cell_text
    (only with `labels`: the cells of big heatmaps carry no numbers).

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
    small = flat.size <= MAX_ANNOTATED_CELLS
    row_labels, col_labels = unique_labels(rows), unique_labels(cols)
    frame = pd.DataFrame(
        {
            "row": r.ravel(),
            "col": c.ravel(),
            "row_token": pd.Categorical.from_codes(r.ravel(), row_labels),
            "col_token": pd.Categorical.from_codes(c.ravel(), col_labels),
            "value": np.where(finite, flat, np.nan).astype(np.float64 if small else np.float32),  # NaN -> null
        }
    )
    if small or not finite.all():
        special = np.where(np.isnan(flat), "nan", np.where(flat > 0, "+inf", "-inf"))
        frame["text"] = np.where(finite, np.char.mod("%.4g", np.where(finite, flat, 0.0)), special)
    if labels:
        frame["label"] = cell_text(flat)
    return frame


# ---- plain Vega-Lite -----------------------------------------------------------------------------
def named_data(frame: pd.DataFrame, datasets: dict[str, Any]) -> dict[str, str]:
    """Put `frame` into `datasets` under a name made from its content; returns the {"name": ...} reference."""
    digest = hashlib.blake2b(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes(), digest_size=12)
    digest.update(repr(list(frame.columns)).encode())  # the values alone would merge frames of equal content
    name = f"data-{digest.hexdigest()}-{len(frame)}"
    datasets[name] = frame
    return {"name": name}


def channel(name: str, kind: str, **props: Any) -> dict:
    """An encoding channel on a data field: channel("value", "quantitative", title=None)."""
    return {"field": name, "type": kind, **props}


def layered(layers: list[dict], datasets: dict[str, Any], title: str = "", **props: Any) -> dict:
    """A top-level layered Vega-Lite spec at its natural size (width, height, params... in `props`)."""
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "title": title,
        "layer": layers,
        "datasets": datasets,
        "autosize": AUTOSIZE,
        **props,
    }


def heatmap(
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    title: str = "",
    *,
    row_title: str = "query",
    col_title: str = "key",
    scheme: str = "viridis",
    domain: tuple[float, float] | None = None,
    annotate: bool | None = None,
    cell_size: int | None = None,
    cell_width: int | None = None,
    diverging: bool = False,
) -> dict:
    """A heatmap with the tokens on both axes, hover tooltips, optional numbers in the cells (Vega-Lite dict).

    domain: fixed colour range (e.g. (0, 1) for attention weights); default: the data's range,
    symmetric around 0 when `diverging`. annotate: print values in cells (default: small matrices).
    cell_size: pixels per cell (default: fits about 560 px, at least 12 px so every label shows);
    cell_width: narrower columns than rows (e.g. Q/K/V's dimensions).
    """
    n_rows, n_cols = len(rows), len(cols)
    annotate = (n_rows * n_cols <= MAX_ANNOTATED_CELLS) if annotate is None else annotate
    df = matrix_frame(matrix, rows, cols, labels=annotate)
    finite = df["value"].dropna()
    if domain is None and len(finite):
        lo, hi = float(finite.min()), float(finite.max())
        if diverging:
            bound = max(abs(lo), abs(hi)) or 1.0
            domain = (-bound, bound)
        elif lo == hi:
            domain = (lo - 1.0, hi + 1.0)
        else:
            domain = (lo, hi)
    scale: dict[str, Any] = {"scheme": "redblue" if diverging else scheme, "reverse": diverging}
    if domain:
        scale["domain"] = [float(domain[0]), float(domain[1])]
    height = cell_size or max(12, min(40, 560 // max(n_rows, n_cols, 1)))
    width = cell_width or height
    # Every token label is drawn when the cells are tall / wide enough for it; else Vega-Lite thins them.
    x = channel(
        "col_token",
        "ordinal",
        sort=unique_labels(cols),
        title=col_title,
        axis={"labelAngle": -45, "labelOverlap": width < 12, "labelLimit": 120},
    )
    y = channel(
        "row_token",
        "ordinal",
        sort=unique_labels(rows),
        title=row_title,
        axis={"labelOverlap": height < 12, "labelLimit": 120},
    )
    datasets: dict[str, Any] = {}
    data = named_data(df, datasets)
    value_tip = (
        channel("text", "nominal", title="value")
        if "text" in df
        else channel("value", "quantitative", title="value", format=".4~g")
    )
    tooltip = [
        channel("row_token", "nominal", title=row_title),
        channel("col_token", "nominal", title=col_title),
        value_tip,
    ]
    colour = {
        "condition": {"test": "datum.value === null", "value": "#bbbbbb"},
        **channel("value", "quantitative", scale=scale, title=None),
    }
    layers = [
        {"data": data, "mark": {"type": "rect"}, "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip}}
    ]
    if annotate:
        # Dark text on light cells and light text on dark ones: threshold at the middle of the range.
        mid = (domain[0] + domain[1]) / 2 if domain else 0.0
        light_is_high = scheme in ("blues", "greens", "oranges", "greys", "purples", "reds") and not diverging
        dark_text = f"datum.value === null || datum.value {'<' if light_is_high else '>'} {mid}"
        if diverging:
            dark_text = f"datum.value === null || abs(datum.value) < {0.5 * (domain[1] if domain else 1.0)}"
        text_colour = {"condition": {"test": dark_text, "value": "black"}, "value": "white"}
        font = max(7, min(12, min(width, height) // 3))
        layers.append(
            {
                "data": data,
                "mark": {"type": "text", "fontSize": font},
                "encoding": {
                    "x": x,
                    "y": y,
                    "text": channel("label", "nominal"),
                    "color": text_colour,
                    "tooltip": tooltip,
                },
            }
        )
    return layered(layers, datasets, title, width=width * n_cols, height=height * n_rows)


def line_chart(
    frame: pd.DataFrame,
    x: str,
    y: str,
    series: str,
    title: str = "",
    x_title: str | None = None,
    y_title: str | None = None,
) -> alt.Chart:
    """Curves of `y` over `x`, one colour per `series` (long-form frame)."""
    return (
        alt.Chart(frame)
        .mark_line(point=len(frame) <= 200)
        .encode(
            x=alt.X(f"{x}:Q", title=x_title or x),
            y=alt.Y(f"{y}:Q", title=y_title or y),
            color=alt.Color(f"{series}:N", title=series),
            tooltip=[x, y, series],
        )
        .properties(title=title, height=260)
    )


# ---- to the browser and to files ----------------------------------------------------------------
def natural_size(chart: Chart) -> Chart:
    """The chart at its own width and height, axes and legend added around them.

    Streamlit otherwise fits the whole chart, labels included, into width x height, which
    squeezes small charts with long labels (a 16-row heatmap came out 10 px tall).
    """
    if isinstance(chart, dict):
        return {**chart, "autosize": AUTOSIZE}
    return chart.properties(autosize=alt.AutoSizeParams(type="pad", contains="padding"))


# Altair selects its theme and data transformer through process-wide settings: one lock for them.
_ALTAIR_SETTINGS = threading.Lock()


def _named_frames(data: Any, datasets: dict[str, Any]) -> dict[str, str]:
    """Altair data transformer: keep each DataFrame as is, under a name made from its content."""
    return named_data(pd.DataFrame(data), datasets)


alt.data_transformers.register("tformer_named_frames", _named_frames)


def vega_lite_spec(chart: Chart) -> dict:
    """The chart as a Vega-Lite dict, its data as DataFrames under spec["datasets"] (a page sends them as Arrow).

    Altair charts are converted without schema validation (it took about half of a rerun); the
    tests validate every chart builder's output with `validate`. No theme: the page applies its own.
    """
    if isinstance(chart, dict):
        return {**chart, "datasets": dict(chart.get("datasets") or {})}
    datasets: dict[str, Any] = {}
    with (
        _ALTAIR_SETTINGS,
        alt.theme.enable("none"),
        alt.data_transformers.enable("tformer_named_frames", datasets=datasets),
    ):
        spec = chart.to_dict(validate=False)
    spec["datasets"] = {**(spec.get("datasets") or {}), **datasets}
    return spec


def json_spec(chart: Chart) -> dict:
    """The chart as pure JSON data: datasets as lists of records, missing values as null."""
    spec = vega_lite_spec(chart)
    spec["datasets"] = {
        name: frame.astype(object).where(frame.notna(), None).to_dict("records")
        if isinstance(frame, pd.DataFrame)
        else frame
        for name, frame in spec["datasets"].items()
    }
    return spec


def validate(chart: Chart) -> None:
    """Raise (jsonschema's ValidationError) when the chart is not a valid Vega-Lite specification."""
    alt.Root.validate(json_spec(chart))


# Streamlit's chart toolbar offers PNG only, so the app renders exports itself, on the server, with
# vl-convert (the Vega project's own renderer, used by Altair's chart.save): the file is exactly the
# chart on screen, and nothing is computed until a user asks for it.
def to_svg(chart: Chart) -> str:
    """The chart as an SVG document (text)."""
    import vl_convert

    return vl_convert.vegalite_to_svg(json_spec(chart))


def to_png(chart: Chart, scale: float = 2.0) -> bytes:
    """The chart as PNG bytes, `scale` times its size on screen (2: sharp on a projector or in slides)."""
    import vl_convert

    return vl_convert.vegalite_to_png(json_spec(chart), scale=scale)
