"""The bundled models in assets/: they load offline by name, still reach the accuracy their model
cards state on freshly drawn held-out data, show the attention property they are shipped for, and
the training script is reproducible."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import tformer_core as tc
from tformer_core import bundled
from tformer_train import data as td
from tformer_train import evaluation, train

# Seeds of the samples drawn here: neither the training stream nor the model cards' evaluation.
TEST_SEED = 7_531
N_SENTENCES = 600
N_IMAGES = 1000


@pytest.fixture(scope="module")
def translator():
    return tc.load_model("translator", device="cpu")


@pytest.fixture(scope="module")
def vit_tiny():
    return tc.load_model("vit-tiny", device="cpu")


@pytest.fixture(scope="module")
def held_out_pairs():
    pairs = td.sample_pairs(N_SENTENCES, TEST_SEED, "held-out")
    assert all(td.is_held_out(p.source_text) for p in pairs)
    return pairs


@pytest.fixture(scope="module")
def scenes():
    return td.make_scenes(N_IMAGES, TEST_SEED)


# ---- the shipped files -------------------------------------------------------------------------
def test_assets_hold_every_bundled_model_within_15_mb():
    total = sum(f.stat().st_size for f in bundled.ASSETS_DIR.rglob("*") if f.is_file())
    assert total <= 15 * 2**20, f"assets/ is {total / 2**20:.1f} MiB"
    for name in bundled.BUNDLED_MODELS:
        folder = bundled.asset_dir(name)
        meta = json.loads((folder / "config.json").read_text())
        # The weights shipped are the ones the training run wrote and the model card describes.
        assert bundled.file_sha256(folder / "model.safetensors") == meta["weights_sha256"]
        card = bundled.model_card(name)
        assert meta["weights_sha256"] in card
        assert meta["training"]["command"] in card
        assert f"seed {meta['training']['seed']}" in card


@pytest.mark.parametrize("name", ["translator", "vit-tiny"])
def test_shipped_model_cards_are_rendered_from_their_recorded_figures(name):
    """The card is the template filled with what config.json recorded: neither can drift from the other."""
    from tformer_train import cards

    assert cards.render(bundled.asset_dir(name)) == bundled.model_card(name)


def test_model_cards_state_the_measured_figures():
    meta = json.loads((bundled.asset_dir("translator") / "config.json").read_text())
    assert f"{meta['evaluation']['held_out_exact_match']:.2%}" in bundled.model_card("translator")
    meta = json.loads((bundled.asset_dir("vit-tiny") / "config.json").read_text())
    card = bundled.model_card("vit-tiny")
    assert f"{meta['evaluation']['held_out_accuracy']:.2%}" in card
    assert f"x{meta['evaluation']['last_layer_attention']['any_pixel']['ratio_of_means']:.2f}" in card


# ---- translator --------------------------------------------------------------------------------
def test_translator_is_the_original_transformer_layout(translator):
    c = translator.config
    assert isinstance(translator, tc.EncoderDecoder)
    assert (c.norm, c.positional, c.activation) == ("post", "sinusoidal", "relu")
    assert translator.source == "translator"


@pytest.mark.slow
def test_translator_exact_match_on_fresh_held_out_sentences(translator, held_out_pairs):
    accuracy = evaluation.translation_accuracy(translator, held_out_pairs)
    assert accuracy >= 0.98, f"held-out exact match {accuracy:.4f}"


@pytest.mark.slow
def test_cross_attention_follows_the_reordering(translator, held_out_pairs):
    pairs = held_out_pairs[:120]
    aligned = [(t, a) for p in pairs for t, a in enumerate(p.alignment) if a is not None]
    moved = sum(t != a for t, a in aligned) / len(aligned)
    assert moved > 0.7  # the languages really reorder: most words change index
    per_head = evaluation.alignment_accuracy(translator, pairs)  # (decoder layers, heads)
    assert per_head.shape == (translator.config.n_decoder_layers, translator.config.n_heads)
    # Some head puts its maximum on the gold source word for most target words: the alignment is
    # real and not the diagonal (a diagonal head would score at most 1 - moved).
    assert per_head.max() >= 0.8, per_head
    assert per_head.max() > 1 - moved + 0.5


@pytest.mark.slow
def test_generate_agrees_with_batched_greedy_translation_and_the_reference(translator, held_out_pairs):
    for pair in held_out_pairs[:15]:
        result = translator.generate(pair.source_text)
        assert result.finished
        assert result.tokens[0] == "<bos>" and result.tokens[-1] == "<eos>"
        words = list(result.generated_tokens[:-1])
        assert words == evaluation.translate(translator, pair.source_text)
        assert words == list(pair.target)


def test_traced_translation_has_row_stochastic_cross_attention(translator, held_out_pairs):
    pair = held_out_pairs[0]
    trace = translator.trace(pair.source_text, pair.target_text)
    assert trace.tokens == pair.source
    assert trace.target_tokens == ("<bos>",) + pair.target
    weights = trace.attention(1, stack="cross")  # (heads, T, S)
    assert weights.shape == (translator.config.n_heads, len(pair.target) + 1, len(pair.source))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    self_weights = trace.attention(0, stack="decoder")
    assert np.all(np.triu(self_weights, k=1) == 0)


def test_unknown_words_stay_visible(translator):
    tok = translator.tokenizer
    assert tok.words("The big Dog sleeps.") == ["the", "big", "dog", "sleeps"]
    assert tok.convert_ids_to_tokens(tok.encode("the purple dog sleeps")) == ["the", "<unk>", "dog", "sleeps"]
    assert tok.unknown_words("the purple dog sleeps") == ["purple"]
    # The model was trained to put <unk> where the unknown word's translation belongs.
    assert evaluation.translate(translator, "the dog chases a purple cat") == [
        "varo",
        "ta",
        "ga",
        "mise",
        "<unk>",
        "na",
        "wo",
        "kasas",
    ]


def test_translator_rejects_what_it_cannot_read(translator):
    with pytest.raises(tc.InputError, match=r"^the source is empty: type at least one word$"):
        translator.trace("", "<bos>")
    with pytest.raises(
        tc.InputError, match=r"^the source has 40 tokens; this model handles at most 32\. Shorten it\.$"
    ):
        translator.trace(" ".join(["dog"] * 40), "<bos>")
    with pytest.raises(ValueError, match=r"^the sentence '\?!' has no words to translate$"):
        evaluation.translate(translator, "?!")


# ---- vit-tiny ------------------------------------------------------------------------------------
def test_vit_tiny_is_a_pre_norm_vit_with_class_token(vit_tiny):
    c = vit_tiny.config
    assert isinstance(vit_tiny, tc.ViT)
    assert c.norm == "pre" and c.n_prefix_tokens == 1
    assert list(vit_tiny.class_names) == list(td.SHAPE_CLASSES)
    assert vit_tiny.source == "vit-tiny"


@pytest.mark.slow
def test_vit_tiny_accuracy_on_fresh_images(vit_tiny, scenes):
    accuracy = float((evaluation.classify(vit_tiny, scenes.images) == scenes.labels).float().mean())
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.4f}"


def test_class_token_attends_to_the_shape(vit_tiny, scenes):
    figures = evaluation.foreground_figures(vit_tiny, scenes)["any_pixel"]
    # "Clearly above the foreground's share": at least one and a half times the share, on average,
    # and on most single images.
    assert figures["ratio_of_means"] >= 1.5, figures
    assert figures["images_with_mass_above_share"] >= 0.8, figures


def test_photo_preprocessing_matches_the_training_normalisation(vit_tiny, scenes):
    """A PNG of a scene, read back as a photo, gives the tensor the model was trained on (up to 8-bit rounding)."""
    image = scenes.images[0]
    pil = Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    x = vit_tiny.preprocessing(pil)
    recorded = json.loads((bundled.asset_dir("vit-tiny") / "config.json").read_text())["preprocessing"]
    mean, std = (torch.tensor(recorded[k]).view(3, 1, 1) for k in ("mean", "std"))
    expected = (image - mean) / std  # as the training script normalised its batches
    assert x.shape == (3, 32, 32)
    torch.testing.assert_close(x, expected, atol=0.5 / 255 / min(vit_tiny.preprocessing.std) + 1e-6, rtol=0)
    trace = vit_tiny.trace(x)
    assert trace.grid_hw == (8, 8) and trace.patch_size == 4
    np.testing.assert_allclose(trace.attention(3).sum(-1), 1.0, atol=1e-5)


# ---- loading errors ----------------------------------------------------------------------------
def test_unknown_bundled_name_and_missing_assets_fail_clearly(monkeypatch, tmp_path):
    with pytest.raises(
        ValueError, match=r"^unknown bundled model 'translater': the bundled models are \['detr-tiny', "
    ):
        bundled.load_bundled("translater")
    monkeypatch.setattr(bundled.loading, "ASSETS_DIR", tmp_path)
    with pytest.raises(tc.CheckpointError, match=r"python -m tformer_train\.train"):
        tc.load_model("vit-tiny", device="cpu")


# ---- reproducible training ------------------------------------------------------------------------
TRAINED = ["translator", "vit-tiny"]


@pytest.fixture(scope="module")
def trained_by_the_command_line(command_lines):
    """The training command line, `NAME --steps 4 --seed 3 --no-eval`, for both models (one fresh process, another
    string-hash seed: tests/conftest.py), from an empty folder, so that each writes where it does by default.
    Returns (that folder, the shipped weights' sha256 per model as they were before the runs)."""
    shipped = {name: bundled.file_sha256(bundled.asset_dir(name) / "model.safetensors") for name in TRAINED}
    runs = [[name, "--steps", "4", "--seed", "3", "--no-eval"] for name in TRAINED]
    return command_lines(train.__name__, runs), shipped


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_training_reproduces_the_same_weights_for_the_same_seed(name, tmp_path, trained_by_the_command_line):
    trainer = train.TRAINERS[name]
    quiet = lambda message: None  # noqa: E731
    first = trainer(steps=4, seed=3, out=tmp_path / "a", evaluate=False, log=quiet)
    again = trainer(steps=4, seed=3, out=tmp_path / "b", evaluate=False, log=quiet)
    other = trainer(steps=4, seed=4, out=tmp_path / "c", evaluate=False, log=quiet)
    assert first.weights_sha256 == again.weights_sha256
    assert first.weights_sha256 != other.weights_sha256
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    # The command line in a fresh process, with another string-hash seed, writes the same bytes.
    folder, _ = trained_by_the_command_line
    assert bundled.file_sha256(folder / "trained" / name / "model.safetensors") == first.weights_sha256
    # What was written loads back as a working model.
    model = bundled.load_from_dir(tmp_path / "a", "cpu")
    assert bundled.file_sha256(tmp_path / "a" / "model.safetensors") == first.weights_sha256
    assert not model.training
    # The global torch state is left as it was.
    assert not torch.are_deterministic_algorithms_enabled()


def test_training_command_line_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit, match=r"^2$"):  # argparse's exit status for a usage error
        train.main(["translator", "--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^2$"):
        train.main(["gpt-5"])


@pytest.mark.slow
def test_training_writes_outside_the_shipped_assets_by_default(trained_by_the_command_line):
    folder, shipped = trained_by_the_command_line
    for name in TRAINED:
        assert (folder / "trained" / name / "model.safetensors").is_file()
        assert bundled.file_sha256(bundled.asset_dir(name) / "model.safetensors") == shipped[name]
