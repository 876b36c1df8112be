"""Text attention's 'How information flows to the prediction': the graph the page sends is the core's, the threshold
prunes it, a click on an edge names its head."""

import numpy as np
import pytest

import tformer_core as tc
from tests.app.pages import charts, messages, no_exception, run, widget
from tests.app.passes import PassCounter
from tformer_app import flow_panel, models
from tformer_core.flow import flow_graph, information_flow
from tformer_core.trace import lean
from tformer_views import text as tv

TITLE = "Routes to the prediction at"


def flow_chart_frames(at):
    found = [frames for title, frames in charts(at).items() if title.startswith(TITLE)]
    assert len(found) == 1, list(charts(at))
    return found[0]


def attention_edges(frames):
    """The frame of attention edges as the browser gets it (the one whose rows all have kind 'attention')."""
    return next(f for f in frames if "kind" in f and len(f) and (f["kind"] == "attention").all())


def test_the_page_draws_the_cores_graph_for_minilm_and_the_threshold_prunes_it():
    at = run("text_attention", flow_threshold="0.05")
    no_exception(at)
    assert "How information flows to the prediction" in [h.value for h in at.subheader]
    assert not [t for t in charts(at) if t.startswith(TITLE)]  # folded: a new sentence costs the page one pass
    with PassCounter(models.cached_model("minilm")) as counter:
        at.toggle(key="text.flow").set_value(True).run()
        no_exception(at)
        assert counter.count == 1  # the flow's own pass, the page's trace reused
    model = tc.load_model("minilm", device="cpu")
    expected = flow_graph(information_flow(model, model.trace(tv.DEFAULT_SENTENCE, keep=lean)), 0.05, 0)
    drawn = attention_edges(flow_chart_frames(at))
    want = sorted((e.layer, e.source, e.target, e.head) for e in expected.edges if e.kind == "attention")
    got = sorted(zip(drawn["layer"], drawn["source"], drawn["target"], drawn["head"], strict=True))
    assert got == want and len(want) > 0
    np.testing.assert_allclose(
        sorted(drawn["share"]), sorted(e.share for e in expected.edges if e.kind == "attention"), atol=1e-5
    )

    at.slider(key="text.flow_threshold").set_value(0.3).run()
    no_exception(at)
    fewer = [f for f in flow_chart_frames(at) if "kind" in f]
    assert sum(len(f) for f in fewer) < len(expected.edges)
    assert at.query_params["flow_threshold"] == "0.3"  # in the link


def test_routes_to_another_position_and_a_long_input_says_why_there_is_no_graph():
    at = run("text_attention", flow="1", flow_to="3")
    no_exception(at)
    drawn = attention_edges(flow_chart_frames(at))
    assert set(drawn["target"]) and max(drawn.loc[drawn["layer"] == drawn["layer"].max(), "target"]) == 3
    long_text = " ".join(["word"] * (flow_panel.MAX_TOKENS + 5))
    at = run("text_attention", flow="1", text=long_text)
    no_exception(at)
    assert any(f"up to {flow_panel.MAX_TOKENS} tokens" in m for m in messages(at, "caption"))


def test_a_click_on_an_attention_edge_names_its_layer_and_head():
    assert flow_panel.clicked_edge({"selection": {"edge": [{"layer": 4, "head": 7}]}}) == (4, 7)
    assert flow_panel.clicked_edge({"selection": {"edge": [{"layer": 4, "head": -1}]}}) is None
    assert flow_panel.clicked_edge({"selection": {"edge": []}}) is None and flow_panel.clicked_edge(None) is None


def test_smollm2_routes_lead_to_its_next_token_printed_above_the_graph(smollm2_folder):
    at = run("text_attention", flow="1", arch="decoder", text="The capital of France is")
    no_exception(at)
    frames = flow_chart_frames(at)
    top = next(f for f in frames if "text" in f and len(f) == 1)
    assert top["text"][0] == "→ ␣Paris"  # SmolLM2's greedy next token
    drawn = attention_edges(frames)
    assert (drawn["source"] <= drawn["target"]).all()  # causal: every edge reads an earlier (or the same) token
    assert (drawn["head"].between(0, 8)).all()
    # A longer sentence: the routes follow its own last position (its prediction), not the old one's index.
    widget(at, "text.text").input("The capital of France is Paris and the capital of Italy is").run()
    no_exception(at)
    drawn = attention_edges(flow_chart_frames(at))
    assert set(drawn.loc[drawn["layer"] == drawn["layer"].max(), "target"]) == {11}


@pytest.mark.slow  # smollm2's routes and its study of every head: seconds
def test_does_this_head_matter_shows_the_routes_beside_the_ablations_and_outlines_the_chosen_head(smollm2_folder):
    at = run("head_matters", timeout=300, flow="1", layer="23", head="4")
    no_exception(at)
    drawn = attention_edges(flow_chart_frames(at))
    at_23 = drawn[drawn["layer"] == 23]
    # The routes to ' Paris' pass through layer 23's head 4 (' France' -> ' is'), the head whose ablation costs most.
    assert list(zip(at_23["source"], at_23["target"], at_23["head"], strict=True)) == [(3, 4, 4)]
    outlined = [f for f in flow_chart_frames(at) if "kind" in f and len(f) == 1 and f["layer"][0] == 23]
    assert outlined  # the chosen head's edge, dashed red


def test_a_flow_the_server_refuses_is_said_on_the_page_and_the_page_keeps_working(monkeypatch, caplog):
    def refused(model, text, pair):
        raise tc.InputError("this text's flow is larger than the server allows")

    monkeypatch.setattr(flow_panel, "_flow", refused)
    at = run("text_attention", flow="1", text="A sentence no other test of the flow reads.")
    no_exception(at)
    assert [e.value for e in at.error] == ["Flow: this text's flow is larger than the server allows"]
    assert not [t for t in charts(at) if t.startswith(TITLE)]
    assert any("larger than the server allows" in r.getMessage() for r in caplog.records)  # logged with its cause
