"""Model lists offer what the page can show and say what this server cannot reach; a notice is said once.

A server's model folder holds checkpoints of every kind: each page lists only those it can show (a ViT is not
offered on the decoder list). With the hub switched off (as in every test), a suggested hub id that is not in the
hub's local cache is offered marked as needing the internet. The Vision page's notice that the hub's DeiT-Tiny
cannot be had is said on the first visit of a session, not on every one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import messages, no_exception, run
from tests.core.hf_helpers import DEIT

APP = Path(__file__).resolve().parents[2] / "app.py"
KINDS = {"tiny-vit": "vit", "tiny-gpt2": "gpt2", "tiny-llama": "llama", "tiny-bert": "bert", "tiny-marian": "marian"}


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    """TFORMER_MODEL_DIRS -> a folder with a checkpoint's config.json of each kind (listing reads only that), and
    an empty hub cache (whatever this machine's holds)."""
    root = tmp_path / "models"
    for name, model_type in KINDS.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps({"model_type": model_type}))
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(root))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return root


def listed(at, key: str) -> list[str]:
    return list(at.selectbox(key=key).options)


def local(options: list[str], root: Path) -> set[str]:
    return {o.removeprefix(f"{root.name}/") for o in options if o.startswith(f"{root.name}/")}


def test_each_page_lists_the_models_it_can_show_and_marks_what_needs_the_internet(model_dir):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    encoder = listed(run("text_attention", views="heatmap"), "text.model_choice")
    assert local(encoder, model_dir) == {"tiny-bert"}
    assert encoder[:2] == ["minilm", "bert-base-uncased (needs the internet)"]  # bundled: offline
    decoder = listed(run("text_attention", arch="decoder", views="heatmap"), "text.model_choice")
    assert local(decoder, model_dir) == {"tiny-gpt2", "tiny-llama"} and decoder[:2] == [
        "smollm2",
        "gpt2 (needs the internet)",
    ]
    seq2seq = listed(run("encoder_decoder"), "s2s.model_choice")
    assert local(seq2seq, model_dir) == {"tiny-marian"} and seq2seq[0] == "translator"
    vision = listed(run("vision", model="vit-tiny"), "vit.model_choice")
    assert local(vision, model_dir) == {"tiny-vit"}
    assert "facebook/deit-tiny-patch16-224 (needs the internet)" in vision and "vit-tiny" in vision
    block = listed(run("inside_block"), "block.model_choice")
    assert local(block, model_dir) == set(KINDS)  # the block page shows every kind


def test_the_notice_that_the_hubs_deit_cannot_be_had_is_said_once_a_session(monkeypatch):
    if DEIT.is_dir():
        monkeypatch.setenv("TFORMER_MODEL_DIRS", str(DEIT.parent))
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.switch_page("app_pages/vision.py").run()
    no_exception(at)
    notices = [m for m in messages(at, "info") if "cannot be had" in m]
    assert len(notices) == 1 and "facebook/deit-tiny-patch16-224" in notices[0]
    at.run()  # the same visit (a click): the notice stays
    assert [m for m in messages(at, "info") if "cannot be had" in m] == notices
    at.switch_page("app_pages/home.py").run()
    at.switch_page("app_pages/vision.py").run()  # a later visit: the list marks the hub id, no notice
    no_exception(at)
    assert not [m for m in messages(at, "info") if "cannot be had" in m]
    assert any(o.endswith("(needs the internet)") for o in listed(at, "vit.model_choice"))


def test_a_failed_load_that_could_not_reach_the_hub_marks_the_hub_unreachable(monkeypatch):
    """After a load failed because the hub could not be reached, the model lists know it (and mark hub models);
    the failures are remembered as records with their message and time, which this reads."""
    import tformer_core as tc
    from tformer_app import models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_failures", type(models._failures)())
    assert not models.hub_unreachable()

    def unreachable(source, progress=None):
        raise tc.CheckpointError(f"the Hugging Face hub cannot be reached (ConnectError) and {source} is not cached")

    monkeypatch.setattr(tc, "load_model", unreachable)
    with pytest.raises(tc.CheckpointError, match=r"^the Hugging Face hub cannot be reached \(ConnectError\)"):
        models.cached_model("someone/not-cached")
    assert models.hub_unreachable()
