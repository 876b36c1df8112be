"""The "Query–key space" view through AppTest: on the Text attention page (MiniLM), on the Encoder-decoder page's
encoder, and for cross-attention (the translator's decoder queries against its encoder keys). Real numbers: the
figure Streamlit sends holds the projection the core computes for the same trace."""

import base64

import numpy as np
import plotly.io as pio
import pytest
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app.pages import messages, no_exception, run
from tformer_app import attention_panel as panel
from tformer_app import results
from tformer_views import seq2seq as sv
from tformer_views.charts.projection import qk_space, trace_named

SENTENCE = "The animal didn't cross the street because it was too tired."


def figures(at: AppTest) -> list:
    """Every Plotly figure on the page, as plotly.graph_objects.Figure (decoded from what the browser gets)."""
    return [pio.from_json(element.proto.spec) for element in at.get("plotly_chart")]


def values(data) -> np.ndarray:
    """A coordinate array as sent: Plotly writes numpy arrays as typed arrays ({"dtype", "bdata": base64})."""
    if isinstance(data, dict):
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"]))
    return np.asarray(data)


def points(trace, dims: int) -> np.ndarray:
    return np.stack([values(getattr(trace, a)) for a in "xyz"[:dims]], 1)


@pytest.fixture(scope="module")
def minilm_trace():
    return tc.load_model("minilm").trace(SENTENCE)


def test_the_text_page_draws_the_query_key_space_and_switches_to_3d(minilm_trace):
    at = run("text_attention", views="head,qk", layer="2", head="5")
    no_exception(at)
    (figure,) = figures(at)
    query = 10  # "it", the page's default query
    expected = qk_space(minilm_trace, 2, 5, query, dims=2)
    queries, keys = trace_named(figure, "queries"), trace_named(figure, "keys")
    assert queries.type == keys.type == "scatter"
    np.testing.assert_allclose(points(queries, 2), expected.projection.queries, atol=1e-4)
    np.testing.assert_allclose(points(keys, 2), expected.projection.keys, atol=1e-4)
    lines = [t.name for t in figure.data if t.mode == "lines"]
    assert lines == [f"weight → key {k}" for k in expected.top_keys] and len(lines) == 3
    (caption,) = [c for c in messages(at, "caption") if c.startswith("PCA:")]
    share = expected.projection.explained
    assert f"keep {share.sum():.0%} of that variance ({share[0]:.0%}, {share[1]:.0%})" in caption
    assert "16 queries and 16 keys" in caption and "multiplied by d_k^(−1/4) = 0.420 first" in caption
    assert "Lines from query “it” to the keys it weighs most" in caption
    assert any(s.value == "Query–key space · layer 2, head 5" for s in at.subheader)
    # The 2-D / 3-D switch is in the link.
    at.radio(key="text.qk_dims").set_value(3).run()
    no_exception(at)
    (figure,) = figures(at)
    assert trace_named(figure, "queries").type == "scatter3d"
    np.testing.assert_allclose(
        points(trace_named(figure, "keys"), 3), qk_space(minilm_trace, 2, 5, query, dims=3).projection.keys, atol=1e-4
    )
    assert at.query_params["qk_dims"] in ("3", ["3"])


def test_a_link_opens_it_in_3d_without_the_key_translation_and_hidden_tokens_left_out(minilm_trace):
    at = run("text_attention", views="qk", qk_dims="3", qk_align="0", hide="1", query="2", layer="0", head="0")
    no_exception(at)
    (figure,) = figures(at)
    shown = np.arange(1, 15)  # [CLS] and [SEP] hidden
    expected = qk_space(minilm_trace, 0, 0, 2, dims=3, query_positions=shown, key_positions=shown, align_means=False)
    assert len(values(trace_named(figure, "queries").x)) == 14 and len(values(trace_named(figure, "keys").x)) == 14
    np.testing.assert_allclose(points(trace_named(figure, "queries"), 3), expected.projection.queries, atol=1e-4)
    (caption,) = [c for c in messages(at, "caption") if c.startswith("PCA:")]
    assert "Hidden special tokens are left out of the PCA." in caption and "centre" not in caption


def test_it_is_off_by_default_and_a_bad_link_value_is_said():
    at = run("text_attention")
    no_exception(at)
    assert not at.get("plotly_chart") and "qk" not in at.query_params["views"]
    assert panel.VIEWS["qk"] == "Query–key space"  # one of the pills, not chosen
    at = run("text_attention", views="qk", qk_dims="7")
    no_exception(at)
    assert len(figures(at)) == 1 and trace_named(figures(at)[0], "queries").type == "scatter"
    assert any("qk_dims=7" in m for m in messages(at, "info"))


def test_the_encoder_decoder_page_draws_the_encoders_query_key_space():
    at = run("encoder_decoder", enc_views="qk", enc_qk_dims="3")
    no_exception(at)
    (figure,) = figures(at)
    trace = results.result(results.translation("translator", sv.DEFAULT_SOURCES["translator"], 40)).trace  # the page's
    assert any(s.value == "Query–key space · encoder layer 0, head 0" for s in at.subheader)
    queries, keys = trace_named(figure, "queries"), trace_named(figure, "keys")
    n = len(trace.tokens)
    assert queries.type == "scatter3d" and len(values(queries.x)) == len(values(keys.x)) == n > 2
    assert queries.hovertext[0].startswith("query 0:")
    query = int(
        at.query_params["enc_query"][0]
        if isinstance(at.query_params["enc_query"], list)
        else at.query_params["enc_query"]
    )
    expected = qk_space(trace, 0, 0, query, "encoder", dims=3)
    np.testing.assert_allclose(points(queries, 3), expected.projection.queries, atol=1e-5)


# ---- cross-attention: the decoder's queries against the encoder's keys ----------------------------------------------
def _cross(step: int) -> None:
    import numpy as np

    from tformer_app import attention_panel as panel
    from tformer_app import results
    from tformer_app.page import run_page
    from tformer_views import seq2seq as sv

    def draw(url):
        key = results.translation("translator", sv.DEFAULT_SOURCES["translator"], 40)
        translation = results.result(key)
        cross = panel.Controls(
            stack="cross",
            prefix="x_",
            layer=1,
            head=2,
            hide=False,
            views=("qk",),
            query=step,
            shown=np.arange(translation.n_steps + 1),
            window=slice(None),
        )
        panel.draw(panel.Shown(key, translation.trace), url, cross, label="cross-attention, ")

    run_page("Cross-attention", "", "s2s", draw)


def test_cross_attention_projects_decoder_queries_with_encoder_keys():
    at = AppTest.from_function(_cross, args=(3,), default_timeout=120).run()
    no_exception(at)
    (figure,) = figures(at)
    translation = results.result(results.translation("translator", sv.DEFAULT_SOURCES["translator"], 40))
    trace = translation.trace
    n_target, n_source = (len(t) for t in trace.tokens_for("cross"))
    expected = qk_space(trace, 1, 2, 3, stack="cross", query_positions=np.arange(translation.n_steps + 1))
    queries, keys = trace_named(figure, "queries"), trace_named(figure, "keys")
    assert len(values(queries.x)) == min(n_target, translation.n_steps + 1) and len(values(keys.x)) == n_source
    np.testing.assert_allclose(points(keys, 2), expected.projection.keys, atol=1e-5)
    assert queries.hovertext[0].startswith("target 0:") and keys.hovertext[0].startswith("source 0:")
    row = trace.attention(1, 2, "cross")[3]
    lines = [t.name for t in figure.data if t.mode == "lines"]
    assert lines == [f"weight → key {k}" for k in np.argsort(-row)[:3]]
    assert any(s.value == "Query–key space · cross-attention, layer 1, head 2" for s in at.subheader)
    (caption,) = [c for c in messages(at, "caption") if c.startswith("PCA:")]
    assert f"{len(values(queries.x))} queries (target positions) and {len(values(keys.x))} keys (source" in caption


def test_the_encoder_decoder_pages_cross_attention_offers_the_query_key_space_on_request():
    at = run("encoder_decoder")
    no_exception(at)
    assert not any("cross-attention" in s.value and "Query–key" in s.value for s in at.subheader)
    at = run("encoder_decoder", x_qk="1")
    no_exception(at)
    [heading] = [s.value for s in at.subheader if s.value.startswith("Query–key space · cross-attention")]
    [figure] = figures(at)
    queries, keys = figure.data[0], figure.data[1]
    # The decoder's queries (one per target position so far) against the encoder's keys (one per source token).
    assert len(values(queries.x)) != 0 and len(values(keys.x)) != 0
    assert heading.endswith("head 0")
