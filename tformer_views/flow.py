"""How information flows to a prediction, drawn: the graph of tformer_core.flow as a Vega-Lite chart and a table.

    f = information_flow(model, trace)                    # tformer_core.flow: every update's shares
    graph = flow_graph(f, threshold=0.04)
    spec = flow_chart(graph, display_tokens(trace.tokens))   # layers up, positions across; click an edge
    strongest_edges(graph, labels, k=8)                   # the attention edges with the largest shares

The chart puts the input tokens along the bottom and the prediction on top. Each layer is two rows: the stream
after its attention, then after its FFN. An attention edge runs from source j one row up to position i, coloured
by the head with the largest share of it (the head view's colours); a residual edge is a grey vertical line, an
FFN's a dark one beside it. Width and opacity grow with the share. Clicking an attention edge selects the
selection parameter "edge" with fields layer and head (that head's views).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tformer_core.flow import FlowEdge, FlowGraph

from .charts.attention import head_colour_scale
from .charts.spec import channel, layered, named_data

__all__ = ["EDGE_PARAM", "FFN_COLOUR", "RESIDUAL_COLOUR", "edge_frame", "flow_chart", "level_name", "strongest_edges"]

EDGE_PARAM = "edge"  # the selection parameter a click on an attention edge sets (fields layer, head)
RESIDUAL_COLOUR = "#bbbbbb"
FFN_COLOUR = "#444444"
# Sideways offsets (in positions) that keep the three vertical edges of one position apart: the FFN's left of the
# residual, an attention edge's ends (a position's edge to itself too) right of it.
OFFSETS = {"ffn": -0.14, "residual": 0.0, "attention": 0.14}
MAX_WIDTH_PX = 7.0  # an edge with share 1


def level_name(level: int) -> str:
    """Row `level` of the graph in words: 0 the input, 2l + 1 after layer l's attention, 2l + 2 after its FFN."""
    if level == 0:
        return "input"
    layer, stage = divmod(level - 1, 2)
    return f"layer {layer} {'attention' if stage == 0 else 'FFN'}"


def edge_frame(graph: FlowGraph, labels: Sequence[str]) -> pd.DataFrame:
    """One row per kept edge: kind, stage, layer, head (-1 where none), source, target, share, the ends' drawing
    coordinates (x, y, x2, y2: positions across, levels up), its source and target tokens and a line naming it."""
    rows = []
    for e in graph.edges:
        shift = OFFSETS[e.kind]
        rows.append(
            {
                "kind": e.kind,
                "stage": e.stage,
                "layer": e.layer,
                "head": -1 if e.head is None else e.head,
                "source": e.source,
                "target": e.target,
                "share": e.share,
                "x": e.source + shift,
                "y": e.source_level,
                "x2": e.target + shift,
                "y2": e.target_level,
                "source_token": labels[e.source],
                "target_token": labels[e.target],
                "what": _edge_words(e, labels),
            }
        )
    columns = ["kind", "stage", "layer", "head", "source", "target", "share", "x", "y", "x2", "y2"]
    return pd.DataFrame(rows, columns=[*columns, "source_token", "target_token", "what"])


def _edge_words(e: FlowEdge, labels: Sequence[str]) -> str:
    if e.kind == "attention":
        return f"layer {e.layer}: {labels[e.source]} → {labels[e.target]} (mostly head {e.head})"
    if e.kind == "ffn":
        return f"layer {e.layer} FFN at {labels[e.target]}"
    return f"layer {e.layer} residual past the {'attention' if e.stage == 'attn' else 'FFN'} at {labels[e.target]}"


MIN_WIDTH = 200  # the graph's plot, at the narrowest
LABELS_PX = 70  # beside the plot: the layer labels on the left and the padding


def flow_chart(
    graph: FlowGraph,
    labels: Sequence[str],
    n_heads: int,
    predicted: str = "",
    selected: tuple[int, int] | None = None,
    width: int | None = None,
    room: int | None = None,
) -> dict:
    """The graph as a Vega-Lite chart (module docstring). labels: the positions' tokens as shown; n_heads: the
    heads the colours are for; predicted: the prediction's label, printed above its node; selected: a (layer,
    head) whose edges are outlined. Width: about 56 px a position (360 to 900) unless given, and no wider than
    `room` (the page's column, CSS pixels) allows beside the layer labels: a phone's 358 px."""
    n, levels = len(labels), 2 * graph.n_layers + 1
    width = width or max(360, min(900, 56 * n))
    if room is not None:
        width = max(MIN_WIDTH, min(width, room - LABELS_PX))
    level_px = max(10, min(34, 620 // levels))
    datasets: dict = {}
    frame = edge_frame(graph, labels)
    x_scale = {"domain": [-0.6, n - 0.4], "nice": False}
    y_scale = {"domain": [-1.4, levels - 0.2 + (0.8 if predicted else 0)], "nice": False}
    x = channel("x", "quantitative", scale=x_scale, axis=None)
    y = channel("y", "quantitative", scale=y_scale, axis=_level_axis(graph.n_layers))
    layers = [_edges_layer(frame, datasets, kind, x, y, n_heads) for kind in ("residual", "ffn", "attention")]
    layers.append(_attention_hits(frame, datasets, x, y))
    if selected is not None:
        chosen = frame[
            (frame["kind"] == "attention") & (frame["layer"] == selected[0]) & (frame["head"] == selected[1])
        ]
        layers.append(_outline(chosen.reset_index(drop=True), datasets, x, y))
    layers.append(_nodes_layer(graph, labels, datasets, x, y))
    layers.append(_tokens_layer(labels, datasets, x, y))
    if predicted:
        top = pd.DataFrame({"x": [graph.prediction], "y": [levels - 0.4], "text": [f"→ {predicted}"]})
        layers.append(
            {
                "data": named_data(top, datasets),
                "mark": {"type": "text", "fontWeight": "bold", "baseline": "bottom"},
                "encoding": {"x": x, "y": y, "text": channel("text", "nominal")},
            }
        )
    # Two lines: one would be cut at a phone's width (the chart's own width, not the title's, is what fits).
    title = [f"Routes to the prediction at {labels[graph.prediction]}", f"(edges with share > {graph.threshold:.2f})"]
    params = [
        {
            "name": EDGE_PARAM,
            "views": ["attention_hits"],
            "select": {"type": "point", "fields": ["layer", "head"], "on": "click"},
        }
    ]
    # Room on the left for the layer labels: Streamlit's column would otherwise cut their first letters.
    padding = {"left": 12, "top": 5, "right": 5, "bottom": 5}
    height = level_px * (levels + 2)
    return layered(layers, datasets, title, width=width, height=height, params=params, padding=padding)


def _level_axis(n_layers: int) -> dict:
    """The left axis: a label at every layer's output (even levels), "input" at the bottom."""
    values = list(range(0, 2 * n_layers + 1, 2 if n_layers <= 16 else 4))
    label = "datum.value == 0 ? 'input' : 'layer ' + (datum.value / 2 - 1)"
    return {"values": values, "labelExpr": label, "title": None, "grid": False, "domain": False, "ticks": False}


def _edges_layer(frame: pd.DataFrame, datasets: dict, kind: str, x: dict, y: dict, n_heads: int) -> dict:
    part = frame[frame["kind"] == kind].reset_index(drop=True)
    if kind == "attention":
        colour = channel("head", "nominal", scale=head_colour_scale(n_heads), title="head", legend={"orient": "right"})
    else:
        colour = {"value": FFN_COLOUR if kind == "ffn" else RESIDUAL_COLOUR}
    return {
        "data": named_data(part, datasets),
        "mark": {"type": "rule", "strokeCap": "round"},
        "encoding": {
            "x": x,
            "y": y,
            "x2": {"field": "x2"},
            "y2": {"field": "y2"},
            "color": colour,
            "strokeWidth": channel(
                "share", "quantitative", scale={"domain": [0, 1], "range": [0.6, MAX_WIDTH_PX]}, legend=None
            ),
            "opacity": channel("share", "quantitative", scale={"domain": [0, 1], "range": [0.35, 1.0]}, legend=None),
            "tooltip": [channel("what", "nominal", title="edge"), channel("share", "quantitative", format=".3f")],
        },
    }


def _attention_hits(frame: pd.DataFrame, datasets: dict, x: dict, y: dict) -> dict:
    """Wide, nearly transparent copies of the attention edges: what a click lands on (a thin line is hard to hit)."""
    part = frame[frame["kind"] == "attention"].reset_index(drop=True)
    return {
        "name": "attention_hits",
        "data": named_data(part, datasets),
        "mark": {"type": "rule", "strokeWidth": 9, "opacity": 0.01, "cursor": "pointer"},
        "encoding": {
            "x": x,
            "y": y,
            "x2": {"field": "x2"},
            "y2": {"field": "y2"},
            "tooltip": [
                channel("what", "nominal", title="edge"),
                channel("share", "quantitative", format=".3f"),
                channel("head", "ordinal", title="click: open head"),
            ],
        },
    }


def _outline(chosen: pd.DataFrame, datasets: dict, x: dict, y: dict) -> dict:
    return {
        "data": named_data(chosen, datasets),
        "mark": {"type": "rule", "stroke": "#d62728", "strokeWidth": 2, "strokeDash": [4, 2]},
        "encoding": {"x": x, "y": y, "x2": {"field": "x2"}, "y2": {"field": "y2"}},
    }


def _nodes_layer(graph: FlowGraph, labels: Sequence[str], datasets: dict, x: dict, y: dict) -> dict:
    nodes = sorted(graph.nodes)
    frame = pd.DataFrame(
        {
            "x": [p for _, p in nodes],
            "y": [lv for lv, _ in nodes],
            "where": [f"{level_name(lv)} at {labels[p]}" for lv, p in nodes],
            "prediction": [lv == 2 * graph.n_layers for lv, _ in nodes],
        }
    )
    return {
        "data": named_data(frame, datasets),
        "mark": {"type": "point", "filled": True, "size": 22},
        "encoding": {
            "x": x,
            "y": y,
            "color": {"condition": {"test": "datum.prediction", "value": "#d62728"}, "value": "#555555"},
            "tooltip": [channel("where", "nominal", title="residual stream")],
        },
    }


def _tokens_layer(labels: Sequence[str], datasets: dict, x: dict, y: dict) -> dict:
    """The input tokens along the bottom, slanted so that long ones do not overlap."""
    frame = pd.DataFrame({"x": np.arange(len(labels)), "y": -0.5, "text": list(labels)})
    return {
        "data": named_data(frame, datasets),
        "mark": {"type": "text", "angle": 320, "align": "right", "baseline": "top", "limit": 90},
        "encoding": {"x": x, "y": y, "text": channel("text", "nominal")},
    }


def strongest_edges(graph: FlowGraph, labels: Sequence[str], k: int = 8) -> pd.DataFrame:
    """The k attention edges of the graph with the largest shares: layer, head (the one with the largest share of
    the edge), source and target tokens, share of the update at the target."""
    edges = sorted((e for e in graph.edges if e.kind == "attention"), key=lambda e: -e.share)[:k]
    return pd.DataFrame(
        {
            "layer": [e.layer for e in edges],
            "head": [e.head for e in edges],
            "from": [labels[e.source] for e in edges],
            "to": [labels[e.target] for e in edges],
            "share": [round(e.share, 3) for e in edges],
        },
        columns=["layer", "head", "from", "to", "share"],
    )
