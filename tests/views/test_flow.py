"""The information-flow chart: every kept edge drawn where the graph puts it, clickable attention edges, the table."""

import numpy as np
import pytest

from tests.core.test_interventions import tiny_llama
from tformer_core.flow import flow_graph, information_flow
from tformer_views.charts.export import validate
from tformer_views.flow import EDGE_PARAM, edge_frame, flow_chart, level_name, strongest_edges

A = [3, 7, 1, 12, 9, 4, 22]
LABELS = [f"t{i}" for i in range(len(A))]


@pytest.fixture(scope="module")
def graph():
    model = tiny_llama()
    return flow_graph(information_flow(model, model.trace(A)), 0.05)


def test_the_chart_is_valid_vega_lite_and_draws_every_kept_edge_once(graph):
    spec = flow_chart(graph, LABELS, n_heads=4, predicted="t9", selected=(1, 2))
    validate(spec)
    frame = edge_frame(graph, LABELS)
    assert len(frame) == len(graph.edges) > 0
    drawn = {
        kind: len(spec["datasets"][layer["data"]["name"]])
        for layer, kind in zip(spec["layer"][:3], ("residual", "ffn", "attention"), strict=True)
    }
    assert drawn == {kind: int((frame["kind"] == kind).sum()) for kind in drawn}
    # levels go up one per update; the attention's ends sit right of the residual, the FFN's left of it
    assert (frame["y2"] - frame["y"] == 1).all()
    attention = frame[frame["kind"] == "attention"]
    np.testing.assert_allclose(attention["x"] - attention["source"], 0.14)
    np.testing.assert_allclose(attention["x2"] - attention["target"], 0.14)
    assert (
        frame.loc[frame["kind"] != "attention", "source"] == frame.loc[frame["kind"] != "attention", "target"]
    ).all()
    param = spec["params"][0]
    assert param["name"] == EDGE_PARAM and param["select"]["fields"] == ["layer", "head"]
    hits = next(layer for layer in spec["layer"] if layer.get("name") == "attention_hits")
    assert len(spec["datasets"][hits["data"]["name"]]) == len(attention)
    tokens = spec["datasets"][spec["layer"][-2]["data"]["name"]]
    assert list(tokens["text"]) == LABELS


def test_levels_are_named_and_the_table_ranks_attention_edges(graph):
    assert [level_name(v) for v in (0, 1, 2, 3)] == ["input", "layer 0 attention", "layer 0 FFN", "layer 1 attention"]
    table = strongest_edges(graph, LABELS, k=3)
    shares = sorted((e.share for e in graph.edges if e.kind == "attention"), reverse=True)[:3]
    np.testing.assert_allclose(table["share"], np.round(shares, 3))
    assert list(table.columns) == ["layer", "head", "from", "to", "share"]


def test_a_graph_with_no_edges_still_draws():
    model = tiny_llama()
    empty = flow_graph(information_flow(model, model.trace(A)), 1.0)
    spec = flow_chart(empty, LABELS, n_heads=4)
    validate(spec)
    assert strongest_edges(empty, LABELS).empty


def test_the_chart_fits_the_column_it_is_given(graph):
    """A phone's column (390 px wide, 358 px of it for the page) cut the 56-px-a-position graph and its one-line
    title; the chart is now no wider than the room beside its layer labels, the title on two lines."""
    wide = flow_chart(graph, LABELS * 2, n_heads=4)  # 56 px a position, over 14 positions
    assert wide["width"] == 56 * len(LABELS) * 2
    for room, width in ((358, 358 - 70), (1000, wide["width"]), (100, 200)):
        assert flow_chart(graph, LABELS * 2, n_heads=4, room=room)["width"] == width
    title = flow_chart(graph, LABELS, n_heads=4)["title"]
    assert title == [f"Routes to the prediction at {LABELS[graph.prediction]}", "(edges with share > 0.05)"]
