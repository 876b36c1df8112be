"""The views a notebook draws inline (tformer_views.notebook): what IPython is handed, checked against the trace."""

import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from tests.core.tiny_models import tiny_decoder, tiny_encoder
from tformer_core.lens import LogitLens
from tformer_views import head_matters, notebook
from tformer_views.charts.export import json_spec, validate
from tformer_views.text import HEAD_VIEW_MIN_WEIGHT

IDS = [2, 17, 33, 8, 21, 5, 39, 3]


@pytest.fixture(scope="module")
def enc_trace():
    return tiny_encoder().trace(IDS)


@pytest.fixture(scope="module")
def dec_trace():
    return tiny_decoder().trace(IDS)


def _dataset(spec: dict, layer: int) -> pd.DataFrame:
    """The records one layer of a chart draws, as the notebook's Vega-Lite renderer gets them."""
    return pd.DataFrame(spec["datasets"][spec["layer"][layer]["data"]["name"]])


def test_a_chart_hands_ipython_the_live_chart_its_svg_and_a_line_of_text(enc_trace):
    chart = notebook.head_view(enc_trace, 1, heads=[2])
    bundle = chart._repr_mimebundle_()
    assert set(bundle) == {notebook.VEGA_LITE_MIME, "image/svg+xml", "text/plain"}
    assert notebook.VEGA_LITE_MIME.endswith("+json")  # nbformat stores JSON data only under such a type
    live = bundle[notebook.VEGA_LITE_MIME]
    validate(live)
    json.dumps(live, allow_nan=False)  # plain JSON: a front end receives it as the kernel sends it
    svg = ET.fromstring(bundle["image/svg+xml"])
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    title = "layer 1, head 2: queries (left) → keys (right)"
    assert bundle["text/plain"] == f"<Chart: {title} (Vega-Lite; a notebook draws it)>"
    assert not hasattr(chart, "_repr_html_")  # IPython would rank its text/html above the live chart


@pytest.mark.parametrize("which", ["head view", "heatmap"])
def test_the_live_chart_is_drawn_by_vega_lite_5_as_the_app_draws_it(which, enc_trace, dec_trace):
    """Notebook front ends draw Vega-Lite 5 (JupyterLab's vega5 extension); the app draws Vega-Lite 6. The chart a
    notebook gets, drawn by Vega-Lite 5.8, is the picture the app's spec gives with Vega-Lite 6."""
    import vl_convert

    chart = notebook.head_view(enc_trace, 1) if which == "head view" else notebook.heatmap(dec_trace, 1, 2)
    live = chart._repr_mimebundle_()[notebook.VEGA_LITE_MIME]
    assert live["$schema"] == "https://vega.github.io/schema/vega-lite/v5.json"
    by_five = vl_convert.vegalite_to_svg(live, vl_version="5.8")
    by_six = vl_convert.vegalite_to_svg(json_spec(chart.spec), vl_version="6.4")
    same_ids = re.compile(r"gradient_\d+")  # each render numbers its colour gradients afresh
    assert same_ids.sub("gradient", by_five) == same_ids.sub("gradient", by_six)
    assert len(by_five) > 10_000  # a drawn chart, not an empty frame


def test_the_head_view_of_one_head_draws_that_heads_weights(enc_trace):
    chart = notebook.head_view(enc_trace, 1, heads=[2])
    lines = _dataset(chart.to_dict(), 0)
    weights = enc_trace.attention(1, 2)  # [queries, keys], as the core reads it
    q, k = np.nonzero(weights >= HEAD_VIEW_MIN_WEIGHT)
    expected = sorted(zip(q.tolist(), k.tolist()))
    assert sorted(zip(lines["query"], lines["y_key"])) == expected  # every line above the threshold, no other
    assert set(lines["head"]) == {2}
    drawn = lines.set_index(["query", "y_key"])["weight"]
    np.testing.assert_allclose([drawn[cell] for cell in expected], weights[q, k], rtol=1e-6)
    strongest = np.unravel_index(np.argmax(weights), weights.shape)
    tokens = enc_trace.tokens
    assert f"query: {tokens[strongest[0]]}; key: {tokens[strongest[1]]}" in chart.to_svg()  # its line is drawn


def test_the_head_view_draws_every_head_unless_told(enc_trace):
    lines = _dataset(notebook.head_view(enc_trace, 0).to_dict(), 0)
    assert set(lines["head"]) == set(range(enc_trace.n_heads)) == {0, 1, 2, 3}
    assert repr(notebook.head_view(enc_trace, 0)).startswith("<Chart: layer 0, 4 heads:")


def test_the_heatmap_is_the_heads_matrix_with_the_causal_cells_grey(dec_trace):
    chart = notebook.heatmap(dec_trace, 1, 3)
    spec = chart.to_dict()
    validate(spec)
    cells = _dataset(spec, 0)
    weights = dec_trace.attention(1, 3)
    n = len(IDS)
    assert len(cells) == n * n
    above = cells["col"] > cells["row"]  # a causal model's future keys: masked, weight exactly 0, drawn grey
    assert cells.loc[above, "value"].isna().all() and (cells.loc[above, "label"] == "0").all()
    below = cells[~above]
    np.testing.assert_allclose(below["value"], weights[below["row"], below["col"]], rtol=1e-6)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-6)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == [0.0, 1.0]


def test_the_lens_as_a_table_shows_tokens_readable():
    lens = LogitLens(
        layers=("embed", "0", "1"),
        top_ids=np.array([[4], [7], [7]]),
        top_probs=np.array([[0.5], [0.25], [0.75]]),
        top_labels=(("Ġthe",), ("ĠParis",), ("ĠParis",)),
        target=7,
        target_label="ĠParis",
        rank=np.array([3, 0, 0]),
        prob=np.array([0.125, 0.25, 0.75]),
    )
    table = head_matters.lens_frame(lens)
    assert list(table.columns) == ["after layer", "top", "p(top)", "rank of ␣Paris", "p(␣Paris)"]
    assert table["after layer"].tolist() == ["embed", "0", "1"]
    assert table["top"].tolist() == ["␣the", "␣Paris", "␣Paris"]
    assert table["rank of ␣Paris"].tolist() == [3, 0, 0]
    assert table["p(␣Paris)"].tolist() == [0.125, 0.25, 0.75]
