"""The Encoder-decoder page through AppTest: the bundled translator offline, a tiny T5 as a local folder,
the step slider and play button, teacher forcing, bad input, and no forward pass for a view change."""

import json
import os
import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app.pages import charts, messages, no_exception, run, widget
from tests.app.passes import PassCounter
from tests.core.hf_helpers import save_tiny_t5
from tformer_app import models
from tformer_train import data as td
from tformer_views import seq2seq as sv

DEFAULT = sv.DEFAULT_SOURCES["translator"]


def page(**params) -> AppTest:
    return run("encoder_decoder", **params)


def cells(at, title):
    frame = charts(at)[title][0]
    return frame.pivot(index="row", columns="col", values="value").to_numpy()


@pytest.fixture(scope="module")
def translator():
    return tc.load_model("translator", device="cpu")


@pytest.mark.parametrize("pair", td.sample_pairs(3, 9_001, "held-out"), ids=lambda p: p.source_text[:30])
def test_held_out_sentences_are_translated_as_the_reference(pair):
    at = page(text=pair.source_text)
    no_exception(at)
    assert at.code[0].value == pair.target_text


def test_default_page_shows_the_step_the_alignment_and_the_encoder(translator):
    at = page()
    no_exception(at)
    expected = sv.translate(translator, DEFAULT, 40)
    assert at.code[0].value == expected.output_text
    titles = set(charts(at))
    assert {
        "masked self-attention, layer 1, head 0",
        "cross-attention, layer 1, head 0",
        "cross-attention, layer 1, mean of the heads",
        "encoder layer 0, head 0: weights (softmax)",
    } <= titles
    # Step 1: the decoder has read <bos>; the cross-attention rows of every layer and head are the model's.
    step = sv.at_step(expected, 0)
    rows = cells(at, "cross-attention of the newest position (<bos>)")
    np.testing.assert_allclose(rows, step.cross_rows().reshape(8, -1), atol=1e-5)
    np.testing.assert_allclose(
        cells(at, "cross-attention, layer 1, head 0"), sv.alignment(expected, 1, 0).weights, atol=1e-5
    )
    top = next(d.value for d in at.dataframe if list(d.value.columns) == ["token", "probability"])
    assert top["token"].iloc[0] == expected.produced[0]
    assert at.query_params["model"] == "translator" and at.query_params["step"] == "1"


def test_step_slider_and_head_switch_run_no_model(translator):
    at = page()
    no_exception(at)
    with PassCounter(models.cached_model("translator")) as counter:
        expected = sv.translate(translator, DEFAULT, 40)
        at.slider(key="s2s.step").set_value(5).run()
        no_exception(at)
        self_attention = cells(at, "masked self-attention, layer 1, head 0")
        assert self_attention.shape == (5, 5) and np.isnan(self_attention[np.triu_indices(5, 1)]).all()  # masked
        np.testing.assert_allclose(
            np.nan_to_num(self_attention), sv.at_step(expected, 4).self_attention(1, 0).weights, atol=1e-5
        )
        assert any(f"Step 5 of {expected.n_steps}" in m for m in messages(at, "markdown"))
        widget(at, "s2s.head").set_value(3)
        widget(at, "s2s.layer").set_value(0)
        at.run()
        no_exception(at)
        assert "masked self-attention, layer 0, head 3" in charts(at)
        widget(at, "s2s.enc_head").set_value(2).run()
        no_exception(at)
        assert counter.count == 0  # the cached translation was only read
        assert (at.query_params["step"], at.query_params["head"], at.query_params["enc_head"]) == ("5", "3", "2")
        at.text_input(key="s2s.text").input("a bird sleeps").run()  # a second sentence: one new translation
        no_exception(at)
        assert at.code[0].value == "piku na ga dormas"
        assert counter.count > 0


def _rerun(at: AppTest, timer_due: bool) -> None:
    """Rerun the page as the play timer would (its interval has passed) or as another widget would (it has not).

    The page decides from the time of its last tick, kept in the session; setting that time stands in for
    waiting, so the test waits for nothing.
    """
    at.session_state["s2s.played_at"] = time.monotonic() - (10.0 if timer_due else 0.0)
    at.run()
    no_exception(at)


def test_play_advances_one_step_per_tick_and_stops_at_the_end():
    at = page(text="a bird sleeps")
    no_exception(at)
    n = 5  # piku na ga dormas <eos>
    at.button(key="s2s.play").click().run()
    assert at.session_state["s2s.playing"] and at.slider(key="s2s.step").value == 1
    for expected in range(2, n + 1):
        _rerun(at, timer_due=False)  # a rerun between ticks does not move the step
        assert at.slider(key="s2s.step").value == expected - 1
        _rerun(at, timer_due=True)
        assert at.slider(key="s2s.step").value == expected
    _rerun(at, timer_due=True)
    assert not at.session_state["s2s.playing"] and at.slider(key="s2s.step").value == n


def test_teacher_forcing_shows_the_users_target(translator):
    target = "varo gros ta ga mise mik na wo kasas"
    at = page(target=target, text="the big dog chases a small cat")
    no_exception(at)
    assert any("Your target" in s for s in messages(at, "subheader"))
    assert at.code[0].value == target
    forced = sv.teacher_force(translator, "the big dog chases a small cat", target)
    agree = sum(sv.at_step(forced, t).predictions(1)[0][0] == p for t, p in enumerate(forced.produced))
    assert any(f"agrees with it at {agree} of {forced.n_steps} steps" in c for c in messages(at, "caption"))
    np.testing.assert_allclose(
        cells(at, "cross-attention, layer 1, mean of the heads"), sv.alignment(forced, 1, None).weights, atol=1e-5
    )


def test_unknown_words_are_shown_as_unk():
    at = page(text="the big dog chases a purple cat")
    no_exception(at)
    assert any("purple" in w.value and r"\<unk\>" in w.value for w in at.warning)  # escaped: shown as text
    assert "<unk>" in at.code[0].value
    assert any(r"\<unk\>" in c.value for c in at.caption if c.value.startswith("Source tokens"))  # escaped


@pytest.mark.parametrize("text, message", [("", "empty"), (" ".join(["the dog"] * 20), "at most 32")])
def test_empty_and_over_long_sources_get_a_message(text, message):
    at = page(text=text)
    no_exception(at)
    assert any(message in e for e in messages(at, "error"))
    assert not at.code


def test_a_model_of_another_kind_points_to_its_page():
    at = page(model="minilm")
    no_exception(at)
    assert any("not an encoder-decoder" in w and "Text attention" in w for w in messages(at, "warning"))


def test_a_local_t5_folder_translates_and_forces(tmp_path):
    root = tmp_path / "models"
    folder = save_tiny_t5(root / "tiny-t5")
    before = os.environ.get("TFORMER_MODEL_DIRS")
    os.environ["TFORMER_MODEL_DIRS"] = str(root)
    try:
        at = page(model=str(folder), text="The house is wonderful.", max="6", enc_views="why")
        no_exception(at)
        model = tc.load_model(str(folder), device="cpu", model_dirs=[root])
        assert at.code[0].value == sv.translate(model, "The house is wonderful.", 6).output_text
        at.text_input(key="s2s.target").input("Das Haus ist wunderbar.").run()
        no_exception(at)
        assert at.code[0].value == "Das Haus ist wunderbar."
        # T5 does not scale by 1/sqrt(d_k); its encoder adds a relative position bias, its cross-attention none.
        scores = [x.value.strip("$\n") for x in at.get("latex") if x.value.strip("$\n").startswith("s_{")]
        assert len(scores) == 2 and not any("sqrt" in x for x in scores)
        cross, encoder = scores
        assert "b_{" not in cross and "b_{" in encoder
    finally:
        if before is None:
            os.environ.pop("TFORMER_MODEL_DIRS", None)
        else:
            os.environ["TFORMER_MODEL_DIRS"] = before


def test_the_url_restores_the_view():
    at = page(text="a bird sleeps", step="3", layer="0", head="2", enc_views="why", enc_query="1")
    no_exception(at)
    assert at.slider(key="s2s.step").value == 3
    assert (widget(at, "s2s.layer").value, widget(at, "s2s.head").value) == (0, 2)
    assert any("Step 3 of 5" in m for m in messages(at, "markdown"))
    assert any("Why this weight · encoder layer 0" in s for s in messages(at, "subheader"))


def test_masked_cells_are_grey_with_their_weight_of_zero():
    """They were white with "-inf" written in them: Vega-Lite dropped the null cells, on a weights matrix."""
    at = page(step="6", layer="1", head="0")
    no_exception(at)
    spec = next(
        json.loads(e.proto.spec)
        for e in at.get("vega_lite_chart")
        if "masked self-attention" in str(json.loads(e.proto.spec).get("title"))
    )
    assert spec["layer"][0]["mark"] == {"type": "rect", "invalid": "show"}  # null cells drawn (grey), not dropped
    data = charts(at)["masked self-attention, layer 1, head 0"][0]
    upper = (data["col"] > data["row"]).to_numpy()
    assert upper.any() and data.loc[upper, "value"].isna().all() and (data.loc[upper, "label"] == "0").all()
    assert any("grey cells above the diagonal are masked" in c for c in messages(at, "caption"))
