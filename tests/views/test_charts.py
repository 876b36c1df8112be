"""Charts shared by the pages: long-form matrices with masked cells, and the SVG / PNG exports."""

import io
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from jsonschema import ValidationError
from PIL import Image

from tformer_views.charts.export import to_png, to_svg, validate
from tformer_views.charts.spec import cell_text, heatmap, matrix_frame, unique_labels


def test_masked_cells_travel_as_null_and_read_minus_inf():
    frame = matrix_frame(np.array([[0.25, -np.inf], [0.5, 0.5]]), ["a", "b"], ["x", "y"])
    assert frame["value"].isna().tolist() == [False, True, False, False]  # missing: Arrow sends null
    assert frame["value"].iloc[[0, 2, 3]].tolist() == [0.25, 0.5, 0.5]
    assert frame["text"].tolist() == ["0.25", "-inf", "0.5", "0.5"]


def test_repeated_tokens_stay_distinct_rows_that_look_the_same():
    labels = unique_labels(["the", "cat", "the"])
    assert len(set(labels)) == 3 and [s.replace("\u200b", "") for s in labels] == ["the", "cat", "the"]


def test_cell_labels_are_short_and_the_tooltip_keeps_four_digits():
    assert list(cell_text(np.array([16.0, 0.000226, 0.768, 6.61e-5, -1.1547, 1234.5, -np.inf]))) == [
        "16",
        "0.00",
        "0.77",
        "0.00",
        "-1.15",
        "1.23e+03",
        "-inf",
    ]
    frame = matrix_frame(np.array([[0.000226, 2.0]]), ["q"], ["a", "b"])
    assert list(frame["text"]) == ["0.000226", "2"] and list(frame["label"]) == ["0.00", "2"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"diverging": True},
        {"domain": (0.0, 1.0)},
        {"annotate": False, "cell_width": 4},
        {"clickable": True, "masked": np.array([[False, True, False], [False, False, True]])},
    ],
)
def test_heatmaps_are_valid_vega_lite_with_one_cell_per_entry(kwargs):
    m = np.array([[0.1, -np.inf, 0.3], [0.5, 0.25, 0.25]])
    spec = heatmap(m, ["the", "the"], ["a", "b", "c"], title="t", **kwargs)
    validate(spec)
    (frame,) = spec["datasets"].values()
    masked = kwargs.get("masked", np.zeros(m.shape, dtype=bool))
    assert len(frame) == 6 and frame["value"].isna().sum() == int((~np.isfinite(m) | masked).sum())  # grey cells
    assert spec["height"] == 2 * 40 and spec["width"] == 3 * kwargs.get("cell_width", 40)  # 40 px cells at most
    broken = {**spec, "layer": [{**spec["layer"][0], "mark": {"type": "rectangle"}}]}
    with pytest.raises(ValidationError):
        validate(broken)


def test_svg_export_is_the_chart_with_its_title_and_every_cell():
    chart = heatmap(np.array([[0.1, 0.9], [0.6, 0.4]]), ["I", "tea"], ["I", "tea"], title="weights, head 3")
    svg = to_svg(chart)
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag.endswith("svg")
    assert "weights, head 3" in svg
    # Four cells, each with its value printed inside (small matrices are annotated).
    for value in ("0.10", "0.90", "0.60", "0.40"):
        assert re.search(rf">{re.escape(value)}<", svg), value


def test_png_export_is_an_image_at_twice_the_chart_size():
    chart = heatmap(np.eye(3), ["a", "b", "c"], ["a", "b", "c"], title="identity", cell_size=40)
    small = Image.open(io.BytesIO(to_png(chart, scale=1.0)))
    large = Image.open(io.BytesIO(to_png(chart, scale=2.0)))
    assert small.format == "PNG" and large.size == (2 * small.size[0], 2 * small.size[1])
    assert small.size[0] >= 3 * 40 and small.size[1] >= 3 * 40  # the cells, plus axes around them
