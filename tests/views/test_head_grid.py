"""The layers x heads grid of "Does this head matter?": legible numbers or none, within its box, the chosen head
outlined, valid Vega-Lite."""

import numpy as np
import pytest

from tformer_views.charts.export import validate
from tformer_views.charts.head_grid import MIN_CELL_PX, chrome, grid_look, head_grid


@pytest.mark.parametrize(
    ("shape", "box", "least", "numbers"),
    [
        ((30, 9), (560, 510), 14, False),  # SmolLM2 on a 720-px projector: rows of 13 px hold no 14-px number
        ((4, 4), (560, 510), 14, True),  # vit-tiny
        ((6, 12), (700, 510), 14, True),  # MiniLM, its column widened for its 12 heads
        ((6, 12), (560, 510), 14, False),  # ... not in half of it
        ((30, 9), (430, 640), 9, True),  # SmolLM2 on a page of its own: 9-px numbers
    ],
)
def test_numbers_are_printed_only_at_the_least_size_asked_and_the_grid_keeps_within_its_box(shape, box, least, numbers):
    n_layers, n_heads = shape
    look = grid_look(n_layers, n_heads, *box, least_font=least, label_font=16 if least >= 14 else 11)
    assert look.numbers == numbers and (look.font >= least if numbers else look.font == 0)
    extra_width, extra_height = chrome(look.label_font)
    assert n_heads * look.cell_width + extra_width <= box[0]
    assert n_layers * look.cell_height + extra_height <= box[1] or look.cell_height == MIN_CELL_PX
    assert look.cell_height <= look.cell_width  # square, or lower rows for many layers


def test_the_grid_is_valid_vega_lite_its_sizes_as_its_look_says_and_the_chosen_head_outlined():
    values = np.linspace(-0.3, 0.3, 4 * 3).reshape(4, 3)
    look = grid_look(4, 3, 600, 500, least_font=14, label_font=16, most_cell=84)
    spec = head_grid(values, ["Drop in p('Paris')", "when ablated"], look, chosen=(2, 1), clickable=True, scale=1.5)
    validate(spec)
    assert (spec["width"], spec["height"]) == (3 * look.cell_width, 4 * look.cell_height)
    numbers = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "text")
    assert numbers["mark"]["fontSize"] == look.font >= 14
    assert spec["config"]["axis"]["labelFontSize"] == 16 and spec["usermeta"] == {"scale": 1.5}
    chosen = next(layer for layer in spec["layer"] if layer.get("name") == "chosen")
    assert chosen["transform"] == [{"filter": "datum.row == 2 && datum.col == 1"}]
    assert chosen["mark"]["filled"] is False and chosen["mark"]["strokeWidth"] >= 3
    assert spec["params"][0]["name"] == "pair" and spec["params"][0]["views"] == ["cells"]  # a click picks a cell
    (frame,) = spec["datasets"].values()
    assert len(frame) == 12 and list(frame["label"])[:2] == ["-0.30", "-0.25"]


def test_without_numbers_the_grid_sends_none_and_thins_labels_lower_than_their_rows():
    look = grid_look(30, 9, 560, 510, least_font=14, label_font=16)
    spec = head_grid(np.zeros((30, 9)), "t", look)
    validate(spec)
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rect"]
    assert spec["layer"][0]["encoding"]["y"]["axis"]["labelOverlap"] == "parity"
