"""Charts of the page "Inside a block": the block as a flow diagram, the residual stream's size across
layers, and the feed-forward network's hidden units before and after the activation (Vega-Lite dicts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..lessons.block import FlowNode
from .spec import AUTOSIZE, VEGA_LITE_SCHEMA, channel, fitting, layered, named_data

__all__ = [
    "BOX_HALF_HEIGHT",
    "BOX_HALF_WIDTH",
    "FLOW_COLOURS",
    "NORM_COLOURS",
    "ROW_PX",
    "SKIP_X",
    "WIDTH_PX",
    "activation_chart",
    "flow_chart",
    "norms_chart",
]

# The colours of the lecture's figure (Attention Is All You Need, Fig. 1): attention orange, the FFN blue,
# Add & Norm yellow.
FLOW_COLOURS = {
    "io": "#eeeeee",
    "norm": "#f7edb0",
    "attn": "#f9cfa5",
    "cross": "#f4b183",
    "mlp": "#bcd7f0",
    "add": "#ffffff",
}
BOX_HALF_WIDTH, BOX_HALF_HEIGHT, SKIP_X = 1.0, 0.32, 1.45
ROW_PX, WIDTH_PX = 46, 330


def _flow_frames(nodes: Sequence[FlowNode]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(boxes, line segments, arrow heads) in the diagram's units: node i is centred at (0, i)."""
    boxes = pd.DataFrame(
        {
            "y": np.arange(len(nodes), dtype=float),
            "label": [n.label for n in nodes],
            "detail": [n.detail for n in nodes],
            "kind": [n.kind for n in nodes],
            "colour": [FLOW_COLOURS[n.kind] for n in nodes],
        }
    )
    half = [0.16 if n.kind == "add" else BOX_HALF_HEIGHT for n in nodes]
    segments, heads = [], []
    for i in range(len(nodes) - 1):  # the main line, top to bottom
        segments.append((0.0, i + half[i], 0.0, i + 1 - half[i + 1]))
        heads.append((0.0, i + 1 - half[i + 1], "triangle-down"))
    for i, node in enumerate(nodes):  # the residual connections: around the sub-layer, into the "+"
        if node.skip_from is None:
            continue
        branch = node.skip_from + 0.5
        segments += [(0.0, branch, SKIP_X, branch), (SKIP_X, branch, SKIP_X, i), (SKIP_X, i, 0.2, i)]
        heads.append((0.2, float(i), "triangle-left"))
    lines = pd.DataFrame(segments, columns=["x", "y", "x2", "y2"])
    return boxes, lines, pd.DataFrame(heads, columns=["x", "y", "shape"])


def flow_chart(nodes: Sequence[FlowNode], title: str = "", muted: bool = False) -> dict:
    """The block as boxes and arrows, top to bottom, the residual connections drawn around each sub-layer.

    muted: greyed (the placement the model does not use, drawn for comparison).
    """
    boxes, lines, heads = _flow_frames(nodes)
    n = len(nodes)
    x_scale = {"domain": [-BOX_HALF_WIDTH - 0.1, SKIP_X + 0.15], "nice": False, "zero": False}
    y_scale = {"domain": [-0.5, n - 0.5], "reverse": True, "nice": False, "zero": False}
    x = {"axis": None, "scale": x_scale}
    y = {"axis": None, "scale": y_scale}
    datasets: dict[str, Any] = {}
    box_data, line_data, head_data = (named_data(f, datasets) for f in (boxes, lines, heads))
    ink = "#888888" if muted else "#333333"
    opacity = 0.45 if muted else 1.0
    rule = {"x": channel("x", "quantitative", **x), "y": channel("y", "quantitative", **y)}
    rule |= {"x2": {"field": "x2"}, "y2": {"field": "y2"}}
    layers = [
        {"data": line_data, "mark": {"type": "rule", "color": ink, "strokeWidth": 1.5}, "encoding": rule},
        {
            "data": head_data,
            "mark": {"type": "point", "filled": True, "color": ink, "size": 60, "opacity": 1},
            "encoding": {
                "x": channel("x", "quantitative", **x),
                "y": channel("y", "quantitative", **y),
                "shape": {"field": "shape", "type": "nominal", "scale": None},
            },
        },
        _boxes_layer(box_data, x, y, ink, opacity),
        _text_layer(box_data, x, y, "label", -0.1, 12, "bold", ink),
        _text_layer(box_data, x, y, "detail", 0.15, 10, "normal", ink),
    ]
    return layered(layers, datasets, title, width=WIDTH_PX, height=ROW_PX * n)


def _boxes_layer(data: dict, x: dict, y: dict, ink: str, opacity: float) -> dict:
    """Rectangles for the boxes; the "+" of a residual connection is a circle."""
    return {
        "data": data,
        "transform": [
            {"calculate": f"datum.kind === 'add' ? -0.16 : {-BOX_HALF_WIDTH}", "as": "x1"},
            {"calculate": f"datum.kind === 'add' ? 0.16 : {BOX_HALF_WIDTH}", "as": "x2"},
            {"calculate": f"datum.y - (datum.kind === 'add' ? 0.16 : {BOX_HALF_HEIGHT})", "as": "y1"},
            {"calculate": f"datum.y + (datum.kind === 'add' ? 0.16 : {BOX_HALF_HEIGHT})", "as": "y2"},
        ],
        "mark": {"type": "rect", "stroke": ink, "strokeWidth": 1, "opacity": opacity, "cornerRadius": 4},
        "encoding": {
            "x": channel("x1", "quantitative", **x),
            "x2": {"field": "x2"},
            "y": channel("y1", "quantitative", **y),
            "y2": {"field": "y2"},
            "color": {"field": "colour", "type": "nominal", "scale": None},
            "tooltip": [channel("label", "nominal", title="step"), channel("detail", "nominal", title="what")],
        },
    }


def _text_layer(data: dict, x: dict, y: dict, field: str, offset: float, size: int, weight: str, ink: str) -> dict:
    """The label (or detail line) of each box, centred on it; a "+" circle shows its label only."""
    shown = "datum.label" if field == "label" else "''"
    return {
        "data": data,
        "transform": [
            {"calculate": "0", "as": "tx"},
            {"calculate": f"datum.y + (datum.kind === 'add' ? 0 : {offset})", "as": "ty"},
            {"calculate": f"datum.kind === 'add' ? {shown} : datum.{field}", "as": "text"},
        ],
        "mark": {"type": "text", "fontSize": size, "fontWeight": weight, "color": ink, "align": "center"},
        "encoding": {
            "x": channel("tx", "quantitative", **x),
            "y": channel("ty", "quantitative", **y),
            "text": {"field": "text", "type": "nominal"},
        },
    }


NORM_COLOURS = {
    "residual stream in (x)": "#7f7f7f",
    "self-attention adds": "#e6803a",
    "cross-attention adds": "#b8323c",
    "FFN adds": "#3a78c2",
    "block output": "#222222",
}


def norms_chart(frame: pd.DataFrame, title: str = "", width: int = 300, height: int = 240) -> dict:
    """‖v‖ per layer (long form: layer, quantity, scope, norm), one panel per scope (the chosen token, the
    mean over tokens) on a shared scale, one colour per quantity."""
    quantities = [q for q in NORM_COLOURS if q in set(frame["quantity"])]
    scopes = list(dict.fromkeys(frame["scope"]))
    datasets: dict[str, Any] = {}
    data = named_data(frame, datasets)
    colour = {"domain": quantities, "range": [NORM_COLOURS[q] for q in quantities]}
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "title": title,
        "datasets": datasets,
        "data": data,
        "facet": {"column": channel("scope", "nominal", title=None, sort=scopes, header={"labelFontSize": 12})},
        "spec": {
            "width": width,
            "height": height,
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": channel("layer", "ordinal", title="layer", axis={"labelAngle": 0}),
                "y": channel("norm", "quantitative", title="‖v‖ (Euclidean norm)"),
                "color": channel("quantity", "nominal", title=None, scale=colour, legend={"orient": "bottom"}),
                "tooltip": [
                    channel("layer", "ordinal"),
                    channel("quantity", "nominal"),
                    channel("scope", "nominal"),
                    channel("norm", "quantitative", format=".4~g"),
                ],
            },
        },
        "resolve": {"scale": {"y": "shared"}},
        "autosize": AUTOSIZE,
    }


def activation_chart(hidden_pre: np.ndarray, hidden: np.ndarray, activation: str, title: str = "") -> dict:
    """Every hidden unit of the FFN for one token: its input (x W1 + b1) against its output after the
    activation; the points lie on the activation's curve. Units with a positive input are coloured. The plot
    is 420 px wide where there is room, narrower in a narrower column."""
    pre = np.asarray(hidden_pre, dtype=np.float64).reshape(-1)
    post = np.asarray(hidden, dtype=np.float64).reshape(-1)
    frame = pd.DataFrame(
        {
            "unit": np.arange(1, pre.size + 1, dtype=np.int32),
            "before": pre,
            "after": post,
            "state": np.where(pre > 0, "input > 0", "input ≤ 0"),
        }
    )
    datasets: dict[str, Any] = {}
    layer = {
        "data": named_data(frame, datasets),
        "mark": {"type": "point", "filled": True, "size": 14, "opacity": 0.6},
        "encoding": {
            "x": channel("before", "quantitative", title="before the activation: x W₁ + b₁"),
            "y": channel("after", "quantitative", title=f"after {activation}"),
            "color": channel(
                "state",
                "nominal",
                title=None,
                scale={"domain": ["input > 0", "input ≤ 0"], "range": ["#d62728", "#7f7f7f"]},
                legend={"orient": "bottom"},
            ),
            "tooltip": [
                channel("unit", "quantitative"),
                channel("before", "quantitative", format=".4~g"),
                channel("after", "quantitative", format=".4~g"),
            ],
        },
    }
    return fitting(layered([layer], datasets, title, height=260), 420, margin=70)  # legend below
