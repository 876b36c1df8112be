"""The layers x heads grid of "Does this head matter?": a heatmap sized to the box it is drawn in, its numbers in
the cells only where they can be read at the size asked (a class reads 14 px from the back of a room), the chosen
head outlined.

    look = grid_look(layers=30, heads=9, width=596, height=470, least_font=14, label_font=16)
    spec = head_grid(values, ["Drop in p('Paris')", "when the head is ablated"], look, chosen=(3, 5))

SmolLM2's 30 layers in a projector's first screen leave rows of 13 px: no number is legible there, so the grid is
drawn in colours alone and the page prints the chosen head's number beside it, large. A 4 x 4 grid (vit-tiny) gets
cells of 84 px with numbers of 24 px.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import heatmap

__all__ = ["CHAR_EM", "MAX_FONT_PX", "MIN_CELL_PX", "NUMBER_EM", "GridLook", "chrome", "grid_look", "head_grid"]

MIN_CELL_PX = 12  # every axis label still shows
MAX_FONT_PX = 24
# Widths in font sizes (em) of what the grid draws, for its layout; a little more than a sans-serif's own.
NUMBER_EM = 2.6  # "-0.05", the longest of `spec.cell_text`'s numbers below 100
CHAR_EM = 0.62


@dataclass(frozen=True)
class GridLook:
    """How a grid is drawn: its cells (px), the numbers in them (px; 0: none, its colours only), its axis labels and
    titles (px), the chart's title (px), the chosen head's outline (px)."""

    cell_width: int
    cell_height: int
    font: int
    label_font: int
    title_font: int
    outline: int

    @property
    def numbers(self) -> bool:
        return self.font > 0


def chrome(label_font: int, title_lines: int = 2) -> tuple[int, int]:
    """(width, height) in px that a grid's axes, legend, title and padding take beside and above / below its cells."""
    title_font = round(label_font * 13 / 11)
    width = round(3 * CHAR_EM * label_font) + 8  # the layer labels ("L29")
    width += label_font + 6  # the y axis's title
    # The colour legend: its gradient, its labels ("−0.025": Vega's minus sign is wider than a hyphen), its offset.
    width += 16 + 8 + round(6 * CHAR_EM * label_font) + 18
    height = title_lines * (title_font + 4) + 2 * (label_font + 8)  # the title, the head labels and their title
    return width + 10, height + 10  # Vega's padding


def grid_look(
    layers: int,
    heads: int,
    width: int,
    height: int,
    least_font: int = 10,
    label_font: int = 11,
    most_cell: int = 56,
    title_lines: int = 2,
) -> GridLook:
    """The look of a layers x heads grid drawn in a box of `width` x `height` px (the whole chart: its axes, legend
    and title too): cells as wide as the box allows (MIN_CELL_PX to `most_cell`), as tall unless its layers need
    lower rows; numbers in them at the size they hold, at least `least_font` px, else none."""
    if layers < 1 or heads < 1:
        raise ValueError(f"a grid needs layers and heads, got {layers} x {heads}")
    extra_width, extra_height = chrome(label_font, title_lines)
    cell_width = int(min(most_cell, max(MIN_CELL_PX, (width - extra_width) // heads)))
    cell_height = int(min(cell_width, max(MIN_CELL_PX, (height - extra_height) // layers)))
    natural = max(least_font, min(cell_width, cell_height) // 3)  # a third of the cell, as the app's heatmaps
    fits = min((cell_width - 6) / NUMBER_EM, cell_height - 4)
    font = int(min(natural, fits, MAX_FONT_PX))
    title_font = round(label_font * 13 / 11)
    font = font if font >= least_font else 0
    return GridLook(cell_width, cell_height, font, label_font, title_font, outline=2 + label_font // 8)


def head_grid(
    values: np.ndarray,
    title: str | list[str],
    look: GridLook,
    chosen: tuple[int, int] | None = None,
    domain: tuple[float, float] | None = None,
    clickable: bool = False,
    scale: float = 1.0,
) -> dict:
    """A layers x heads grid ([layers, heads] values; rows "L0".., columns "H0".., a diverging scale around 0) drawn
    as `look` says, `chosen` (layer, head) outlined. clickable: a click on a cell selects it (selection "pair",
    fields row and col: `spec.heatmap`'s). scale: recorded in the spec's usermeta, the size presenter mode draws at
    (tformer_app.presenter.chart_fonts leaves such a chart as it is)."""
    values = np.asarray(values, dtype=np.float64)
    layers, heads = values.shape
    spec = heatmap(
        values,
        [f"L{i}" for i in range(layers)],
        [f"H{h}" for h in range(heads)],
        title,
        row_title="layer",
        col_title="head",
        diverging=True,
        domain=domain,
        annotate=look.numbers,
        cell_size=look.cell_height,
        cell_width=look.cell_width,
        clickable=clickable,
    )
    cells = spec["layer"][0]
    cells["encoding"]["x"]["axis"] = {**cells["encoding"]["x"]["axis"], "labelAngle": 0}
    thin = look.cell_height < look.label_font + 2  # rows lower than their labels: every other one
    cells["encoding"]["y"]["axis"] = {**cells["encoding"]["y"]["axis"], "labelOverlap": "parity" if thin else False}
    if look.numbers:
        numbers = spec["layer"][1]
        numbers["mark"] = {**numbers["mark"], "fontSize": look.font}
    if chosen is not None:
        layer, head = int(chosen[0]), int(chosen[1])
        spec["layer"].append(
            {
                "name": "chosen",
                "data": cells["data"],
                "transform": [{"filter": f"datum.row == {layer} && datum.col == {head}"}],
                "mark": {"type": "rect", "filled": False, "stroke": "black", "strokeWidth": look.outline},
                "encoding": {"x": cells["encoding"]["x"], "y": cells["encoding"]["y"]},
            }
        )
    fonts = {"labelFontSize": look.label_font, "titleFontSize": look.label_font}
    spec["config"] = {"axis": fonts, "legend": fonts, "title": {"fontSize": look.title_font}}
    spec["usermeta"] = {"scale": scale}
    return spec
