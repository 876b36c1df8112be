"""The Train page's results through AppTest, with a model trained here in seconds (a few batches): the attention
snapshot sized to its column, the loss and the accuracy on an axis each, presenter mode's first screen; and a
trained digits ViT opened in the Vision page on a digit of its own data, its box saying it was trained here."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import PAGES, no_exception
from tformer_app import presenter
from tformer_train import classroom
from tformer_views import samples

NAMES = {"text": "session:text-classifier-abc123", "image": "session:digits-vit-abc123"}


@pytest.fixture(scope="module")
def trained() -> dict[str, classroom.Result]:
    """A text classifier and a digits ViT, each trained on a few batches for two epochs."""
    jobs = {
        "text": classroom.TextJob(n_layers=1, n_heads=2, d_model=32, epochs=2, limit=128),
        "image": classroom.ImageJob(n_layers=1, n_heads=2, d_model=32, epochs=2, limit=128),
    }
    return {kind: classroom.train(job) for kind, job in jobs.items()}


def _train_page(results: dict[str, classroom.Result], room: int, presenting: bool) -> AppTest:
    at = AppTest.from_file(str(PAGES / "train.py"), default_timeout=120)
    at.session_state["train.results"] = {kind: (result, NAMES[kind]) for kind, result in results.items()}
    at.session_state[presenter.ROOM] = room
    at.session_state[presenter.PRESENT] = presenting
    return at.run()


def _specs(at: AppTest) -> list[tuple[str, dict]]:
    """Every chart's (title, spec), in the page's order."""
    specs = [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]
    return [(str(spec.get("title", "")), spec) for spec in specs]


@pytest.mark.parametrize(("room", "presenting"), [(820, False), (900, False), (1192, True), (1832, True)])
def test_the_trained_models_attention_fits_its_column_and_loss_and_accuracy_have_an_axis_each(
    trained, room, presenting
):
    """The snapshot heatmap (17 tokens of the fixed sentence; the digit's 4 x 4 patches) within its half of the main
    column, labels and legend included, at the size it was built for (presenter mode does not enlarge it again);
    the curves: the loss on the left axis, the accuracy on the right, each with its scale and title."""
    at = _train_page(trained, room, presenting)
    no_exception(at)
    specs = _specs(at)
    snapshots = [s for title, s in specs if title.startswith("epoch 2, layer 0, head 0")]
    assert len(snapshots) == 2  # the text classifier's and the ViT's
    for spec in snapshots:
        assert spec["width"] + presenter.HEATMAP_MARGIN_PX <= room / 2
        assert spec["usermeta"] == {"scale": presenter.FONT_SCALE if presenting else 1.0}
    curves = [s for title, s in specs if title == "after each epoch"]
    assert len(curves) == 2
    for spec in curves:
        assert spec["resolve"] == {"scale": {"y": "independent"}}
        assert [layer["encoding"]["y"]["title"] for layer in spec["layer"]] == ["training loss", "validation accuracy"]


def test_in_presenter_mode_the_settings_are_folded_and_the_result_is_one_line(trained):
    at = _train_page({"text": trained["text"]}, 1192, True)
    no_exception(at)
    # The top line's one Settings popover holds what to train and, once trained, the epoch, layer and head.
    settings = next(b for b in at.get("popover") if b.proto.popover.help == "What to train, its sizes and seed")
    assert any(getattr(w, "key", None) == "train.kind" for w in settings)
    assert any(m.value.startswith("Watch it learn") for m in at.markdown)  # the key idea
    assert not at.metric and any("right on 1035 sentences never trained on" in m.value for m in at.markdown)
    assert {getattr(w, "key", None) for w in settings} >= {"train.text.epoch", "train.text.layer", "train.text.head"}
    assert at.button(key="train.text.keys.Left")  # ← → the epochs
    at.button(key="train.text.keys.Left").click().run()
    assert at.session_state["train.text.epoch"] == 1
    assert any(title.startswith("epoch 1, layer 0, head 0") for title, _ in _specs(at))


def test_a_trained_digits_vit_opens_in_the_vision_page_on_a_digit_and_says_it_was_trained_here(trained):
    model = trained["image"].model
    model.source = NAMES["image"]  # as session_models.store names it
    at = AppTest.from_file(str(PAGES / "vision.py"), default_timeout=120)
    at.session_state["_tformer.session_models"] = {NAMES["image"]: model}
    at.session_state["vit.model"] = at.session_state["vit.model_choice"] = NAMES["image"]
    at.run()
    no_exception(at)
    box = next(s for s in at.selectbox if s.key == "vit.model_choice")
    assert f"{NAMES['image']} (trained in this session)" in box.options
    assert not any("needs the internet" in option and "session:" in option for option in box.options)
    sample = next(s for s in at.selectbox if s.key == "vit.sample")
    assert sample.value == samples.first_digit() and sample.options[:10] == list(samples.digit_samples())
    assert not at.error
