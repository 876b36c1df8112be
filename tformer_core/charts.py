"""Charts shared by the app's pages: Altair specifications built from numpy, no Streamlit here.

Altair (Vega-Lite) is used because its charts carry their own export menu (Save as SVG / PNG) in
the browser, so every chart on every page can be exported without a server-side renderer.
Matrices go in long form (row, col, value, row_token, col_token), as in the Annotated Transformer.

Masked cells (-inf scores) cannot travel as JSON numbers; they are sent as nulls, drawn grey and
labelled "-inf", so a masked score is visibly different from a very negative one.
"""

from __future__ import annotations

from typing import Sequence

import altair as alt
import numpy as np
import pandas as pd

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


def matrix_frame(matrix: np.ndarray, rows: Sequence[str], cols: Sequence[str]) -> pd.DataFrame:
    """(n_rows, n_cols) matrix -> long DataFrame: row, col (indices), row_token, col_token, value, text.

    Non-finite values (masked scores) become value None and text "-inf" / "+inf" / "nan".
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"a heatmap needs a 2-D matrix, got shape {m.shape}")
    if m.shape != (len(rows), len(cols)):
        raise ValueError(f"matrix shape {m.shape} does not match {len(rows)} row and {len(cols)} column labels")
    r, c = np.meshgrid(np.arange(m.shape[0]), np.arange(m.shape[1]), indexing="ij")
    flat = m.ravel()
    finite = np.isfinite(flat)
    special = np.where(np.isnan(flat), "nan", np.where(flat > 0, "+inf", "-inf"))
    text = np.where(finite, np.char.mod("%.3g", np.where(finite, flat, 0.0)), special)
    row_labels, col_labels = unique_labels(rows), unique_labels(cols)
    return pd.DataFrame(
        {
            "row": r.ravel(),
            "col": c.ravel(),
            "row_token": np.asarray(row_labels, dtype=object)[r.ravel()],
            "col_token": np.asarray(col_labels, dtype=object)[c.ravel()],
            "value": [float(v) if ok else None for v, ok in zip(flat, finite)],  # None -> JSON null
            "text": text,
        }
    )


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
    diverging: bool = False,
) -> alt.Chart:
    """A heatmap with the tokens on both axes, hover tooltips, optional numbers in the cells.

    domain: fixed colour range (e.g. (0, 1) for attention weights); default: the data's range,
    symmetric around 0 when `diverging`. annotate: print values in cells (default: small matrices).
    """
    df = matrix_frame(matrix, rows, cols)
    n_rows, n_cols = len(rows), len(cols)
    annotate = (n_rows * n_cols <= MAX_ANNOTATED_CELLS) if annotate is None else annotate
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
    scale = alt.Scale(scheme="redblue" if diverging else scheme, domain=list(domain) if domain else alt.Undefined,
                      reverse=diverging)  # fmt: skip
    size = cell_size or max(6, min(40, 560 // max(n_rows, n_cols, 1)))
    base = alt.Chart(df).encode(
        x=alt.X("col_token:O", sort=unique_labels(cols), title=col_title, axis=alt.Axis(labelAngle=-45)),
        y=alt.Y("row_token:O", sort=unique_labels(rows), title=row_title),
    )
    tooltip = [alt.Tooltip("row_token:N", title=row_title), alt.Tooltip("col_token:N", title=col_title),
               alt.Tooltip("text:N", title="value")]  # fmt: skip
    cells = base.mark_rect().encode(
        color=alt.condition("datum.value === null", alt.value("#bbbbbb"), alt.Color("value:Q", scale=scale, title=None)),
        tooltip=tooltip,
    )
    layers = [cells]
    if annotate:
        # Dark text on light cells and light text on dark ones: threshold at the middle of the range.
        mid = (domain[0] + domain[1]) / 2 if domain else 0.0
        light_is_high = scheme in ("blues", "greens", "oranges", "greys", "purples", "reds") and not diverging
        dark_text = f"datum.value === null || datum.value {'<' if light_is_high else '>'} {mid}"
        if diverging:
            dark_text = f"datum.value === null || abs(datum.value) < {0.5 * (domain[1] if domain else 1.0)}"
        layers.append(
            base.mark_text(fontSize=max(7, min(12, size // 3))).encode(
                text="text:N", color=alt.condition(dark_text, alt.value("black"), alt.value("white"))
            )
        )
    return alt.layer(*layers).properties(title=title, width=size * n_cols, height=size * n_rows)


def line_chart(frame: pd.DataFrame, x: str, y: str, series: str, title: str = "", x_title: str | None = None,
               y_title: str | None = None) -> alt.Chart:  # fmt: skip
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


# ---- export ---------------------------------------------------------------------------------------
# Streamlit's chart toolbar offers PNG only, so the app renders exports itself, on the server, with
# vl-convert (the Vega project's own renderer, used by Altair's chart.save): the file is exactly the
# chart on screen, and nothing is computed until a user asks for it.
def to_svg(chart: alt.TopLevelMixin) -> str:
    """The chart as an SVG document (text)."""
    import vl_convert

    return vl_convert.vegalite_to_svg(chart.to_dict())


def to_png(chart: alt.TopLevelMixin, scale: float = 2.0) -> bytes:
    """The chart as PNG bytes, `scale` times its size on screen (2: sharp on a projector or in slides)."""
    import vl_convert

    return vl_convert.vegalite_to_png(chart.to_dict(), scale=scale)
