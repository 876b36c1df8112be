"""Broken model folders, through the pages: a clear message naming the file and the problem, no traceback, no
server path, and the session keeps working (another model loads on the next run).

Found in the live app: a corrupt model.safetensors, a pickled pytorch_model.bin, a config.json with missing
keys or "hidden_size": "abc" each showed a traceback with server paths; a config declaring a huge model with an
8-byte weights file allocated 5.45 GB before failing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as T

from tests.app.pages import messages, no_exception, run
from tformer_app import models
from tformer_core.checkpoints.sources import minilm_folder


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("template") / "tiny-bert"
    torch.manual_seed(0)
    config = T.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    T.BertModel(config).save_pretrained(folder)
    T.AutoTokenizer.from_pretrained(str(minilm_folder())).save_pretrained(folder)
    return folder


class Payload:
    """Unpickling this would create a file: it must never run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def corrupt_weights(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"\x93NUMPY this is not a safetensors file" * 10)


def pickled_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": Payload(str(folder / "PWNED"))}, folder / "pytorch_model.bin")


def missing_keys(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    del config["hidden_size"], config["num_attention_heads"]
    (folder / "config.json").write_text(json.dumps(config))


def abc_size(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = "abc"
    (folder / "config.json").write_text(json.dumps(config))


def huge_model(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=65536, num_hidden_layers=96, intermediate_size=262144, num_attention_heads=64)
    (folder / "config.json").write_text(json.dumps(config))


def huge_model_8_byte_weights(folder: Path) -> None:
    huge_model(folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 8)


CASES = {
    "corrupt": (corrupt_weights, "model.safetensors is damaged"),
    "pickled": (pickled_weights, "pytorch_model.bin holds Python objects besides tensors"),
    "missing": (missing_keys, "config.json has no hidden_size"),
    "abc": (abc_size, "config.json: hidden_size must be a positive whole number, got 'abc'"),
    "huge": (huge_model, "more than this server loads: the limit is"),
    "huge-8-bytes": (huge_model_8_byte_weights, "model.safetensors is damaged"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_model_folder_gets_a_message_and_the_session_goes_on(case, tiny_bert, tmp_path, monkeypatch):
    damage, expected = CASES[case]
    model_dir = tmp_path / "models"
    folder = model_dir / f"broken-{case}"
    shutil.copytree(tiny_bert, folder)
    damage(folder)
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(model_dir))
    models.clear_models()
    at = run("text_attention", model=f"models/broken-{case}")
    no_exception(at)
    errors = messages(at, "error")
    assert len(errors) == 1 and expected in errors[0], errors
    page_text = " ".join(messages(at, "error") + messages(at, "info") + messages(at, "markdown"))
    assert "Traceback" not in page_text and str(tmp_path) not in page_text and "/tmp" not in page_text
    assert not (folder / "PWNED").exists()  # the pickle's payload never ran
    # The same session picks a working model: the page draws as usual.
    at.selectbox(key="text.model_choice").set_value("minilm").run()
    no_exception(at)
    assert not messages(at, "error") and at.selectbox(key="text.head").value == 1  # the lecture's head


def test_text_of_only_invisible_characters_gets_a_reason_not_cls_sep():
    """Once drawn as "[CLS] [SEP]" with no message."""
    for text in ("\x00\x00\x00", "\u200b\u200c\u200d\ufeff"):
        at = run("text_attention", text=text)
        no_exception(at)
        assert any("has no readable text" in e for e in messages(at, "error")), messages(at, "error")
        assert not at.get("vega_lite_chart")  # nothing drawn for an input the model cannot read
        at.text_area(key="text.text").input("Now a real sentence.").run()  # the session goes on
        no_exception(at)
        assert not messages(at, "error") and at.get("vega_lite_chart")


def test_a_png_with_a_huge_colour_profile_is_shown_with_a_note():
    """Once refused as "damaged or cut short"."""
    import io
    import os

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG", icc_profile=os.urandom(15 * 2**20))
    at = run("vision", timeout=120, model="vit-tiny")
    at.radio(key="vit.from").set_value("upload").run()
    at.file_uploader(key="vit.upload").set_value([("profile.png", buffer.getvalue(), "image/png")]).run()
    no_exception(at)
    assert not messages(at, "error")
    assert any("15.0 MB colour profile (ICC) was left out" in m for m in messages(at, "info"))
