"""The query–key space figure (tformer_views.charts.projection): Plotly traces of the right sizes at the projected
coordinates, token labels shown as text (never as Plotly's HTML), and lines to the keys the trace's own weights
rank first."""

from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import tiny_decoder, tiny_encoder, tiny_seq2seq
from tformer_views.charts.projection import qk_figure, qk_space, trace_named

TOKENS = ("<s>", "<b>bold</b>", "a&b", "cat", "<script>x</script>", "sat", "&lt;", "</s>")


@pytest.fixture(scope="module")
def trace():
    with torch.no_grad():
        t = tiny_encoder().trace([5, 17, 3, 22, 9, 31, 2, 8])
    return replace(t, tokens=TOKENS)


def _lines(figure):
    return [t for t in figure.data if t.mode == "lines"]


@pytest.mark.parametrize("dims", [2, 3])
def test_queries_and_keys_are_two_traces_at_their_projected_coordinates(trace, dims):
    space = qk_space(trace, 1, 2, query=3, dims=dims)
    figure = qk_figure(space, title="layer 1, head 2")
    kind = go.Scatter3d if dims == 3 else go.Scatter
    queries, keys = trace_named(figure, "queries"), trace_named(figure, "keys")
    assert isinstance(queries, kind) and isinstance(keys, kind)
    assert len(queries.x) == 8 and len(keys.x) == 8
    assert queries.marker.symbol == "circle" and keys.marker.symbol == "diamond"
    assert queries.marker.color != keys.marker.color
    expected = tc.qk_projection(trace, 1, 2, n_components=dims, align_means=True)
    axes = ("x", "y", "z")[:dims]
    for points, drawn in ((expected.queries, queries), (expected.keys, keys)):
        np.testing.assert_allclose(np.stack([getattr(drawn, a) for a in axes], 1), points, atol=1e-12)
    if dims == 3:
        assert figure.layout.scene.zaxis.title.text.startswith("PC3 (")
    titles = (
        [figure.layout.scene.xaxis.title.text, figure.layout.scene.yaxis.title.text]
        if dims == 3
        else [figure.layout.xaxis.title.text, figure.layout.yaxis.title.text]
    )
    assert titles == [f"PC{i + 1} ({share:.0%} of variance)" for i, share in enumerate(expected.explained[:2])]
    if dims == 2:  # one unit is one unit on both axes: distances on screen are distances in the projection
        assert figure.layout.yaxis.scaleanchor == "x"
    else:
        assert figure.layout.scene.aspectmode == "data"
    figure.to_json()  # Plotly validated every property on the way


def test_token_labels_are_escaped_for_plotly(trace):
    figure = qk_figure(qk_space(trace, 0, 1, query=1))
    keys, queries = trace_named(figure, "keys"), trace_named(figure, "queries")
    assert list(keys.text) == [
        "&lt;s&gt;",
        "&lt;b&gt;bold&lt;/b&gt;",
        "a&amp;b",
        "cat",
        "&lt;script&gt;x&lt;/script&gt;",
        "sat",
        "&amp;lt;",
        "&lt;/s&gt;",
    ]
    assert list(queries.text) == list(keys.text)
    assert queries.hovertext[1] == "query 1: <b>&lt;b&gt;bold&lt;/b&gt;</b>"  # our <b>, their escaped one
    assert keys.hovertext[4].startswith("key 4: <b>&lt;script&gt;x&lt;/script&gt;</b><br>weight from &lt;b&gt;")
    for text in [*keys.hovertext, *queries.hovertext, *keys.text]:  # no tag but ours
        assert "<s>" not in text and "<script>" not in text and "<b>bold" not in text
    chosen = trace_named(figure, "chosen query")
    assert chosen.name == "chosen query: &lt;b&gt;bold&lt;/b&gt;" and len(chosen.x) == 1
    # In 3-D the marker text is WebGL: it decodes no entity ("&lt;" would show as such) but reads <b>, <i>, <sub>,
    # <sup>, <br>; a zero-width space after each "<" keeps them text. The hover boxes are SVG, escaped as in 2-D.
    three = qk_figure(qk_space(trace, 0, 1, query=1, dims=3))
    keys3 = trace_named(three, "keys")
    assert list(keys3.text) == [
        "<\u200bs>",
        "<\u200bb>bold<\u200b/b>",
        "a&b",
        "cat",
        "<\u200bscript>x<\u200b/script>",
        "sat",
        "&lt;",
        "<\u200b/s>",
    ]
    assert [t.replace("\u200b", "") for t in keys3.text] == list(TOKENS)  # what the reader sees
    assert list(keys3.hovertext) == list(keys.hovertext)


def test_lines_go_from_the_query_to_its_strongest_keys_by_the_traces_weights(trace):
    layer, head, query = 1, 3, 5
    space = qk_space(trace, layer, head, query, top=3)
    row = trace.attention(layer, head)[query]
    top = np.argsort(-row)[:3]
    np.testing.assert_array_equal(space.top_keys, top)
    np.testing.assert_allclose(space.top_weights, row[top])
    figure = qk_figure(space)
    lines = _lines(figure)
    assert [line.name for line in lines] == [f"weight → key {k}" for k in top]
    p = space.projection
    for line, key in zip(lines, top):
        np.testing.assert_allclose([line.x[0], line.y[0]], p.queries[query], atol=1e-12)
        np.testing.assert_allclose([line.x[1], line.y[1]], p.keys[key], atol=1e-12)
    widths, opacities = [line.line.width for line in lines], [line.opacity for line in lines]
    assert widths == sorted(widths, reverse=True) and opacities == sorted(opacities, reverse=True)
    assert widths[0] == pytest.approx(7.5) and opacities[0] == pytest.approx(0.95)  # the strongest key
    hover = trace_named(figure, "keys").hovertext
    assert hover[int(top[0])].endswith(f"weight from sat: {row[top[0]]:.3f}")
    # No query chosen: no lines, no weights in the hover text.
    none = qk_figure(qk_space(trace, layer, head, query=None))
    assert not _lines(none) and trace_named(none, "chosen query") is None
    assert "weight" not in trace_named(none, "keys").hovertext[0]


def test_shown_positions_only_and_a_causal_model_draws_no_line_to_a_masked_key():
    with torch.no_grad():
        t = tiny_decoder().trace([4, 8, 15, 16, 23, 3])
    shown = np.array([1, 2, 3, 4])
    space = qk_space(t, 0, 1, query=1, query_positions=shown, key_positions=shown, top=3)
    figure = qk_figure(space, title="<i>layer</i>")
    assert len(trace_named(figure, "queries").x) == 4 and len(trace_named(figure, "keys").x) == 4
    # Query 1 may see keys 0 and 1 only; key 0 is hidden: one line, to key 1 (weight < 1: the rest went to 0).
    np.testing.assert_array_equal(space.top_keys, [1])
    assert [line.name for line in _lines(figure)] == ["weight → key 1"]
    assert figure.layout.title.text == "&lt;i&gt;layer&lt;/i&gt;"
    hidden = qk_space(t, 0, 1, query=0, query_positions=shown, key_positions=shown)
    assert hidden.query is None and not _lines(qk_figure(hidden))  # the query itself is not shown
    with pytest.raises(ValueError, match=r"^dims must be 2 or 3, got 4$"):
        qk_space(t, 0, 1, query=1, dims=4)


def test_cross_attention_draws_target_positions_against_source_tokens():
    with torch.no_grad():
        t = tiny_seq2seq().trace([3, 7, 11, 5, 9], [1, 4, 8])
    space = qk_space(t, 2, 0, query=2, stack="cross", dims=3)
    assert space.cross and len(space.query_positions) == 3 and len(space.key_positions) == 5
    figure = qk_figure(space)
    assert len(trace_named(figure, "queries").x) == 3 and len(trace_named(figure, "keys").x) == 5
    assert trace_named(figure, "queries").hovertext[0].startswith("target 0:")
    assert trace_named(figure, "keys").hovertext[0].startswith("source 0:")
    row = t.attention(2, 0, "cross")[2]
    np.testing.assert_array_equal(space.top_keys, np.argsort(-row)[:3])


def test_grouped_query_heads_share_the_key_points():
    torch.manual_seed(0)
    model = tc.Llama(tc.LlamaConfig(vocab_size=50, d_model=48, n_heads=6, n_kv_heads=2, d_ff=64, n_layers=1))
    with torch.no_grad():
        t = model.trace([3, 14, 15, 9, 26, 5])
    assert qk_space(t, 0, 3, query=2).kv_head == qk_space(t, 0, 5, query=2).kv_head == 1
    assert qk_space(t, 0, 2, query=2).kv_head == 0
    # With every axis, both heads' key points are key/value head 1's keys (each PCA is fitted with its own queries).
    scaled = t["decoder.0.attn.k"][1] * np.sqrt(t.meta["attention_scale"])
    for head in (3, 5):
        p = qk_space(t, 0, head, query=2, dims=3, align_means=False).projection
        full = tc.qk_projection(t, 0, head, n_components=8)
        np.testing.assert_allclose(full.keys @ full.components + full.mean, scaled, atol=1e-5)
        np.testing.assert_allclose(p.keys, full.keys[:, :3], atol=1e-5)
