"""The sinks views (tformer_views.sinks): charts valid Vega-Lite carrying the core's numbers, tables and the summary
sentence read from hand-made traces whose figures are worked by hand."""

import numpy as np
import pandas as pd
import pytest

import tformer_core as tc
from tformer_core import sinks
from tformer_views import sinks as sv
from tformer_views.charts.export import validate


def _trace() -> tc.Trace:
    """[CLS] a b [SEP], 2 layers x 1 head, bidirectional; a residual stream with one massive number in layer 1."""
    w0 = [[0.7, 0.1, 0.1, 0.1], [0.6, 0.2, 0.1, 0.1], [0.4, 0.2, 0.2, 0.2], [0.5, 0.1, 0.1, 0.3]]  # [CLS]: 0.55
    w1 = [[0.1, 0.3, 0.3, 0.3], [0.2, 0.2, 0.2, 0.4], [0.1, 0.1, 0.2, 0.6], [0.2, 0.2, 0.2, 0.4]]  # [CLS]: 0.15
    stream0 = np.full((4, 3), 1.0)
    stream1 = np.full((4, 3), 2.0)
    stream1[0, 1] = -5000.0  # 2500x the median 2
    activations = {
        "encoder.0.attn.weights": np.array([w0], np.float32),
        "encoder.1.attn.weights": np.array([w1], np.float32),
        "encoder.0.resid_pre": stream0.astype(np.float32),
        "encoder.1.resid_pre": stream1.astype(np.float32),
    }
    return tc.Trace("encoder", activations, ("[CLS]", "a", "b", "[SEP]"), 1, {"encoder": 2})


def test_the_view_reads_the_shares_and_the_activations():
    view = sv.sinks_of(_trace())
    assert [s.name for s in view.shares] == ["first token", "[SEP]"]
    table = sv.share_table(view)
    # [CLS]: (0.7 + 0.6 + 0.4 + 0.5) / 4 = 0.55, (0.1 + 0.2 + 0.1 + 0.2) / 4 = 0.15; [SEP]: 0.175, 0.425
    np.testing.assert_allclose(table["first token ([CLS])"], [0.55, 0.15], atol=1e-7)
    np.testing.assert_allclose(table["[SEP]"], [0.175, 0.425], atol=1e-7)
    assert table.index.name == "layer"
    found = sv.activation_table(view)
    top = found.loc[1].iloc[0]
    assert (top["token"], top["position"], top["dimension"], top["value"]) == ("[CLS]", 0, 1, -5000.0)
    assert top["× median"] == 2500.0 and bool(top["massive"]) and not found.loc[0]["massive"].any()
    assert sv.summary(view) == (
        "In 1 of 2 layers more than 50% of the attention goes to the first token ([CLS]); over every layer and "
        "head, 35%. A massive activation: -5,000 in dimension 1 at [CLS] (position 0) entering layer 1, 2,500× "
        "the layer's median (massive in layer 1)."
    )


def test_the_charts_are_valid_and_carry_the_numbers():
    view = sv.sinks_of(_trace())
    grid = sv.share_grid(view.shares[0])
    per_layer = sv.per_layer_chart(view.shares)
    ratios = sv.activation_chart(view)
    for spec in (grid, per_layer, ratios):
        validate(spec)
    cells = next(iter(grid["datasets"].values()))
    assert sorted(cells["value"].round(6)) == [0.15, 0.55]
    bars = next(d for d in per_layer["datasets"].values() if "share" in d)
    assert len(bars) == 4 and set(bars["on"]) == {"first token ([CLS])", "[SEP]"}
    layers = next(iter(ratios["datasets"].values()))
    assert layers["massive"].tolist() == ["not massive", "massive"] and layers["ratio"].tolist() == [1.0, 2500.0]


def test_a_trace_without_a_residual_stream_says_so():
    kept = {n: t for n, t in _trace().activations.items() if "resid" not in n}
    view = sv.sinks_of(tc.Trace("encoder", kept, ("[CLS]", "a", "b", "[SEP]"), 1, {"encoder": 2}))
    assert view.activations is None and "residual stream" in view.missing
    assert "massive" not in sv.summary(view)
    with pytest.raises(tc.InputError, match="residual stream"):
        sv.activation_chart(view)


def test_the_knockout_table_sets_before_beside_after():
    before = sinks.Prediction(2, (("ĠParis", 0.77), ("Ġthe", 0.06)), "ĠParis", 0.77)
    after = sinks.Prediction(2, (("oun", 0.56),), "ĠParis", 1e-6)
    table = sv.knockout_table(sinks.Knockout("x", before, after, 1.4, 0.05))
    expected = pd.DataFrame(
        {"before": ["␣Paris", "␣the"], "p before": [0.77, 0.06], "after": ["oun", ""], "p after": [0.56, np.nan]},
        index=pd.Index([1, 2], name="rank"),
    )
    pd.testing.assert_frame_equal(table, expected)
    none = sinks.Prediction(None, (), None, None)
    assert sv.knockout_table(sinks.Knockout("x", none, none, 0.3, 0.9)).empty
