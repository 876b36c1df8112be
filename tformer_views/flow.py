"""How information flows to a prediction, drawn: the graph of tformer_core.flow as a Vega-Lite chart and a table.

    f = information_flow(model, trace)                    # tformer_core.flow: every update's shares
    graph = flow_graph(f, threshold=0.04)
    spec = flow_chart(graph, display_tokens(trace.tokens))   # layers up, positions across; click an edge
    strongest_edges(graph, labels, k=8)                   # the attention edges with the largest shares
    held = flow_rollout(f)                                # a ViT's class token: every route followed back
    held_over_patches(held, layer, trace.n_prefix_tokens, trace.patch_grid)   # [rows, cols], over the picture
    held_chart(held_by_layer(held, trace.tokens, trace.n_prefix_tokens))       # where it sits before each layer

The chart puts the input tokens along the bottom and the prediction on top. Each layer is two rows: the stream
after its attention, then after its FFN. An attention edge runs from source j one row up to position i, coloured
by the head with the largest share of it (the head view's colours); a residual edge is a grey vertical line, an
FFN's a dark one beside it. Width and opacity grow with the share. Clicking an attention edge selects the
selection parameter "edge" with fields layer and head (that head's views).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core.flow import Flow, FlowEdge, FlowGraph, edges_into, flow_rollout, information_flow
from tformer_core.models.base import TracedModel
from tformer_core.trace import Trace

from .charts.attention import head_colour_scale
from .charts.spec import channel, fitting, layered, named_data

__all__ = [
    "AROUND_PLOT_PX",
    "EDGE_PARAM",
    "FFN_COLOUR",
    "HELD_PLACES",
    "MIN_LEVEL_PX",
    "RESIDUAL_COLOUR",
    "ClassTokenFlow",
    "class_token_flow",
    "edge_frame",
    "flow_chart",
    "held_by_layer",
    "held_chart",
    "held_over_patches",
    "level_name",
    "strongest_edges",
    "strongest_reads",
]

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
MIN_LEVEL_PX = 5  # a level's height, at the least: an edge of one level is still a visible line
# Above and below the plot on a projector's screen: the title's two lines and the tokens under the plot (at presenter
# type), the page's sticky bar.
AROUND_PLOT_PX = 250
LABELS_PX = 70  # beside the plot: the layer labels on the left and the padding


def flow_chart(
    graph: FlowGraph,
    labels: Sequence[str],
    n_heads: int,
    predicted: str = "",
    selected: tuple[int, int] | None = None,
    width: int | None = None,
    room: int | None = None,
    screen: int | None = None,
) -> dict:
    """The graph as a Vega-Lite chart (module docstring). labels: the positions' tokens as shown; n_heads: the
    heads the colours are for; predicted: the prediction's label, printed above its node; selected: a (layer,
    head) whose edges are outlined. Width: about 56 px a position (360 to 900) unless given, and no wider than
    `room` (the page's column, CSS pixels) allows beside the layer labels: a phone's 358 px. Height: 10 to 34 px
    a level, and with `screen` (a projector's height, CSS pixels) the whole chart within it, its title and the
    tokens under the plot included (SmolLM2's 61 levels at 7 px on a 720 px screen)."""
    n, levels = len(labels), 2 * graph.n_layers + 1
    width = width or max(360, min(900, 56 * n))
    if room is not None:
        width = max(MIN_WIDTH, min(width, room - LABELS_PX))
    level_px = max(10, min(34, 620 // levels))
    if screen is not None:
        level_px = max(MIN_LEVEL_PX, min(level_px, (screen - AROUND_PLOT_PX) // (levels + 2)))
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


# ---- a ViT's class token: the rollout of tformer_core.flow.flow_rollout over the picture -----------------------

HELD_PLACES = ("class token", "other special tokens", "patches", "taken by biases")


@dataclass(frozen=True, eq=False)
class ClassTokenFlow:
    """What the Vision page draws of a picture's flow, small enough to cache: held [2L + 1, T] the rollout to the
    class token (tformer_core.flow.flow_rollout); tokens, n_prefix, grid_hw as the trace's; reads: the attention
    edges into the class token that carry the most of its output (strongest_reads)."""

    held: np.ndarray
    tokens: tuple[str, ...]
    n_prefix: int
    grid_hw: tuple[int, int]
    reads: pd.DataFrame


def class_token_flow(model: TracedModel, trace: Trace, k: int = 10) -> ClassTokenFlow:
    """The flow of one ViT pass (the residual stream kept) to its class token: the rollout and the k attention edges
    into the class token that carry the most of its output (strongest_reads), with their heads. Only the class
    token's row is split by head: the whole split (L x T^2 x h x d_model numbers) would cost a DeiT-Tiny picture
    more than the rest of the flow, and ViT-B/16's seconds."""
    flow = information_flow(model, trace, position=0, top_heads=[0])
    held = flow_rollout(flow)
    return ClassTokenFlow(held, flow.tokens, trace.n_prefix_tokens, trace.patch_grid, strongest_reads(flow, held, k))


def strongest_reads(flow: Flow, held: np.ndarray, k: int = 10) -> pd.DataFrame:
    """The k attention edges into the rollout's position (where held's last level is 1) that carry the most of its
    output: layer, head (the edge's top head; -1 where the flow has none), from (the source token), share (of the
    update at that layer) and carried (what of the output came through the edge: what the stream after that
    layer's attention holds, times the edge's share). Ranked, not pruned: a class token reads a little from each
    of ~200 patches, so no single edge passes a graph's threshold."""
    into = int(np.argmax(held[-1]))
    edges = [(held[2 * e.layer + 1, into] * e.share, e) for e in edges_into(flow, into)]
    strongest = sorted(edges, key=lambda c_e: -c_e[0])[:k]
    return pd.DataFrame(
        {
            "layer": [e.layer for _, e in strongest],
            "head": [-1 if e.head is None else e.head for _, e in strongest],
            "from": [flow.tokens[e.source] for _, e in strongest],
            "share": [round(e.share, 3) for _, e in strongest],
            "carried": [round(float(c), 4) for c, _ in strongest],
        },
        columns=["layer", "head", "from", "share", "carried"],
    )


def held_over_patches(held: np.ndarray, layer: int, n_prefix: int, grid_hw: tuple[int, int]) -> np.ndarray:
    """[rows, cols]: what each patch holds of the prediction just before layer `layer` (level 2 * layer of the
    rollout; layer = L: the output), row-major as the patches come after the `n_prefix` tokens before them."""
    levels = held.shape[0]
    if not 0 <= 2 * layer < levels:
        raise ValueError(f"layer {layer} is outside 0..{(levels - 1) // 2}")
    rows, cols = grid_hw
    patches = held[2 * layer, n_prefix:]
    if patches.size != rows * cols:
        raise ValueError(f"{patches.size} patches do not fill a {rows} x {cols} grid")
    return patches.reshape(rows, cols)


def held_by_layer(held: np.ndarray, tokens: Sequence[str], n_prefix: int) -> pd.DataFrame:
    """Long form (before, where, share, order): before each layer (0..L, L the output) what the class token (position
    0) holds of the prediction, what the other tokens before the patches hold (a distillation token, registers),
    the patches, and what the biases have taken on the way (1 minus the level's total)."""
    if held.shape[1] != len(tokens) or not 1 <= n_prefix < len(tokens):
        raise ValueError(f"a rollout over {held.shape[1]} positions does not match {len(tokens)} tokens")
    rows = []
    for layer, level in enumerate(held[::2]):
        parts = (level[0], level[1:n_prefix].sum(), level[n_prefix:].sum(), max(0.0, 1.0 - level.sum()))
        rows += [
            {"before": layer, "where": where, "share": float(share), "order": k}
            for k, (where, share) in enumerate(zip(HELD_PLACES, parts, strict=True))
        ]
    return pd.DataFrame(rows, columns=["before", "where", "share", "order"])


def held_chart(frame: pd.DataFrame, width: int = 520, height: int = 240) -> dict:
    """Stacked bars, one per layer: where the class token's final state sits before that layer (held_by_layer)."""
    datasets: dict = {}
    n_layers = int(frame["before"].max())
    x = channel(
        "before",
        "ordinal",
        title=f"before layer ({n_layers}: the output)",
        axis={"labelAngle": 0, "labelOverlap": True},
    )
    bars = {
        "data": named_data(frame, datasets),
        "mark": {"type": "bar"},
        "encoding": {
            "x": x,
            "y": channel("share", "quantitative", title="share of the class token's output", stack="zero"),
            "color": channel(
                "where",
                "nominal",
                title=None,
                sort=list(HELD_PLACES),
                scale={"domain": list(HELD_PLACES), "range": ["#d62728", "#ff9896", "#1f77b4", "#cccccc"]},
                legend={"orient": "bottom", "columns": 2, "labelLimit": 240},
            ),
            "order": channel("order", "quantitative"),
            "tooltip": [
                channel("before", "ordinal", title="before layer"),
                channel("where", "nominal"),
                channel("share", "quantitative", format=".3f"),
            ],
        },
    }
    title = "Where the class token's information sits, layer by layer"
    return fitting(layered([bars], datasets, title, height=height), width)
