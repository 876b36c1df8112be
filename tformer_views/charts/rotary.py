"""Charts of rotary position embeddings (RoPE) on the page "Positional encoding": each pair's frequency and
wavelength on log scales, one pair of a q or k vector turning with the position, and q · k after the rotation
over the offset m - n for several starts (Vega-Lite dicts, no Streamlit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..lessons.positional import RotarySetting, RotationStep
from .spec import channel, fitting, layered, named_data

__all__ = [
    "AFTER_COLOUR",
    "BEFORE_COLOUR",
    "LABELLED_POSITIONS",
    "PATH_COLOUR",
    "frequency_chart",
    "offset_chart",
    "rotation_chart",
    "wavelength_chart",
]

BEFORE_COLOUR, AFTER_COLOUR, PATH_COLOUR = "#7f7f7f", "#d62728", "#1f77b4"
LABELLED_POSITIONS = 16  # the dots of the first positions carry their number when there are at most this many


def _pairs_axis(setting: RotarySetting) -> dict:
    return channel(
        "pair i", "quantitative", title="pair i", axis={"tickMinStep": 1}, scale={"domain": [0, setting.n_pairs - 1]}
    )


def _series(curves: pd.DataFrame) -> dict:
    """One colour per curve; a legend only when there is more than one (the model's θ_i beside the formula)."""
    legend = {"orient": "bottom"} if curves["what"].nunique() > 1 else None
    return channel("what", "nominal", title=None, legend=legend)


def frequency_chart(curves: pd.DataFrame, setting: RotarySetting, width: int = 320, height: int = 240) -> dict:
    """theta_i over pair i, log scale (`lessons.positional.frequency_curves`): fast pairs first, each next one
    slower by the same factor base^(2/d)."""
    datasets: dict[str, Any] = {}
    layer = {
        "data": named_data(curves, datasets),
        "mark": {"type": "line", "point": True},
        "encoding": {
            "x": _pairs_axis(setting),
            "y": channel("θ_i", "quantitative", title="θ_i (radians per token, log scale)", scale={"type": "log"}),
            "color": _series(curves),
            "tooltip": [
                channel("pair i", "quantitative"),
                channel("θ_i", "quantitative", format=".6~g"),
                channel("wavelength", "quantitative", title="wavelength (tokens)", format=",.1f"),
                channel("what", "nominal"),
            ],
        },
    }
    title = f"θ_i = {setting.base:g}^(-2i/{setting.head_dim})"
    return fitting(layered([layer], datasets, title, height=height), width)


def wavelength_chart(curves: pd.DataFrame, setting: RotarySetting, width: int = 320, height: int = 240) -> dict:
    """2 pi / theta_i over pair i, log scale, with the model's context length as a dashed line when known."""
    datasets: dict[str, Any] = {}
    x = _pairs_axis(setting)
    y = channel("wavelength", "quantitative", title="wavelength 2π/θ_i (tokens, log scale)", scale={"type": "log"})
    layers: list[dict] = [
        {
            "data": named_data(curves, datasets),
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": x,
                "y": y,
                "color": _series(curves),
                "tooltip": [
                    channel("pair i", "quantitative"),
                    channel("wavelength", "quantitative", title="wavelength (tokens)", format=",.1f"),
                    channel("what", "nominal"),
                ],
            },
        }
    ]
    if setting.max_positions:
        context = pd.DataFrame(
            {"wavelength": [float(setting.max_positions)], "label": [f"context {setting.max_positions:,}"]}
        )
        data = named_data(context, datasets)
        layers.append(
            {"data": data, "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"}, "encoding": {"y": y}}
        )
        layers.append(
            {
                "data": data,
                "mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "x": 0},
                "encoding": {"y": y, "text": channel("label", "nominal")},
            }
        )
    return fitting(layered(layers, datasets, "Wavelength: tokens per full turn", height=height), width)


def rotation_chart(step: RotationStep, size: int = 300) -> dict:
    """One pair in its plane: the circle it moves on, its place at positions 0, 1, 2, ... (blue dots), the pair
    at position 0 (grey arrow) and turned to the chosen position (red arrow)."""
    radius = float(np.hypot(*step.before)) or 1.0
    lim = round(radius * 1.25, 6)
    datasets: dict[str, Any] = {}
    scale = {"domain": [-lim, lim], "nice": False}
    x = channel("x", "quantitative", title=f"dimension {step.dims[0]}", scale=scale)
    y = channel("y", "quantitative", title=f"dimension {step.dims[1]}", scale=scale)
    layers = _path_layers(step, radius, x, y, datasets) + _arrow_layers(step, x, y, datasets)
    title = f"Pair {step.pair} turned by {step.position} × θ_{step.pair} = {step.angle:.4g} rad ({step.degrees:.1f}°)"
    return layered(layers, datasets, title, width=size, height=size)


def _path_layers(step: RotationStep, radius: float, x: dict, y: dict, datasets: dict[str, Any]) -> list[dict]:
    """The circle, the pair's place at every position (dots), the positions before the chosen one numbered."""
    t = np.linspace(0, 2 * np.pi, 121)
    circle = pd.DataFrame({"x": radius * np.cos(t), "y": radius * np.sin(t), "order": np.arange(len(t))})
    numbered = step.path[(step.path["position"] > 0) & (step.path["position"] < step.position)]
    numbered = numbered.assign(label=numbered["position"].astype(str))
    xy_tooltip = [channel("x", "quantitative", format=".4f"), channel("y", "quantitative", format=".4f")]
    layers = [
        {
            "data": named_data(circle, datasets),
            "mark": {"type": "line", "color": "#cccccc", "strokeWidth": 1},
            "encoding": {"x": x, "y": y, "order": channel("order", "quantitative")},
        },
        {
            "data": named_data(step.path, datasets),
            "mark": {"type": "point", "filled": True, "color": PATH_COLOUR, "size": 28, "opacity": 0.6},
            "encoding": {"x": x, "y": y, "tooltip": [channel("position", "quantitative"), *xy_tooltip]},
        },
    ]
    if 0 < len(numbered) <= LABELLED_POSITIONS:
        layers.append(
            {
                "data": named_data(numbered, datasets),
                "mark": {"type": "text", "color": PATH_COLOUR, "fontSize": 10, "dx": 9, "dy": -7},
                "encoding": {"x": x, "y": y, "text": channel("label", "nominal")},
            }
        )
    return layers


def _arrow_layers(step: RotationStep, x: dict, y: dict, datasets: dict[str, Any]) -> list[dict]:
    """The pair at position 0 (grey) and at the chosen position (red), as arrows from the origin."""
    arrows = pd.DataFrame(
        {
            "x": [0.0, 0.0],
            "y": [0.0, 0.0],
            "x2": [step.before[0], step.after[0]],
            "y2": [step.before[1], step.after[1]],
            "label": ["position 0", f"position {step.position}"],
            "colour": [BEFORE_COLOUR, AFTER_COLOUR],
        }
    )
    ends = arrows[["x2", "y2", "label", "colour"]].rename(columns={"x2": "x", "y2": "y"})
    colour = channel("colour", "nominal", scale=None, legend=None)
    tooltip = [
        channel("label", "nominal"),
        channel("x", "quantitative", format=".4f"),
        channel("y", "quantitative", format=".4f"),
    ]
    return [
        {
            "data": named_data(arrows, datasets),
            "mark": {"type": "rule", "strokeWidth": 3},
            "encoding": {"x": x, "y": y, "x2": {"field": "x2"}, "y2": {"field": "y2"}, "color": colour},
        },
        {
            "data": named_data(ends, datasets),
            "mark": {"type": "point", "filled": True, "size": 90, "shape": "circle"},
            "encoding": {"x": x, "y": y, "color": colour, "tooltip": tooltip},
        },
        {
            "data": named_data(ends, datasets),
            "mark": {"type": "text", "align": "left", "dx": 8, "dy": -8, "fontWeight": "bold"},
            "encoding": {"x": x, "y": y, "text": channel("label", "nominal"), "color": colour},
        },
    ]


def offset_chart(scores: pd.DataFrame, width: int = 560, height: int = 280) -> dict:
    """q · k after RoPE over the offset m - n, one line per start n (`lessons.positional.rope_offset_scores`),
    drawn with different dashes and widths so that curves lying exactly on top of each other stay visible."""
    datasets: dict[str, Any] = {}
    starts = list(dict.fromkeys(scores["start"]))
    dashes = [[1, 0], [8, 5], [2, 4], [12, 3, 2, 3]]
    widths = [6, 3, 2, 1.5]
    layer = {
        "data": named_data(scores, datasets),
        "mark": {"type": "line"},
        "encoding": {
            "x": channel("offset m - n", "quantitative", title="offset m - n (query position - key position)"),
            "y": channel("q·k", "quantitative", title="q·k after RoPE"),
            "color": channel("start", "nominal", title="key at", sort=starts),
            "strokeDash": channel(
                "start",
                "nominal",
                title="key at",
                sort=starts,
                scale={"domain": starts, "range": dashes[: len(starts)]},
            ),
            "strokeWidth": channel(
                "start",
                "nominal",
                title="key at",
                sort=starts,
                scale={"domain": starts, "range": widths[: len(starts)]},
            ),
            "tooltip": [
                channel("offset m - n", "quantitative"),
                channel("q·k", "quantitative", format=".6f"),
                channel("start", "nominal"),
            ],
        },
    }
    return fitting(
        layered([layer], datasets, "q·k after RoPE by offset: one curve, wherever n starts", height=height), width
    )
