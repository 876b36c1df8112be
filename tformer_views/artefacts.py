"""High-norm tokens drawn: every patch's norm over the picture, the artefact patches outlined, each layer's longest
patch over its median as a curve, and the prefix tokens (the class token, the registers) beside the patches.

    norms = token_norms(result.trace)                 # tformer_core.artefacts
    norm_overlay(result.image, norms, layer=11)       # PIL: the layer's norms as heat over the picture, artefacts boxed
    ratio_chart(norms)                                # Vega-Lite: per layer, the longest patch and each prefix token
    prefix_frame(norms, 11)                           # the table: [CLS], registers, the median and longest patch
    verdict(norms)                                    # "no artefact: the largest token norm is 2.44x the median ..."
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from tformer_core.artefacts import TokenNorms

from .charts.spec import channel, fitting, layered, named_data
from .pictures import overlay

__all__ = ["ARTEFACT_INK", "norm_overlay", "prefix_frame", "ratio_chart", "ratio_frame", "verdict"]

ARTEFACT_INK = (0, 220, 255)  # cyan: apart from the inferno map's black-red-yellow


def norm_overlay(image: Image.Image, norms: TokenNorms, layer: int, alpha: float = 0.6) -> Image.Image:
    """The picture as the model saw it with layer `layer`'s patch norms as heat (0 dark, the layer's longest patch
    bright; one flat block per patch, as the model sees it) and every artefact patch outlined."""
    found = norms.artefacts(layer)  # checks the layer
    shown = overlay(image, norms.patch_norms[layer], alpha=alpha, smooth=False)
    rows, cols = norms.grid_hw
    cell_w, cell_h = shown.width / cols, shown.height / rows
    draw = ImageDraw.Draw(shown)
    width = max(2, round(min(cell_w, cell_h) / 8))
    for a in found:
        box = (a.col * cell_w, a.row * cell_h, (a.col + 1) * cell_w - 1, (a.row + 1) * cell_h - 1)
        draw.rectangle(box, outline=ARTEFACT_INK, width=width)
    return shown


def ratio_frame(norms: TokenNorms) -> pd.DataFrame:
    """Long form (layer, token, ratio, norm): per layer the longest patch's and each prefix token's norm, and
    their ratio to the layer's median patch norm."""
    layers = np.arange(norms.n_layers)
    longest = norms.patch_norms.reshape(norms.n_layers, -1).max(axis=1)
    parts = [pd.DataFrame({"layer": layers, "token": "longest patch", "ratio": norms.max_ratio, "norm": longest})]
    for i, token in enumerate(norms.prefix_tokens):
        parts.append(
            pd.DataFrame(
                {"layer": layers, "token": token, "ratio": norms.prefix_ratio[:, i], "norm": norms.prefix_norms[:, i]}
            )
        )
    return pd.concat(parts, ignore_index=True)


def ratio_chart(norms: TokenNorms, width: int = 520, height: int = 260) -> dict:
    """Per layer (x), each token's norm over the layer's median patch norm (y, log scale): the longest patch, the
    class token, the registers; a dashed line at the artefact threshold and a grey one at 1 (the median)."""
    frame = ratio_frame(norms)
    datasets: dict[str, Any] = {}
    x = channel("layer", "quantitative", title="layer", axis={"tickMinStep": 1, "format": "d"})
    y = channel("ratio", "quantitative", title="norm / median patch norm", scale={"type": "log"})
    curves = {
        "data": named_data(frame, datasets),
        "mark": {"type": "line", "point": True},
        "encoding": {
            "x": x,
            "y": y,
            "color": channel("token", "nominal", title="token", sort=list(dict.fromkeys(frame["token"]))),
            "tooltip": [
                channel("layer", "quantitative"),
                channel("token", "nominal"),
                channel("ratio", "quantitative", format=".2f", title="x median"),
                channel("norm", "quantitative", format=".1f"),
            ],
        },
    }
    lines = pd.DataFrame({"ratio": [norms.threshold, 1.0], "what": [f"artefact: > {norms.threshold:g}x", "median"]})
    rules = {
        "data": named_data(lines, datasets),
        "mark": {"type": "rule", "strokeDash": [6, 4]},
        "encoding": {"y": y, "color": {"value": "#555"}, "tooltip": [channel("what", "nominal", title="line")]},
    }
    title = "Each layer's longest patch and prefix tokens, over the median patch"
    return fitting(layered([curves, rules], datasets, title, height=height), width)


def prefix_frame(norms: TokenNorms, layer: int) -> pd.DataFrame:
    """One layer's prefix tokens beside its patches: a row per prefix token ([CLS], registers), then the median and
    the longest patch; columns token, norm, x median (norm over the median patch norm)."""
    layer = norms.layer_index(layer)
    longest = norms.patch_norms[layer].max()
    tokens = [*norms.prefix_tokens, "median patch", "longest patch"]
    values = np.array([*norms.prefix_norms[layer], norms.median[layer], longest], dtype=np.float64)
    return pd.DataFrame({"token": tokens, "norm": values.round(2), "x median": (values / norms.median[layer]).round(2)})


def verdict(norms: TokenNorms, layer: int | None = None) -> str:
    """One sentence: no artefact, with the largest ratio to the median and where it is, or the artefact patches
    (of `layer`, or of every layer) with their ratios, the largest first."""
    found = norms.artefacts(layer)
    scope = " in any layer" if layer is None else f" in layer {layer}"  # a page shows it beside one layer's picture
    if not found:
        a = norms.largest(layer)
        return (
            f"No artefact{scope}: the largest token norm is {a.ratio:.2f}x the median patch norm "
            f"(layer {a.layer}, patch r{a.row}c{a.col}; an artefact would be above {norms.threshold:g}x)."
        )
    if layer is None:
        layers = sorted({a.layer for a in found})
        scope = f" in layer {layers[0]}" if len(layers) == 1 else f" in layers {layers[0]} to {layers[-1]}"
    at = (lambda a: "") if layer is not None else (lambda a: f" of layer {a.layer}")  # which layer, when several
    shown = ", ".join(f"r{a.row}c{a.col}{at(a)} ({a.ratio:.1f}x)" for a in found[:6]) + (
        ", ..." if len(found) > 6 else ""
    )
    return (
        f"{len(found)} artefact patch{'es' if len(found) > 1 else ''}{scope} (norm above "
        f"{norms.threshold:g}x the median patch norm): {shown}."
    )
