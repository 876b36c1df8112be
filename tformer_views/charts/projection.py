"""Query–key space as a Plotly figure: one head's queries (circles) and keys (diamonds) in the same principal
axes, with lines from the chosen query to the keys it weighs most (AttentionViz-style).

    space = qk_space(trace, layer=2, head=5, query=7, dims=3)     # the numbers (tformer_core.qk_projection)
    figure = qk_figure(space, title="layer 2, head 5")              # plotly.graph_objects.Figure

Plotly draws hover and marker text as a small subset of HTML (<b>, <br>, <a>, entities): token labels are
escaped (`&`, `<`, `>`), so a token "<s>" or "<b>" shows as itself; a 3-D scene's marker text is WebGL, which
decodes no entity but still reads a few tags, so there a zero-width space breaks them (`gl_text`). No Streamlit.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from tformer_core.projection import QKProjection, qk_projection
from tformer_core.trace import Trace

from ..tokens import display_tokens

__all__ = [
    "KEY_COLOUR",
    "LINE_COLOUR",
    "MAX_MARKER_TEXT",
    "QUERY_COLOUR",
    "TOP_KEYS",
    "QKSpace",
    "gl_text",
    "plotly_text",
    "qk_figure",
    "qk_space",
    "trace_named",
]

QUERY_COLOUR = "#1b9e77"  # AttentionViz's green queries
KEY_COLOUR = "#d6336c"  # and pink keys
LINE_COLOUR = "#555555"
TOP_KEYS = 3  # lines from the chosen query to its strongest keys
MAX_MARKER_TEXT = 80  # points: beyond this many, token labels are on hover only (they would overlap)


def plotly_text(label: str) -> str:
    """A token label as Plotly shows it literally in SVG text (2-D markers, titles, legends, every hover box):
    its pseudo-HTML tags and entities escaped."""
    return html.escape(str(label), quote=False)


def gl_text(label: str) -> str:
    """A token label as a 3-D scene's marker text shows it literally. That text is drawn by WebGL, which decodes
    no entity ("&lt;" would show as itself) but reads <b>, <i>, <sub>, <sup> and <br> as styles: a zero-width
    space after every "<" keeps any of them from being a tag and shows nothing of its own."""
    return str(label).replace("<", "<\u200b")


@dataclass(frozen=True)
class QKSpace:
    """What the query–key space shows for one head.

    projection: the coordinates (tformer_core.QKProjection), rows in the order of query_positions and
    key_positions (positions in the trace). query_labels, key_labels: display tokens (not escaped) of those
    rows. query: the chosen query's position, or None when it is not shown; top_keys, top_weights: the
    positions of the keys it weighs most among those shown, strongest first, and their weights; weights:
    [len(key_positions)] its weights to every shown key. kv_head: the key/value head the keys come from.
    """

    projection: QKProjection
    query_positions: np.ndarray
    key_positions: np.ndarray
    query_labels: tuple[str, ...]
    key_labels: tuple[str, ...]
    query: int | None
    weights: np.ndarray
    top_keys: np.ndarray
    top_weights: np.ndarray
    kv_head: int
    cross: bool

    @property
    def dims(self) -> int:
        return self.projection.n_components


def qk_space(
    trace: Trace,
    layer: int,
    head: int,
    query: int | None,
    stack: str | None = None,
    dims: int = 2,
    query_positions: np.ndarray | None = None,
    key_positions: np.ndarray | None = None,
    top: int = TOP_KEYS,
    align_means: bool = True,
) -> QKSpace:
    """The joint PCA of (layer, head)'s queries and keys in `dims` (2 or 3) axes, fitted on the shown positions
    (default: all), and the `top` keys the query at position `query` weighs most (by the trace's weights)."""
    if dims not in (2, 3):
        raise ValueError(f"dims must be 2 or 3, got {dims}")
    stack = stack or trace.main_stack
    q_tokens, k_tokens = (display_tokens(t) for t in trace.tokens_for(stack))
    qs = np.arange(len(q_tokens)) if query_positions is None else np.asarray(query_positions, dtype=np.int64)
    ks = np.arange(len(k_tokens)) if key_positions is None else np.asarray(key_positions, dtype=np.int64)
    qs, ks = qs[(qs >= 0) & (qs < len(q_tokens))], ks[(ks >= 0) & (ks < len(k_tokens))]
    projection = qk_projection(trace, layer, head, stack, dims, align_means=align_means, queries=qs, keys=ks)
    chosen = None if query is None or int(query) not in set(qs.tolist()) else int(query)
    weights = np.zeros(len(ks))
    top_keys, top_weights = np.zeros(0, dtype=np.int64), np.zeros(0)
    if chosen is not None:
        weights = np.asarray(trace.attention(layer, head, stack)[chosen], dtype=np.float64)[ks]
        order = np.argsort(-weights, kind="stable")[:top]
        order = order[weights[order] > 0]  # a masked key is no strongest key
        top_keys, top_weights = ks[order], weights[order]
    return QKSpace(
        projection,
        qs,
        ks,
        tuple(q_tokens[i] for i in qs),
        tuple(k_tokens[i] for i in ks),
        chosen,
        weights,
        top_keys,
        top_weights,
        trace.kv_head(head),
        stack == "cross",
    )


def _axis_title(i: int, share: float) -> str:
    return f"PC{i + 1} ({share:.0%} of variance)"


def qk_figure(space: QKSpace, title: str = "", height: int = 560, font_scale: float = 1.0) -> go.Figure:
    """Queries (circles) and keys (diamonds) in one figure, 2-D (Scatter) or 3-D (Scatter3d), and lines from the
    chosen query to its strongest keys: width and opacity grow with the weight. Trace names: "queries", "keys",
    "chosen query", then one "weight → key <position>" per line."""
    row = None if space.query is None else int(np.flatnonzero(space.query_positions == space.query)[0])
    size = (7 if space.dims == 3 else 10) * font_scale
    # Lines first, so the markers are drawn over them.
    data = _lines(space, row, font_scale) + _points(space, row, size, font_scale)
    figure = go.Figure(data=data)
    figure.update_layout(**_layout(space, title, height, font_scale))
    return figure


def _xyz(points: np.ndarray, dims: int) -> dict:
    return {name: points[:, i] for i, name in enumerate(("x", "y", "z")[:dims])}


def _lines(space: QKSpace, row: int | None, font_scale: float) -> list:
    """One line from the chosen query to each of its strongest keys."""
    if row is None:
        return []
    p, scatter = space.projection, go.Scatter3d if space.dims == 3 else go.Scatter
    start = p.queries[row]
    strongest = max(float(space.top_weights.max()), 1e-12) if len(space.top_weights) else 1.0
    lines = []
    for key, weight in zip(space.top_keys, space.top_weights):
        end = p.keys[int(np.flatnonzero(space.key_positions == key)[0])]
        relative = float(weight) / strongest
        lines.append(
            scatter(
                **_xyz(np.stack([start, end]), space.dims),
                mode="lines",
                line={"color": LINE_COLOUR, "width": (1.5 + 6 * relative) * font_scale},
                opacity=0.25 + 0.7 * relative,
                name=f"weight → key {int(key)}",
                hoverinfo="skip",
                showlegend=False,
            )
        )
    return lines


def _hover_texts(space: QKSpace, row: int | None) -> tuple[list[str], list[str]]:
    """What hovering a query and a key says: its position and token, and a key's weight from the chosen query."""
    q_side, k_side = ("target", "source") if space.cross else ("query", "key")
    weights_of = dict(zip(space.key_positions.tolist(), space.weights.tolist()))
    query_label = "" if row is None else plotly_text(space.query_labels[row])
    q_hover = [
        f"{q_side} {int(i)}: <b>{plotly_text(label)}</b>" for i, label in zip(space.query_positions, space.query_labels)
    ]
    k_hover = []
    for i, label in zip(space.key_positions, space.key_labels):
        text = f"{k_side} {int(i)}: <b>{plotly_text(label)}</b>"
        if row is not None:
            text += f"<br>weight from {query_label}: {weights_of[int(i)]:.3f}"
        k_hover.append(text)
    return q_hover, k_hover


def _points(space: QKSpace, row: int | None, size: float, font_scale: float) -> list:
    """The queries, the keys and the chosen query (larger, outlined)."""
    p, three = space.projection, space.dims == 3
    scatter = go.Scatter3d if three else go.Scatter
    mode = "markers+text" if len(space.query_positions) + len(space.key_positions) <= MAX_MARKER_TEXT else "markers"
    q_hover, k_hover = _hover_texts(space, row)
    data = []
    for name, points, labels, hover, colour, symbol, position in (
        ("queries", p.queries, space.query_labels, q_hover, QUERY_COLOUR, "circle", "top center"),
        ("keys", p.keys, space.key_labels, k_hover, KEY_COLOUR, "diamond", "bottom center"),
    ):
        data.append(
            scatter(
                **_xyz(points, space.dims),
                mode=mode,
                name=f"{name} ({len(points)})",
                marker={"color": colour, "symbol": symbol, "size": size, "opacity": 0.85},
                text=[gl_text(label) if three else plotly_text(label) for label in labels],
                textposition=position,
                textfont={"color": colour, "size": 11 * font_scale},
                hovertext=hover,
                hoverinfo="text",
                meta=name,
            )
        )
    if row is not None:
        q_side = "target" if space.cross else "query"
        data.append(
            scatter(
                **_xyz(p.queries[row : row + 1], space.dims),
                mode="markers",
                name=f"chosen {q_side}: {plotly_text(space.query_labels[row])}",
                marker={
                    "color": QUERY_COLOUR,
                    "symbol": "circle",
                    "size": size * 1.8,
                    "line": {"color": "black", "width": 2},
                },
                hovertext=[q_hover[row]],
                hoverinfo="text",
                meta="chosen query",
            )
        )
    return data


def _layout(space: QKSpace, title: str, height: int, font_scale: float) -> dict:
    p = space.projection
    axes = {
        f"{name}axis": {"title": {"text": _axis_title(i, p.explained[i])}} for i, name in enumerate("xyz"[: space.dims])
    }
    layout = {
        "title": {"text": plotly_text(title)},
        "height": height,
        "margin": {"l": 10, "r": 10, "t": 60, "b": 10},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.0},
        "font": {"size": 13 * font_scale},
    }
    if space.dims == 3:
        layout["scene"] = {**axes, "aspectmode": "data"}
    else:  # equal units on both axes: distances on the screen are distances in the projection
        layout["xaxis"] = {**axes["xaxis"], "zeroline": False}
        layout["yaxis"] = {**axes["yaxis"], "zeroline": False, "scaleanchor": "x", "scaleratio": 1}
    return layout


def trace_named(figure: go.Figure, meta: str) -> go.BaseTraceType | None:
    """The figure's trace whose `meta` is `meta` ("queries", "keys", "chosen query"), or None."""
    return next((t for t in figure.data if t.meta == meta), None)
