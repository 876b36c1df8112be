"""The information-flow chart: every kept edge drawn where the graph puts it, clickable attention edges, the table."""

import numpy as np
import pytest

from tests.core.test_interventions import tiny_llama
from tformer_core.flow import FlowGraph, flow_graph, information_flow
from tformer_views.charts.export import validate
from tformer_views.flow import (
    AROUND_PLOT_PX,
    EDGE_PARAM,
    HELD_PLACES,
    MIN_LEVEL_PX,
    edge_frame,
    flow_chart,
    held_by_layer,
    held_chart,
    held_over_patches,
    level_name,
    strongest_edges,
)

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


def test_on_a_projector_the_chart_fits_the_screens_height():
    """Presenter mode at 1280 x 720 drew SmolLM2's 61 levels 1,060 px tall: the graph no longer fit the screen."""
    model = tiny_llama()
    flow = information_flow(model, model.trace(A))
    deep = FlowGraph(flow.tokens, 30, flow.prediction, 0.05, (), frozenset({(60, flow.prediction)}))  # 61 levels
    assert flow_chart(deep, LABELS, n_heads=4)["height"] == 10 * 63  # on a page: 10 px a level, 2 levels spare
    assert flow_chart(deep, LABELS, n_heads=4, screen=720)["height"] == (720 - AROUND_PLOT_PX) // 63 * 63
    assert flow_chart(deep, LABELS, n_heads=4, screen=720)["height"] + AROUND_PLOT_PX <= 720
    assert flow_chart(deep, LABELS, n_heads=4, screen=200)["height"] == MIN_LEVEL_PX * 63  # still lines, not dots
    shallow = flow_chart(graph_of(model), LABELS, n_heads=4, screen=1080)
    assert shallow["height"] == flow_chart(graph_of(model), LABELS, n_heads=4)["height"]  # room to spare: as on a page


def graph_of(model):
    return flow_graph(information_flow(model, model.trace(A)), 0.05)


def test_the_class_tokens_places_and_its_map_over_the_patches_worked_by_hand():
    # Two layers (five levels), a class token, a distillation token and a 2 x 2 grid of patches.
    held = np.zeros((5, 6))
    held[4, 0] = 1.0  # the output: all the class token's
    held[2] = [0.5, 0.1, 0.1, 0.1, 0.1, 0.0]  # before layer 1: 0.9 held, 0.1 taken by biases
    held[0] = [0.1, 0.0, 0.4, 0.2, 0.1, 0.0]  # before layer 0: 0.8 held
    tokens = ["[CLS]", "[DIST]", "r0c0", "r0c1", "r1c0", "r1c1"]
    frame = held_by_layer(held, tokens, n_prefix=2)
    got = {(b, w): s for b, w, s in zip(frame["before"], frame["where"], frame["share"], strict=True)}
    assert got == pytest.approx(
        {
            **{(0, p): s for p, s in zip(HELD_PLACES, (0.1, 0.0, 0.7, 0.2), strict=True)},
            **{(1, p): s for p, s in zip(HELD_PLACES, (0.5, 0.1, 0.3, 0.1), strict=True)},
            **{(2, p): s for p, s in zip(HELD_PLACES, (1.0, 0.0, 0.0, 0.0), strict=True)},
        }
    )
    np.testing.assert_array_equal(held_over_patches(held, 0, 2, (2, 2)), [[0.4, 0.2], [0.1, 0.0]])
    np.testing.assert_array_equal(held_over_patches(held, 2, 2, (2, 2)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"layer 3 is outside 0\.\.2"):
        held_over_patches(held, 3, 2, (2, 2))
    with pytest.raises(ValueError, match="4 patches do not fill a 3 x 2 grid"):
        held_over_patches(held, 0, 2, (3, 2))
    with pytest.raises(ValueError, match="does not match 5 tokens"):
        held_by_layer(held, tokens[:5], n_prefix=2)
    spec = held_chart(frame)
    validate(spec)
    assert spec["layer"][0]["encoding"]["x"]["title"] == "before layer (2: the output)"
