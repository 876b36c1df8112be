"""Charts shared by the pages: long-form matrices with masked cells, and the SVG / PNG exports."""

import io
import re
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

from tformer_core.charts import heatmap, matrix_frame, to_png, to_svg, unique_labels


def test_masked_cells_travel_as_null_and_read_minus_inf():
    frame = matrix_frame(np.array([[0.25, -np.inf], [0.5, 0.5]]), ["a", "b"], ["x", "y"])
    assert frame["value"].isna().tolist() == [False, True, False, False]  # missing: Arrow sends null
    assert frame["value"].iloc[[0, 2, 3]].tolist() == [0.25, 0.5, 0.5]
    assert frame["text"].tolist() == ["0.25", "-inf", "0.5", "0.5"]


def test_repeated_tokens_stay_distinct_rows_that_look_the_same():
    labels = unique_labels(["the", "cat", "the"])
    assert len(set(labels)) == 3 and [s.replace("\u200b", "") for s in labels] == ["the", "cat", "the"]


def test_svg_export_is_the_chart_with_its_title_and_every_cell():
    chart = heatmap(np.array([[0.1, 0.9], [0.6, 0.4]]), ["I", "tea"], ["I", "tea"], title="weights, head 3")
    svg = to_svg(chart)
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag.endswith("svg")
    assert "weights, head 3" in svg
    # Four cells, each with its value printed inside (small matrices are annotated).
    for value in ("0.1", "0.9", "0.6", "0.4"):
        assert re.search(rf">{re.escape(value)}<", svg), value


def test_png_export_is_an_image_at_twice_the_chart_size():
    chart = heatmap(np.eye(3), ["a", "b", "c"], ["a", "b", "c"], title="identity", cell_size=40)
    small = Image.open(io.BytesIO(to_png(chart, scale=1.0)))
    large = Image.open(io.BytesIO(to_png(chart, scale=2.0)))
    assert small.format == "PNG" and large.size == (2 * small.size[0], 2 * small.size[1])
    assert small.size[0] >= 3 * 40 and small.size[1] >= 3 * 40  # the cells, plus axes around them
