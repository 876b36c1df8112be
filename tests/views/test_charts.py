"""Charts shared by the pages: long-form matrices with masked cells, and the SVG / PNG exports."""

import io
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from jsonschema import ValidationError
from PIL import Image

from tformer_views.charts import raster
from tformer_views.charts.attention import head_view_chart
from tformer_views.charts.export import to_png, to_svg, validate
from tformer_views.charts.spec import cell_text, heatmap, matrix_frame, unique_labels
from tformer_views.text import HeadView


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
    with pytest.raises(ValidationError, match=r"^'boxplot' was expected") as invalid:
        validate(broken)
    assert invalid.value.instance == "rectangle"  # the mark type that was changed, and nothing else


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


# ---- PNG of the head view: its lines drawn in numpy, the rest by resvg ------------------------------------
def _head_view(n_tokens: int, n_heads: int, seed: int = 0) -> HeadView:
    """A head view of random attention (every weight >= 0.01 drawn, as the page draws them)."""
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(n_tokens, 0.3), size=(n_heads, n_tokens))  # [heads, queries, keys]
    h, q, k = np.nonzero(weights >= 0.01)
    tokens = np.array([f"tok{i}" for i in range(n_tokens)], dtype=object)
    lines = pd.DataFrame(
        {"head": h, "query": q, "key": k, "y_query": q, "y_key": k, "weight": weights[h, q, k]}
        | {"query_token": tokens[q], "key_token": tokens[k]}
    )
    side = pd.DataFrame({"y": np.arange(n_tokens), "token": tokens})
    return HeadView(lines, side.assign(query=side.y), side.assign(key=side.y), tuple(range(n_heads)), 0.01, 0.0)


def _pixels(png: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_head_view_sends_its_lines_as_numbers_and_looks_their_tokens_up():
    view = _head_view(5, 2)
    spec = head_view_chart(view, 2)
    validate(spec)
    lines_layer = spec["layer"][0]
    drawn = spec["datasets"][lines_layer["data"]["name"]]
    # What a layer switch sends: no token strings per line, small types (1,400 lines: 25 KB rather than 100).
    assert list(drawn.columns) == ["head", "query", "y_query", "y_key", "weight"]
    assert all(drawn[c].dtype.itemsize <= 4 for c in drawn.columns) and len(drawn) == len(view.lines)
    assert drawn["weight"].is_monotonic_increasing  # the strongest drawn last, on top
    lookups = {t["as"][0]: t["from"]["data"]["name"] for t in lines_layer["transform"]}
    assert lookups == {"query_token": spec["layer"][1]["data"]["name"], "key_token": spec["layer"][2]["data"]["name"]}
    # The tokens are there when the chart is drawn: each line's description (its tooltip's fields) names them.
    strongest = view.lines.loc[view.lines["weight"].idxmax()]
    described = f"query: {strongest.query_token}; key: {strongest.key_token}"
    assert described in to_svg(spec)


def test_head_view_png_is_resvgs_picture(monkeypatch):
    monkeypatch.setattr(raster, "MIN_LINES", 10)  # few lines, so that resvg's own picture is quick to compare
    spec = head_view_chart(_head_view(6, 3), 3, title="layer 2", scale=1.5)
    svg = to_svg(spec)
    assert raster._split(svg) is not None  # the lines are drawn here, not by resvg
    ours, theirs = _pixels(raster.chart_png(spec)), _pixels(to_png(spec))
    assert ours.shape == theirs.shape
    diff = np.abs(ours - theirs).max(axis=-1)
    # The same picture: the tokens, legend and title are resvg's own; the lines differ at anti-aliased edges.
    assert diff.mean() < 1.0 and np.mean(diff > 24) < 0.002, (diff.mean(), np.mean(diff > 24))


def test_head_view_png_export_is_a_png_at_twice_the_charts_size():
    spec = head_view_chart(_head_view(24, 6), 6, title="layer 0")
    assert len(spec["datasets"][spec["layer"][0]["data"]["name"]]) >= raster.MIN_LINES  # the numpy path
    width, height = raster._size(to_svg(spec))
    image = Image.open(io.BytesIO(raster.chart_png(spec)))
    assert image.format == "PNG" and image.size == (round(2 * width), round(2 * height))
    assert height >= 24 * 18  # a row per token


def test_lines_are_drawn_where_the_svg_puts_them():
    """A level line 2 px wide at y = 10 from x = 5 to 20 covers rows 9 and 10 (pixel centres at +0.5), columns
    5 to 19; moved down half a pixel, it covers row 10 and half of rows 9 and 11."""
    for y, rows in ((10.0, {9: 1.0, 10: 1.0}), (10.5, {9: 0.5, 10: 1.0, 11: 0.5})):
        lines = raster._Lines(
            start=np.array([[5.0, y]]),
            end=np.array([[20.0, y]]),
            colour=np.array([[0.0, 0.0, 0.0]], np.float32),
            alpha=np.array([1.0], np.float32),
            width=np.array([2.0]),
        )
        margin = raster._margin(lines, 1.0)
        planes = np.full((3, 30 + 2 * margin, 30 + 2 * margin), 255, np.float32)
        raster.draw_lines(planes, margin, lines, 1.0)
        ink = 1 - planes[0, margin:-margin, margin:-margin] / 255  # share of each pixel covered
        expected = np.zeros((30, 30))
        for row, share in rows.items():
            expected[row, 5:20] = share
        np.testing.assert_allclose(ink, expected, atol=1e-6)


def test_charts_the_fast_path_cannot_redraw_are_resvgs_and_big_ones_are_scaled_down():
    chart = heatmap(np.eye(3), ["a", "b", "c"], ["a", "b", "c"], title="identity", cell_size=40)
    assert raster._split(to_svg(chart)) is None  # no lines: resvg draws it, pixel for pixel
    assert np.array_equal(_pixels(raster.chart_png(chart)), _pixels(to_png(chart)))
    width, height = raster._size(to_svg(chart))
    small = Image.open(io.BytesIO(raster.chart_png(chart, max_pixels=20_000)))
    assert small.size[0] * small.size[1] <= 20_000 * 1.02 and small.size[0] < width
    assert small.size[0] / small.size[1] == pytest.approx(width / height, rel=0.02)
