"""The pages of issue 26 through AppTest: Attention before Transformers, Inductive bias, Masked autoencoder,
DETR and Train (its queue, its session models), with the numbers each shows checked against the core. The MAE
and DETR pages open offline on the bundled mae-tiny and detr-tiny (issue 36)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app.pages import PAGES, charts, messages, no_exception, run
from tests.core.hf_helpers import DEIT
from tests.core.test_mae_detr import save_tiny_detr, save_tiny_mae
from tformer_app import training
from tformer_app.presenter import PRESENT
from tformer_core import bundled
from tformer_train import classroom
from tformer_views import detection as dv
from tformer_views import mae as mv
from tformer_views import samples

needs_deit = pytest.mark.skipif(
    not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)"
)
PREPROCESSOR = {
    "do_resize": True,
    "size": {"height": 16, "width": 16},
    "do_normalize": True,
    "do_rescale": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225],
}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A model folder with a tiny random MAE and DETR, saved by transformers as a user's checkpoint would be."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_mae(root / "tiny-mae")
    (root / "tiny-mae" / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    save_tiny_detr(root / "tiny-detr")  # with a preprocessor for pictures of 96 to 160 pixels
    return root


# ---- Attention before Transformers ---------------------------------------------------------------------
def test_before_transformers_shows_scores_pooling_and_the_rnn_alignment():
    at = run("before_transformers", timeout=120)
    no_exception(at)
    scores = next(d.value for d in at.dataframe if d.value.index.name == "function")
    assert scores.loc["dot", "score"] == pytest.approx(1.0) and scores.loc["bilinear", "score"] == pytest.approx(0.5)
    att = tc.load_model("sentiment-attention", device="cpu")
    sentence = "a gorgeous witty film but the plot is thin and the ending falls flat"
    expected = att.trace(sentence)
    label, p = expected.predictions(1)[0]
    assert at.metric[0].value == f"{label} ({p:.0%})"
    bars = charts(at)["α over the words (dashed: mean pooling's 1/n)"][0]
    np.testing.assert_allclose(bars["alpha"], expected["pool.weights"], rtol=1e-5)
    rnn = tc.load_model("rnn-additive", device="cpu").trace("the big dog chases a small cat near the river")
    cells = charts(at)["RNN α (additive (Bahdanau))"][0].pivot(index="row", columns="col", values="value")
    np.testing.assert_allclose(cells.to_numpy(), rnn["attn.weights"], atol=1e-5)
    assert any("Transformer cross-attention, layer 1" in t for t in charts(at))


def test_before_transformers_bad_input_gets_messages():
    at = run("before_transformers", a="1, x", sentence="!!! ???", source="", timeout=120)
    no_exception(at)
    errors = " ".join(messages(at, "error"))
    assert "numbers separated by commas" in errors and "no words" in errors and "empty" in errors


# ---- Inductive bias --------------------------------------------------------------------------------------
@needs_deit
@pytest.mark.parametrize("k, moved", [(16, True), (5, False)])
def test_shifting_by_whole_patches_moves_the_embeddings_and_still_changes_the_prediction(monkeypatch, k, moved):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(DEIT.parent))
    at = run("inductive_bias", k=str(k), timeout=180)
    no_exception(at)
    if moved:
        text = " ".join(messages(at, "success"))
        assert "every patch embedding is the same vector" in text
        error = float(text.split("Largest difference ")[1].split(" ")[0])
        assert error < 1e-4
    else:
        assert "not a multiple of 16" in " ".join(messages(at, "warning"))
    table = next(d.value for d in at.dataframe if d.value.index.name == "class")
    assert not np.allclose(table["original"], table["shifted"], atol=1e-4)  # learned positions: the output changes
    sweep = next(d.value for d in at.dataframe if d.value.index.name == "shift (px)")
    whole = sweep[sweep["whole patches"]]
    assert list(whole.index) == [0, 16, 32] and (whole["embedding error"] < 1e-4).all()
    assert (sweep[~sweep["whole patches"]]["embedding error"] > 0.01).all()


# ---- MAE and DETR ----------------------------------------------------------------------------------------
def test_mae_opens_offline_on_the_bundled_model_and_rebuilds_the_sample_shape():
    at = run("mae", timeout=120)
    no_exception(at)
    assert not at.error and not at.warning
    assert at.query_params["model"] == "mae-tiny" and at.query_params["sample"] == "shapes: circle"
    assert any("48 of 64 patches masked (75%); the encoder sees 16" in m.value for m in at.subheader)
    assert len(at.get("image")) == 5  # the picture, what the encoder sees, two rebuilds, the error
    caption = next(c for c in messages(at, "caption") if "Mean squared error over the masked patches" in c)
    model = tc.load_model("mae-tiny", device="cpu")
    result = mv.analyse(model, samples.samples()["shapes: circle"], "circle.png", seed=0)
    assert f"**{np.nanmean(mv.patch_errors(result)):.3f}** (normalised pixels" in caption
    figures = bundled.recorded("mae-tiny")["evaluation"]["masked"]
    quality = next(c for c in messages(at, "caption") if "trained by this project" in c)
    assert f"{figures['mean_colour_ratio']:.1f} times smaller" in quality
    assert any("mae-tiny: a masked autoencoder" in m for m in messages(at, "markdown"))  # the model card


def test_mae_with_a_hub_model_that_cannot_be_had_says_what_it_needs_and_still_masks_the_picture():
    at = run("mae", model="facebook/vit-mae-base", timeout=120)  # tests run with HF_HUB_OFFLINE=1
    no_exception(at)
    assert any("Could not load" in e and "facebook/vit-mae-base" in e for e in messages(at, "error"))
    assert any("needs a masked autoencoder" in m for m in messages(at, "info"))
    assert any("147 of 196 patches masked" in m.value for m in at.subheader)
    assert len(at.get("image")) >= 1


def test_mae_with_a_checkpoint_shows_the_reconstruction_and_its_error(monkeypatch, model_folder):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(model_folder))
    at = run("mae", model=f"{model_folder.name}/tiny-mae", seed="3", timeout=120)
    no_exception(at)
    assert any("12 of 16 patches masked" in m.value for m in at.subheader)
    caption = next(c.value for c in at.caption if "Mean squared error over the masked patches" in c.value)
    assert "per-patch normalised" in caption  # the tiny model was saved with norm_pix_loss
    assert not any("trained by this project" in c for c in messages(at, "caption"))  # a user's model: no card


def test_detr_opens_offline_on_the_bundled_model_and_finds_the_sample_scenes_shapes():
    at = run("detr", timeout=120)
    no_exception(at)
    assert not at.error and not at.warning
    assert at.query_params["model"] == "detr-tiny" and at.query_params["sample"] == "scene: 3 shapes"
    model = tc.load_model("detr-tiny", device="cpu")
    found = dv.detections(dv.analyse(model, samples.samples()["scene: 3 shapes"], "scene.png"), 0.7)
    assert len(found) == 3
    listed = ", ".join(f"q{d.query} {d.label} ({d.probability:.2f})" for d in found)
    assert any(c == f"3 of 10 object queries found an object: {listed}" for c in messages(at, "caption"))
    matrix = charts(at)["self-attention between these queries, decoder layer 1"][0]
    rows = matrix.pivot(index="row", columns="col", values="value").to_numpy()
    assert rows.shape == (3, 3)
    np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=1e-5)
    figures = bundled.recorded("detr-tiny")["evaluation"]
    quality = next(c for c in messages(at, "caption") if "trained by this project" in c)
    assert f"{figures['precision']:.1%} of its detections" in quality and f"{figures['recall']:.1%}" in quality


def test_detr_with_a_hub_model_that_cannot_be_had_says_what_it_needs_and_with_a_checkpoint_shows_queries(
    monkeypatch, model_folder
):
    at = run("detr", model="facebook/detr-resnet-50", timeout=120)  # tests run with HF_HUB_OFFLINE=1
    no_exception(at)
    assert any("Could not load" in e and "facebook/detr-resnet-50" in e for e in messages(at, "error"))
    assert any("needs a DETR model" in m for m in messages(at, "info"))
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(model_folder))
    at = run("detr", model=f"{model_folder.name}/tiny-detr", threshold="0.05", query="2", timeout=120)
    no_exception(at)
    matrix = charts(at)["self-attention between these queries, decoder layer 1"][0]
    rows = matrix.pivot(index="row", columns="col", values="value").to_numpy()
    np.testing.assert_allclose(rows.sum(-1), 1.0, rtol=1e-5)
    assert any("object queries found an object" in c.value for c in at.caption)


@pytest.mark.parametrize(
    "page, settings, idea, pictures",
    [
        ("mae", "Model, picture and masking seed", "The encoder sees only a quarter of the patches", 4),
        ("detr", "Model, picture, threshold", "Each object query ends as one box and one class", 2),
    ],
)
def test_in_presenter_mode_the_settings_fold_away_and_the_key_idea_leads(page, settings, idea, pictures):
    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=120)
    at.session_state[PRESENT] = True
    at.run()
    no_exception(at)
    box = at.get("popover")[0]  # the top line's closed Settings: the first screen is the view's
    assert box.proto.popover.label == "Settings" and box.proto.popover.help.startswith(settings)
    assert any(w.key == f"{page}.model_choice" for w in box.selectbox)
    assert any(m.startswith(idea) for m in messages(at, "markdown"))
    assert len(at.get("image")) == pictures  # in one row (the model card's expander holds none)


# ---- Train ---------------------------------------------------------------------------------------------
def _wait(sid: str, limit_s: float = 240) -> training.Ticket:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        ticket = training.QUEUE.ticket(sid)
        ticket.seen()
        if not ticket.active:
            return ticket
        time.sleep(0.2)
    raise AssertionError("the training did not end in time")


def test_train_a_model_then_open_it_in_the_text_page_of_this_session_only():
    at = AppTest.from_file(str(PAGES / "train.py"), default_timeout=120)
    for k, v in {"layers": "1", "heads": "2", "d": "32", "epochs_text": "1"}.items():
        at.query_params[k] = v
    at.run()
    no_exception(at)
    at.button(key="train.start").click().run()
    sid = at.session_state["_tformer.session_id"]
    ticket = _wait(sid)
    assert ticket.state == "done", ticket.error
    at.run()
    no_exception(at)
    assert at.metric[0].value == f"{ticket.result.test_accuracy:.1%}"
    name = next(n for n in at.session_state["_tformer.session_models"])
    assert name.startswith("session:text-classifier-")
    at.switch_page("text_attention.py")
    at.session_state["text.model"] = name
    at.session_state["text.model_choice"] = name
    at.run()
    no_exception(at)
    assert not messages(at, "error")
    other = run("text_attention", model=name, timeout=120)  # another session, with the link
    assert any("private to the session that trained it" in m for m in messages(other, "error"))


def test_the_queue_runs_one_training_at_a_time_in_order_and_can_cancel(monkeypatch):
    release = {i: __import__("threading").Event() for i in range(3)}
    started = []

    def fake_train(job, report, cancelled):
        started.append(job.seed)
        while not release[job.seed].wait(0.01):
            if cancelled():
                raise classroom.Cancelled()
        return classroom.Result(job, None, 0.5, 1)

    monkeypatch.setattr(classroom, "train", fake_train)
    queue = training.TrainingQueue(max_waiting=2, stale_after_s=60)
    deadline = time.monotonic() + 10
    tickets = [queue.submit("s0", classroom.TextJob(seed=0))]
    while started != [0] and time.monotonic() < deadline:
        time.sleep(0.01)
    tickets += [queue.submit(f"s{i}", classroom.TextJob(seed=i)) for i in (1, 2)]
    with pytest.raises(training.QueueFull, match="waiting already"):
        queue.submit("s9", classroom.TextJob())
    with pytest.raises(training.QueueFull, match="still running"):
        queue.submit("s1", classroom.TextJob())
    assert [queue.position(t) for t in tickets] == [0, 1, 2]
    queue.cancel(tickets[1])  # waiting: dropped at once
    assert tickets[1].state == "cancelled" and queue.position(tickets[2]) == 1
    release[0].set()
    while tickets[2].state != "running" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tickets[0].state == "done" and started == [0, 2]
    queue.cancel(tickets[2])  # running: stops at its next check
    while tickets[2].active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tickets[2].state == "cancelled"
