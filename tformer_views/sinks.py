"""Attention sinks and massive activations as a page shows them: a layers x heads grid of the share of attention
on the first token, that share per layer, each layer's largest activation against its median with the massive
ones marked, and a knockout's prediction before and after.

    view = sinks_of(trace)                          # the shares (first token, [SEP]...) and the activations
    share_grid(view.shares[0], cell=14)             # Vega-Lite dicts, as tformer_views.charts builds them
    per_layer_chart(view.shares), activation_chart(view)
    summary(view)                                   # one sentence: "In 27 of 30 layers more than half ..."
    knockout_table(sinks.block_sink(model, text, 3))

The numbers are the core's (tformer_core.sinks); here they become charts, tables and sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tformer_core import sinks
from tformer_core.errors import InputError
from tformer_core.trace import Trace

from .charts.spec import channel, fitting, heatmap, layered, named_data
from .tokens import display_token

__all__ = [
    "MASSIVE_COLOUR",
    "SinksView",
    "activation_chart",
    "activation_table",
    "knockout_table",
    "per_layer_chart",
    "share_grid",
    "share_table",
    "sinks_of",
    "summary",
]

MASSIVE_COLOUR = "#d62728"  # the massive ones: red, as the app marks what stands out
PLAIN_COLOUR = "#8c8c8c"


@dataclass(frozen=True, eq=False)
class SinksView:
    """What the sinks panel shows of one trace: `shares` (the first token's first, then each special token's: see
    `sinks.sink_shares`); `activations` (None when the trace has no residual stream: a model transformers runs,
    whose traces hold what it returns); `tokens`: the key tokens of `stack`; `missing`: why `activations` is
    None."""

    stack: str
    shares: tuple[sinks.SinkShare, ...]
    activations: sinks.MassiveActivations | None
    tokens: tuple[str, ...]
    missing: str = ""


def sinks_of(trace: Trace, stack: str | None = None) -> SinksView:
    """The shares and the massive activations of `trace`'s `stack` (default: its main one). InputError for a trace
    of one token (no query chooses where to look)."""
    stack = stack or trace.main_stack
    shares = tuple(sinks.sink_shares(trace, stack))
    try:
        activations, missing = sinks.massive_activations(trace, stack), ""
    except InputError as why:
        activations, missing = None, str(why)
    return SinksView(stack, shares, activations, trace.tokens_for(stack)[1], missing)


def _layer_labels(n: int) -> list[str]:
    return [f"L{layer}" for layer in range(n)]


def share_grid(
    share: sinks.SinkShare, cell: int = 14, cell_width: int | None = None, title: str | list[str] | None = None
) -> dict:
    """The layers x heads grid of `share` (0..1, one colour scale for every model), each cell `cell` px high and
    `cell_width` px wide (default: as wide as high, at least; a few heads get wider cells, up to 48 px)."""
    layers, heads = share.share.shape
    where = ", ".join(display_token(t) for t in share.tokens)
    label = "the first token" if share.name == "first token" else share.name
    return heatmap(
        share.share,
        _layer_labels(layers),
        [f"H{h}" for h in range(heads)],
        title or [f"Share of attention on {label} ({where})", "each head's queries, averaged"],
        row_title="layer",
        col_title="head",
        domain=(0.0, 1.0),
        annotate=cell >= 30,
        cell_size=cell,
        cell_width=cell_width or max(cell, min(48, 360 // max(heads, 1))),
    )


def share_table(view: SinksView) -> pd.DataFrame:
    """Per layer (the index, "layer"): each set of sink positions' share, averaged over the heads, 0..1."""
    frame = pd.DataFrame({_series_name(s): s.per_layer for s in view.shares})
    frame.index.name = "layer"
    return frame


def _series_name(share: sinks.SinkShare) -> str:
    where = ", ".join(display_token(t) for t in share.tokens)
    return f"first token ({where})" if share.name == "first token" else share.name


def per_layer_chart(shares: tuple[sinks.SinkShare, ...] | list[sinks.SinkShare], width: int = 560) -> dict:
    """Bars per layer: the share of attention on each set of sink positions (averaged over the heads), side by
    side, with a dashed rule at `sinks.SINK_THRESHOLD` (above it: more than half of the layer's attention)."""
    rows = [
        {"layer": layer, "share": float(v), "on": _series_name(s)}
        for s in shares
        for layer, v in enumerate(s.per_layer)
    ]
    frame = pd.DataFrame(rows)
    datasets: dict[str, Any] = {}
    bars = {
        "data": named_data(frame, datasets),
        "mark": {"type": "bar"},
        "encoding": {
            "x": channel("layer", "ordinal", title="layer", axis={"labelAngle": 0}),
            "xOffset": channel("on", "nominal"),
            "y": channel("share", "quantitative", title="share of attention", scale={"domain": [0, 1]}),
            "color": channel("on", "nominal", title="on", legend={"orient": "bottom"}),
            "tooltip": [
                channel("layer", "ordinal"),
                channel("on", "nominal"),
                channel("share", "quantitative", format=".3f"),
            ],
        },
    }
    rule = {
        "data": {"values": [{"y": sinks.SINK_THRESHOLD}]},
        "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"},
        "encoding": {"y": {"field": "y", "type": "quantitative"}},
    }
    title = ["Share of attention per layer", f"dashed: {sinks.SINK_THRESHOLD:.0%}, half of it"]
    return fitting(layered([bars, rule], datasets, title, height=220), width)


def activation_table(view: SinksView) -> pd.DataFrame:
    """Each layer's largest activations (`k` per layer, largest first), indexed by "layer": the token and its
    position, the dimension, the value, |value| over the layer's median |x|, and whether it is massive."""
    if view.activations is None:
        raise InputError(view.missing or "this trace has no residual stream")
    rows = [
        {
            "layer": a.layer,
            "token": display_token(view.tokens[a.position]),
            "position": a.position,
            "dimension": a.dim,
            "value": a.value,
            "× median": a.ratio,
            "massive": a.massive,
        }
        for layer in view.activations.top
        for a in layer
    ]
    return pd.DataFrame(rows).set_index("layer")


def activation_chart(view: SinksView, width: int = 560) -> dict:
    """Bars per layer: the largest |x| of the residual stream over the layer's median |x| (a log scale), the massive
    ones red (`sinks.MASSIVE_ABS`, `sinks.MASSIVE_RATIO`); the tooltip names the token and the dimension."""
    big = view.activations
    if big is None:
        raise InputError(view.missing or "this trace has no residual stream")
    top = [layer[0] for layer in big.top]
    frame = pd.DataFrame(
        {
            "layer": [a.layer for a in top],
            "ratio": [a.ratio if np.isfinite(a.ratio) else None for a in top],
            "value": [a.value for a in top],
            "token": [display_token(view.tokens[a.position]) for a in top],
            "position": [a.position for a in top],
            "dimension": [a.dim for a in top],
            "massive": ["massive" if a.massive else "not massive" for a in top],
        }
    )
    datasets: dict[str, Any] = {}
    colours = {"domain": ["massive", "not massive"], "range": [MASSIVE_COLOUR, PLAIN_COLOUR]}
    bars = {
        "data": named_data(frame, datasets),
        "mark": {"type": "bar"},
        "encoding": {
            "x": channel(
                "layer", "ordinal", title=f"layer ({big.part}: the stream entering it)", axis={"labelAngle": 0}
            ),
            "y": channel("ratio", "quantitative", title="largest |x| ÷ median |x|", scale={"type": "log"}),
            "y2": {"datum": 1},  # on a log scale a bar cannot start at 0: it starts at 1x, the median itself
            "color": channel("massive", "nominal", title=None, scale=colours, legend={"orient": "bottom"}),
            "tooltip": [
                channel("layer", "ordinal"),
                channel("token", "nominal"),
                channel("position", "quantitative"),
                channel("dimension", "quantitative"),
                channel("value", "quantitative", format=",.1f"),
                channel("ratio", "quantitative", format=",.0f", title="× median"),
            ],
        },
    }
    rule = {
        "data": {"values": [{"y": sinks.MASSIVE_RATIO}]},
        "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"},
        "encoding": {"y": {"field": "y", "type": "quantitative"}},
    }
    title = ["Largest activation per layer, against the layer's median", "dashed: 1000×; red: massive (and |x| ≥ 100)"]
    return fitting(layered([bars, rule], datasets, title, height=220), width)


def summary(view: SinksView, threshold: float = sinks.SINK_THRESHOLD) -> str:
    """What the panel found, in plain words (not Markdown: the page escapes it): how many layers send more than
    `threshold` of their attention to the first token, and the largest massive activation, if any."""
    first = view.shares[0]
    layers = len(first.per_layer)
    token = display_token(first.tokens[0])
    found = len(first.sink_layers(threshold))
    lines = [
        f"In {found} of {layers} layers more than {threshold:.0%} of the attention goes to the first token ({token}); "
        f"over every layer and head, {first.share.mean():.0%}."
    ]
    big = view.activations
    if big is not None:
        massive = big.massive_activations
        if massive:
            a = max(massive, key=lambda m: m.ratio)
            where = sorted({m.layer for m in massive})
            span = f"layers {where[0]}–{where[-1]}" if len(where) > 1 else f"layer {where[0]}"
            token, moving = display_token(view.tokens[a.position]), "entering" if big.part == "resid_pre" else "leaving"
            lines.append(
                f"A massive activation: {a.value:,.0f} in dimension {a.dim} at {token} (position {a.position}) "
                f"{moving} layer {a.layer}, {a.ratio:,.0f}× the layer's median (massive in {span})."
            )
        else:
            i = int(np.argmax(big.ratio))
            lines.append(f"No massive activation: the largest is {big.ratio[i]:,.0f}× its layer's median (layer {i}).")
    return " ".join(lines)


def knockout_table(knock: sinks.Knockout) -> pd.DataFrame:
    """The top predictions before and after a knockout, side by side, indexed by "rank" (1 = most probable);
    empty when the model has no head (its hidden state's change is then the knockout's measure)."""
    n = max(len(knock.before.top), len(knock.after.top))
    rows = []
    for rank in range(n):
        # A shorter list (a head with fewer outputs than asked) leaves its cells empty, not an empty token's "∅".
        before = knock.before.top[rank] if rank < len(knock.before.top) else None
        after = knock.after.top[rank] if rank < len(knock.after.top) else None
        rows.append(
            {
                "rank": rank + 1,
                "before": "" if before is None else display_token(before[0]),
                "p before": np.nan if before is None else before[1],
                "after": "" if after is None else display_token(after[0]),
                "p after": np.nan if after is None else after[1],
            }
        )
    return pd.DataFrame(rows, columns=["rank", "before", "p before", "after", "p after"]).set_index("rank")
