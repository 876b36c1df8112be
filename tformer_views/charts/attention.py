"""Charts of attention: the head view (queries to keys, one colour per head) and how far each head looks."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd

from ..text import HeadView
from .spec import channel, layered, named_data

__all__ = [
    "FAINT",
    "FAINT_COLOUR",
    "HEAD_COLOURS",
    "HEAD_VIEW_PARAMS",
    "distance_chart",
    "distance_frame",
    "head_colour_scale",
    "head_view_chart",
]

# One colour per head, the same in every view (Tableau 20: distinct enough for 16 heads).
HEAD_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)


def head_colour_scale(n_heads: int) -> dict:
    """Vega-Lite colour scale giving head h its HEAD_COLOURS entry."""
    return {"domain": list(range(n_heads)), "range": [HEAD_COLOURS[h % len(HEAD_COLOURS)] for h in range(n_heads)]}


def _token_labels(data: dict, side: str, x: dict, y_scale: dict, font: float) -> dict:
    """The tokens of one side of the head view: queries on the left (hovered to focus), keys on the right."""
    query = side == "query"
    layer: dict[str, Any] = {
        "data": data,
        "mark": {"type": "text", "align": "right" if query else "left", "baseline": "middle", "dx": -6 if query else 6}
        | {"fontSize": font},
        "encoding": {
            "x": x,
            "y": channel("y", "quantitative", scale=y_scale, axis=None),
            "text": channel("token", "nominal"),
            "tooltip": [channel("token", "nominal", title=side), channel(side, "quantitative", title="position")],
        },
    }
    if query:
        layer["name"] = "query_tokens"
        layer["encoding"]["opacity"] = {"condition": {"param": "focus", "empty": True, "value": 1.0}, "value": 0.35}
    return layer


def _line_data(lines: pd.DataFrame) -> pd.DataFrame:
    """The lines as the chart needs them, weakest first (drawn in this order: the strongest on top), in small
    types: what a layer switch sends (1,400 lines: 25 KB, not 100). Their tokens are looked up in the
    browser from the two columns of labels (the `lookup` transforms of head_view_chart)."""
    order = np.argsort(lines["weight"].to_numpy(), kind="stable")
    column = {name: lines[name].to_numpy()[order] for name in ("head", "query", "y_query", "y_key", "weight")}
    return pd.DataFrame(
        {
            "head": column["head"].astype(np.int16),
            "query": column["query"].astype(np.int32),
            "y_query": column["y_query"].astype(np.int32),
            "y_key": column["y_key"].astype(np.int32),
            "weight": column["weight"].astype(np.float32),
        }
    )


FAINT = 0.15  # the other heads' lines beside a highlighted head: this much of their weight as opacity
FAINT_COLOUR = "#9e9e9e"


# The head view's selections: the query token under the pointer, and the heads clicked in the legend.
HEAD_VIEW_PARAMS = [
    {
        "name": "focus",
        "views": ["query_tokens"],
        "select": {"type": "point", "fields": ["query"], "on": "pointerover", "clear": "pointerout"},
    },
    {"name": "heads", "views": ["lines"], "select": {"type": "point", "fields": ["head"]}, "bind": "legend"},
]


def head_view_chart(
    view: HeadView,
    n_heads: int,
    title: str = "",
    row_px: int = 18,
    scale: float = 1.0,
    highlight: int | None = None,
    width: int = 600,
) -> dict:
    """Head view (Vega-Lite): hover a query token (left) to see only its lines; click a head in the legend to
    see only that head (shift-click: several; click elsewhere: all again); opacity = weight. Where lines
    overlap the strongest is drawn on top, so it is the one a pointer over them reports. scale: sizes and
    type (1.5 in presenter mode). highlight: a head drawn in its colour on top, the others grey and faint
    (FAINT times their weight), so stepping through the heads shows each in turn among the rest. width: the
    most the chart takes (it fits a narrower column)."""
    n = max(len(view.queries), len(view.keys), 1)
    # The two columns at a quarter and three quarters of the plot's width, whatever that width is: the chart
    # fits its column (autosize "fit-x"), 600 px where there is room, a phone's width on a phone.
    left_x, right_x = {"value": {"expr": "width * 0.25"}}, {"value": {"expr": "width * 0.75"}}
    y_scale = {"domain": [-0.5, n - 0.5], "reverse": True, "nice": False, "zero": False}  # first token on top
    datasets: dict[str, Any] = {}
    shown = {"and": [{"param": "focus", "empty": True}, {"param": "heads", "empty": True}]}  # hovered query, legend
    query_data, key_data = named_data(view.queries, datasets), named_data(view.keys, datasets)
    tokens, colour, weight, order = _line_style(query_data, key_data, n_heads, highlight)
    lines = {
        "name": "lines",
        "data": named_data(_line_data(view.lines), datasets),
        "transform": tokens,
        "mark": {"type": "rule", "strokeWidth": 2 * scale},
        "encoding": {
            "x": left_x,
            "x2": right_x,
            "y": channel("y_query", "quantitative", scale=y_scale, axis=None),
            "y2": {"field": "y_key"},
            "color": colour,
            # strokeOpacity, not opacity: the same line on screen, but an SVG element's opacity makes resvg (the
            # PNG export) draw it through a layer the size of the picture (1,400 lines: 17 s instead of 3 s).
            "strokeOpacity": {"condition": {"test": shown, **weight}, "value": 0.0},
            "order": order,
            "tooltip": [
                *(channel(f"{x}_token", "nominal", title=x) for x in ("query", "key")),
                channel("head", "nominal", title="head"),
                channel("weight", "quantitative", format=".3f", title="weight"),
            ],
        },
    }
    labels = [
        _token_labels(query_data, "query", left_x, y_scale, 12 * scale),
        _token_labels(key_data, "key", right_x, y_scale, 12 * scale),
    ]
    size = {"width": int(width), "height": row_px * scale * n}
    spec = layered([lines, *labels], datasets, title, **size, params=copy.deepcopy(HEAD_VIEW_PARAMS))
    # usermeta: drawn at the presenter's size already (tformer_app.presenter.chart_fonts leaves it as it is)
    return spec | {"autosize": {"type": "fit-x", "contains": "padding"}, "usermeta": {"scale": scale}}


def _line_style(
    query_data: dict[str, str], key_data: dict[str, str], n_heads: int, highlight: int | None
) -> tuple[list[dict[str, Any]], dict, dict, dict]:
    """The head view's lines: (transforms, colour, opacity, drawing order). With a highlighted head, that head in
    its colour on top and the others grey at FAINT times their weight."""
    weight = channel("weight", "quantitative", legend=None, scale={"domain": [0, 1], "range": [0, 1]})
    tokens: list[dict[str, Any]] = [
        {"lookup": "y_query", "from": {"data": query_data, "key": "y", "fields": ["token"]}, "as": ["query_token"]},
        {"lookup": "y_key", "from": {"data": key_data, "key": "y", "fields": ["token"]}, "as": ["key_token"]},
    ]
    colour = channel("head", "nominal", scale=head_colour_scale(n_heads), title="head")
    order = channel("weight", "quantitative")
    if highlight is not None:
        chosen = f"datum.head === {int(highlight)}"
        shade = {"calculate": f"{chosen} ? datum.weight : {FAINT} * datum.weight", "as": "shade"}
        tokens = [*tokens, shade, {"calculate": f"({chosen} ? 1 : 0) + datum.weight", "as": "rank"}]
        weight = channel("shade", "quantitative", legend=None, scale={"domain": [0, 1], "range": [0, 1]})
        colour = {"condition": {"test": f"!({chosen})", "value": FAINT_COLOUR}, **colour}
        order = channel("rank", "quantitative")  # the highlighted head's lines on top
    return tokens, colour, weight, order


def distance_frame(values: np.ndarray) -> pd.DataFrame:
    """[layers, heads] -> long DataFrame (layer, head, distance)."""
    layers, heads = np.meshgrid(np.arange(values.shape[0]), np.arange(values.shape[1]), indexing="ij")
    return pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "distance": np.asarray(values).ravel()})


def distance_chart(
    values: np.ndarray,
    baseline: float,
    n_heads: int,
    selected: tuple[int, int] | None = None,
    title: str = "",
    unit: str = "tokens",
) -> dict:
    """Scatter (Vega-Lite) of values [layers, heads]: x layer, y mean distance (in `unit`), one dot per head;
    a dashed rule at the uniform baseline. As the ViT paper draws it (Fig. 7, right) for pixels.

    The chart fits its width (autosize "fit-x"): "width" is the whole chart's, axes and legend included, and
    in a narrower column it shrinks to fit."""
    frame = distance_frame(values)
    frame["chosen"] = False
    if selected is not None:
        frame["chosen"] = (frame["layer"] == selected[0]) & (frame["head"] == selected[1])
    y = channel("distance", "quantitative", title=f"mean attention distance ({unit})")
    datasets: dict[str, Any] = {}
    dots = {
        "data": named_data(frame, datasets),
        "mark": {"type": "circle", "opacity": 0.85},
        "encoding": {
            "x": channel("layer", "quantitative", title="layer", axis={"tickMinStep": 1, "format": "d"}),
            "y": y,
            "color": channel("head", "nominal", scale=head_colour_scale(n_heads), title="head"),
            "size": {"condition": {"test": "datum.chosen", "value": 180}, "value": 60},
            "tooltip": [
                channel("layer", "quantitative", title="layer"),
                channel("head", "nominal", title="head"),
                channel("distance", "quantitative", format=".2f", title=f"distance ({unit})"),
            ],
        },
    }
    base = named_data(pd.DataFrame({"distance": [baseline], "label": [f"uniform attention: {baseline:.2f}"]}), datasets)
    rule = {"data": base, "mark": {"type": "rule", "strokeDash": [6, 4], "color": "#555"}, "encoding": {"y": y}}
    text = {
        "data": base,
        "mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "color": "#555"},
        "encoding": {"y": y, "x": {"value": 0}, "text": channel("label", "nominal")},
    }
    spec = layered([dots, rule, text], datasets, title, width=480 + 130, height=280)  # 130: axes, legend
    return spec | {"autosize": {"type": "fit-x", "contains": "padding"}}
