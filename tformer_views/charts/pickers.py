"""Charts you click to choose: a layers x heads grid, and a picture's patches.

Streamlit returns a click as a selection event; `tformer_app.events` reads the chosen cell or patch
from it (the parameter and field names are the ones these specs declare).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from ..pictures import data_uri
from .spec import channel, layered, named_data

__all__ = ["PICKER_PADDING", "SIDES", "head_grid_chart", "patch_picker", "thumbnail_picker"]


def head_grid_chart(
    values: np.ndarray,
    selected: tuple[int, int] | None = None,
    title: str = "",
    value_title: str = "value",
    cell_px: int = 22,
) -> dict:
    """A clickable layers x heads grid (Vega-Lite; selection parameter "cell" with fields layer, head); its colour
    legend lies under the grid, no wider than it (the grid sits in narrow columns, and on phones)."""
    values = np.asarray(values, dtype=np.float64)
    layers, heads = np.meshgrid(np.arange(values.shape[0]), np.arange(values.shape[1]), indexing="ij")
    frame = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "value": values.ravel()})
    chosen = (
        frame.iloc[0:0] if selected is None else frame[(frame["layer"] == selected[0]) & (frame["head"] == selected[1])]
    )
    x, y = channel("head", "ordinal", title="head"), channel("layer", "ordinal", title="layer")
    legend = {"orient": "bottom", "gradientLength": max(60, min(200, cell_px * values.shape[1]))}
    datasets: dict[str, Any] = {}
    cells = {
        "name": "cells",
        "data": named_data(frame, datasets),
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 1},
        "encoding": {
            "x": x,
            "y": y,
            "color": channel("value", "quantitative", scale={"scheme": "blues"}, title=value_title, legend=legend),
            "tooltip": [
                channel("layer", "ordinal", title="layer"),
                channel("head", "ordinal", title="head"),
                channel("value", "quantitative", format=".2f", title=value_title),
            ],
        },
    }
    outline = {
        "data": named_data(chosen.reset_index(drop=True), datasets),
        "mark": {"type": "rect", "fill": None, "stroke": "#d62728", "strokeWidth": 2.5},
        "encoding": {"x": x, "y": y},
    }
    cell = {"name": "cell", "views": ["cells"], "select": {"type": "point", "fields": ["layer", "head"], "on": "click"}}
    lines: str | list[str] = title
    if len(title) > 32 and " (" in title:  # a long title on two lines, its parenthesis below: no wider than the grid
        first, _, rest = title.partition(" (")
        lines = [first, f"({rest}"]
    return layered(
        [cells, outline],
        datasets,
        lines,
        width=cell_px * values.shape[1],
        height=cell_px * values.shape[0],
        params=[cell],
    )


def _picture_layer(
    picture: Image.Image, datasets: dict[str, Any], png: bytes | None = None, size: tuple[Any, Any] | None = None
) -> dict:
    """The picture itself as a chart layer (a JPEG data URI, or `png` as given), drawn from the top left at its
    own size, or at `size` (pixels or Vega expressions: a picture that follows the chart's width)."""
    width, height = size or (picture.width, picture.height)
    mark = {"type": "image", "width": width, "height": height}
    mark |= {"align": "left", "baseline": "top", "aspect": False}
    url = data_uri(picture) if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return {
        "data": named_data(pd.DataFrame({"url": [url]}), datasets),
        "mark": mark,
        "encoding": {"url": channel("url", "nominal"), "x": {"value": 0}, "y": {"value": 0}},
    }


PICKER_PADDING = 5  # pixels left and right of the picture (Vega's default padding)
SIDES = {"left": PICKER_PADDING, "right": PICKER_PADDING, "top": PICKER_PADDING}  # Streamlit sets the bottom


def patch_picker(
    picture: Image.Image, grid_hw: tuple[int, int], selected: int | None, title: str = "", width: int | None = None
) -> dict:
    """A Vega-Lite chart: `picture` (e.g. an overlay) with its patch grid; clicking a patch selects it.

    Selection parameter "patch" with the field "patch" (row-major index). The picture travels as a
    JPEG inside the spec, the grid as rows x cols small records.

    width: the picture's width on screen (default: its own); the chart fits its width (autosize "fit-x"), so in
    a narrower column the picture, its grid and the clicks shrink with it, keeping its proportions (the
    chart's height stays, with room to spare under the picture).
    """
    rows, cols = grid_hw
    r, c = np.divmod(np.arange(rows * cols), cols)
    cells = pd.DataFrame({"patch": np.arange(rows * cols), "row": r, "col": c})
    datasets: dict[str, Any] = {}
    shown_w = width or picture.width
    shown_h = round(picture.height * shown_w / picture.width)
    aspect = picture.height / picture.width
    tall = {"expr": f"width * {aspect:.6g}"}  # the picture's height for the width the chart was given
    x = channel("col", "ordinal", axis=None, scale={"paddingInner": 0, "paddingOuter": 0})
    y = channel("row", "ordinal", axis=None, scale={"paddingInner": 0, "paddingOuter": 0, "rangeMax": tall})
    tooltip = [channel(f, "quantitative", title=t) for f, t in (("patch", "patch"), ("row", "row"), ("col", "column"))]
    hover = {"condition": {"param": "hover", "empty": False, "value": 0.3}, "value": 0.001}
    grid = {
        "name": "cells",
        "data": named_data(cells, datasets),
        "mark": {"type": "rect", "fill": "white", "stroke": "white", "strokeOpacity": 0.35, "strokeWidth": 0.5}
        | {"cursor": "pointer"},
        "encoding": {"x": x, "y": y, "fillOpacity": hover, "tooltip": tooltip},
    }
    layers = [_picture_layer(picture, datasets, size=({"expr": "width"}, tall)), grid]
    if selected is not None:
        chosen = cells[cells["patch"] == selected].reset_index(drop=True)
        outline = {"type": "rect", "fill": None, "stroke": "#00e5ff", "strokeWidth": 2.5}
        layers.append({"data": named_data(chosen, datasets), "mark": outline, "encoding": {"x": x, "y": y}})
    on_hover = {"type": "point", "fields": ["patch"], "on": "pointerover", "clear": "pointerout"}
    params = [
        {"name": "patch", "views": ["cells"], "select": {"type": "point", "fields": ["patch"], "on": "click"}},
        {"name": "hover", "views": ["cells"], "select": on_hover},
    ]
    # Width and padding add up to the whole chart's width, the most it takes (`fit-x` contains the padding).
    spec = layered(
        layers, datasets, title, width=shown_w + 2 * PICKER_PADDING, height=shown_h, params=params, padding=SIDES
    )
    spec["autosize"] = {"type": "fit-x", "contains": "padding"}
    spec["config"] = {"view": {"stroke": None}}
    return spec


def thumbnail_picker(
    png: bytes, boxes: dict[tuple[int, int], tuple[int, int, int, int]], width: int | None = None
) -> dict:
    """A Vega-Lite chart: a PNG of thumbnails (the layers x heads overview) where a click on a thumbnail
    selects it. boxes: (layer, head) -> (left, top, right, bottom) pixels of the PNG. Selection parameter
    "cell" with the fields layer and head, as the head grid's. The chart does not depend on the chosen head, so
    Streamlit sends it once (its picture can weigh a megabyte) and a head change costs nothing here.
    width: the picture's width on screen (its own by default), its height in proportion."""
    picture = Image.open(io.BytesIO(png))
    shown_w = int(width or picture.width)
    shown_h = round(picture.height * shown_w / picture.width)
    frame = pd.DataFrame(
        [{"layer": l, "head": h, "x": a, "x2": c, "y": b, "y2": d} for (l, h), (a, b, c, d) in boxes.items()]
    )
    datasets: dict[str, Any] = {}
    px = {"type": "quantitative", "axis": None}
    x = {"field": "x", **px, "scale": {"domain": [0, picture.width], "range": [0, shown_w], "nice": False}}
    y = {"field": "y", **px, "scale": {"domain": [0, picture.height], "range": [0, shown_h], "nice": False}}
    hover = {"condition": {"param": "hover", "empty": False, "value": 0.25}, "value": 0.001}
    tooltip = [channel("layer", "ordinal", title="layer"), channel("head", "ordinal", title="head")]
    cells = {
        "name": "cells",
        "data": named_data(frame, datasets),
        "mark": {"type": "rect", "fill": "white", "cursor": "pointer"},
        "encoding": {"x": x, "x2": {"field": "x2"}, "y": y, "y2": {"field": "y2"}, "fillOpacity": hover}
        | {"tooltip": tooltip},
    }
    layers = [_picture_layer(picture, datasets, png, size=(shown_w, shown_h)), cells]
    params = [
        {"name": "cell", "views": ["cells"], "select": {"type": "point", "fields": ["layer", "head"], "on": "click"}},
        {"name": "hover", "views": ["cells"], "select": {"type": "point", "on": "pointerover", "clear": "pointerout"}},
    ]
    spec = layered(layers, datasets, "", width=shown_w, height=shown_h, params=params)
    spec["config"] = {"view": {"stroke": None}}
    return spec
