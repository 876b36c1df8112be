"""What the Train page shows of a training: curves, the attention on the fixed input after each epoch.

curves(epochs)                       # long frame: epoch, value, series (training loss, validation accuracy)
curves_chart(epochs)                 # the two over the epochs, each on an axis of its own (loss left, accuracy right)
snapshot(epoch, layer, head, image)  # the fixed input's attention: [n, n] for text, the class token's
                                     # row on the patch grid [rows, cols] for a picture
snapshot_chart(..., cell=24)         # drawn with cells of that many pixels (sized to its column by the page)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from PIL import Image

from tformer_train import classroom, corpora

from .charts.spec import cell_px, channel, fitting, heatmap, layered, named_data

__all__ = [
    "ACCURACY_COLOUR",
    "LOSS_COLOUR",
    "curves",
    "curves_chart",
    "fixed_digit",
    "grid_side",
    "snapshot",
    "snapshot_chart",
    "summary",
]


def curves(epochs: Sequence[classroom.Epoch]) -> pd.DataFrame:
    """One row per (epoch, series): the mean training loss and the validation accuracy, epochs from 1."""
    rows = []
    for e in epochs:
        rows.append({"epoch": e.epoch + 1, "value": e.train_loss, "series": "training loss"})
        rows.append({"epoch": e.epoch + 1, "value": e.valid_accuracy, "series": "validation accuracy"})
    return pd.DataFrame(rows, columns=["epoch", "value", "series"])


LOSS_COLOUR, ACCURACY_COLOUR = "#d62728", "#1f77b4"


def curves_chart(epochs: Sequence[classroom.Epoch], width: int = 520, height: int = 240) -> dict:
    """The mean training loss (left axis, from 0) and the validation accuracy (right axis, 0 to 100 %) after each
    epoch: two scales, each axis titled in its curve's colour. At most `width` px wide (narrower in a narrower
    column)."""
    frame = pd.DataFrame(
        {
            "epoch": [e.epoch + 1 for e in epochs],
            "training loss": [e.train_loss for e in epochs],
            "validation accuracy": [e.valid_accuracy for e in epochs],
        }
    )
    datasets: dict[str, Any] = {}
    data = named_data(frame, datasets)
    few = len(frame) <= 20  # each epoch labelled; more: whole numbers only
    x_axis = {"values": frame["epoch"].tolist(), "labelOverlap": False} if few else {"tickMinStep": 1}
    x = channel("epoch", "quantitative", title="epoch", axis={**x_axis, "format": "d"})

    def curve(field: str, colour: str, scale: dict, axis: dict) -> dict:
        y = channel(field, "quantitative", title=field, scale=scale, axis={"titleColor": colour, **axis})
        tooltip = [channel("epoch", "quantitative"), channel(field, "quantitative", format=".3f")]
        return {
            "data": data,
            "mark": {"type": "line", "color": colour, "point": {"color": colour} if len(frame) <= 60 else False},
            "encoding": {"x": x, "y": y, "tooltip": tooltip},
        }

    layers = [
        curve("training loss", LOSS_COLOUR, {"zero": True}, {"orient": "left"}),
        curve(
            "validation accuracy",
            ACCURACY_COLOUR,
            {"domain": [0, 1]},
            {"orient": "right", "format": ".0%", "grid": False},
        ),
    ]
    spec = layered(layers, datasets, "after each epoch", height=height, resolve={"scale": {"y": "independent"}})
    return fitting(spec, width)


def grid_side(n_tokens: int) -> int:
    """Patches per side of a square grid with one class token before the patches."""
    side = round((n_tokens - 1) ** 0.5)
    if side * side != n_tokens - 1:
        raise ValueError(f"{n_tokens} tokens are not a class token and a square grid of patches")
    return side


def snapshot(epoch: classroom.Epoch, layer: int, head: int, image: bool) -> np.ndarray:
    """The fixed input's attention in (layer, head) after `epoch`: text [n, n]; a picture: the class
    token's weights on its patches as the patch grid [rows, cols] (the class token's own weight left out)."""
    weights = epoch.attention[layer, head]  # [n, n]
    if not image:
        return weights
    side = grid_side(weights.shape[0])
    return weights[0, 1:].reshape(side, side)


def snapshot_chart(epoch: classroom.Epoch, layer: int, head: int, image: bool, cell: int | None = None) -> dict:
    """The fixed input's attention in (layer, head) after `epoch` (`snapshot`) as a heatmap, `cell` px a cell
    (default: 44 for a picture's patches, about 360 px in all for a sentence's tokens)."""
    matrix = snapshot(epoch, layer, head, image)
    title = f"epoch {epoch.epoch + 1}, layer {layer}, head {head}"
    if image:
        side = matrix.shape[0]
        labels = [str(i) for i in range(side)]
        return heatmap(
            matrix,
            labels,
            labels,
            title + ": [CLS] → patches",
            row_title="patch row",
            col_title="patch column",
            domain=(0.0, float(max(matrix.max(), 1e-6))),
            cell_size=cell or 44,
        )
    tokens = list(epoch.tokens)
    # Its own colour range (0 to its largest weight): early in training the weights are close to uniform, and
    # on a 0..1 scale every cell would look the same.
    return heatmap(
        matrix,
        tokens,
        tokens,
        title,
        domain=(0.0, float(matrix.max())),
        annotate=False,
        cell_size=cell or cell_px(len(tokens), 360),
    )


def fixed_digit(scale: int = 24) -> Image.Image:
    """The picture the ViT's attention is kept for (the first test digit), enlarged: ink bright on black, as
    the model reads it (ink 16 is white)."""
    images, _ = corpora.digits("test")
    grey = (images[0].astype(np.float32) * (255 / 16)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(grey, "L").resize((8 * scale, 8 * scale), Image.Resampling.NEAREST)


def summary(result: classroom.Result) -> pd.DataFrame:
    """One row per epoch: training loss, validation accuracy, seconds."""
    return pd.DataFrame(
        [
            {
                "epoch": e.epoch + 1,
                "training loss": round(e.train_loss, 4),
                "validation accuracy": round(e.valid_accuracy, 4),
                "seconds": round(e.seconds, 1),
            }
            for e in result.history
        ]
    ).set_index("epoch")
