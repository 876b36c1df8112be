"""Bad inputs get clear ValueErrors; device and dtype placement."""

import dataclasses

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit


@pytest.mark.parametrize(
    "inputs, error, message",
    [
        ([], tc.InputError, "^the input is empty: give at least one token$"),
        ("a sentence", tc.InputError, "^this model has no tokenizer: pass token ids instead of text$"),
        ([1, 2, 40], tc.InputError, r"^token id 40 is outside the vocabulary \(0\.\.39\)$"),
        ([1, -1], tc.InputError, r"^token id -1 is outside the vocabulary \(0\.\.39\)$"),
        ([1.5, 2], tc.InputError, r"^token ids must be whole numbers; got \[1\.5, 2\.0\]"),
        (list(range(1, 34)), tc.InputError, r"^the input has 33 tokens; this model handles at most 32\. Shorten it\.$"),
        # a batch is the caller's mistake, not the user's: a plain ValueError
        (np.ones((2, 3), dtype=int), ValueError, r"^trace\(\) takes one sequence; got a batch of shape \(2, 3\)$"),
    ],
)
def test_bad_text_inputs(inputs, error, message):
    with pytest.raises(error, match=message) as caught:
        tiny_encoder().trace(inputs)
    assert caught.type is error


def test_mask_length_must_match():
    with pytest.raises(ValueError, match=r"^attention_mask has 2 entries but the input has 3 tokens$"):
        tiny_encoder().trace([1, 2, 3], attention_mask=[1, 1])


def test_seq2seq_names_the_side_that_is_wrong():
    with pytest.raises(tc.InputError, match=r"^the target is empty: give at least one token$"):
        tiny_seq2seq().trace([1, 2], [])
    with pytest.raises(tc.InputError, match=r"^token id 35 is outside the vocabulary \(0\.\.34\)$"):
        tiny_seq2seq().trace([1, 2], [34, 35])  # target vocabulary is 35


@pytest.mark.parametrize(
    "img, message",
    [
        (
            torch.zeros(3, 16, 16),
            r"^expected one preprocessed image of shape \(3, 12, 16\) \(C, H, W\), got \(3, 16, 16\)$",
        ),
        (
            torch.zeros(2, 3, 12, 16),
            r"^expected one preprocessed image of shape \(3, 12, 16\) \(C, H, W\), got \(2, 3, 12, 16\)$",
        ),
        (torch.zeros(3, 12, 16, dtype=torch.uint8), r"^the image tensor must hold floats \(normalised pixel values\)$"),
        (torch.full((3, 12, 16), float("nan")), "^the image tensor holds NaN or infinite values$"),
    ],
)
def test_bad_images(img, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit().trace(img)


def test_accepts_numpy_and_batched_single_inputs():
    model = tiny_vit()
    a = model.trace(image().numpy())
    b = model.trace(image()[None])
    np.testing.assert_array_equal(a.output, b.output)
    enc = tiny_encoder()
    np.testing.assert_array_equal(enc.trace(np.array([[1, 2, 3]])).output, enc.trace(torch.tensor([1, 2, 3])).output)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("activation", "swish", r"^activation must be one of \['gelu', 'gelu_tanh', 'relu', 'silu'\], got 'swish'$"),
        ("norm", "middle", "^norm must be 'post' or 'pre', got 'middle'$"),
        ("n_heads", 5, "^d_model=16 is not divisible by n_heads=5; set d_head$"),
    ],
)
def test_bad_configs(field, value, message):
    with pytest.raises(ValueError, match=message):
        tc.EncoderConfig(d_model=16, **{field: value})


def test_configs_are_frozen_and_hashable():
    c = tc.ViTConfig(image_size=32, patch_size=8)
    assert hash(c) == hash(tc.ViTConfig(image_size=32, patch_size=8))
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"^cannot assign to field 'patch_size'$"):
        c.patch_size = 4  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"^image size 32x32 is not a whole number of 5-px patches$"):
        tc.ViTConfig(image_size=32, patch_size=5)


def test_default_device_and_override(monkeypatch):
    monkeypatch.delenv("TFORMER_DEVICE", raising=False)
    assert tc.default_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("TFORMER_DEVICE", "cpu")
    assert tc.default_device() == torch.device("cpu")
    model = tiny_decoder().place("cpu", "float64")
    assert model.device.type == "cpu" and model.dtype == torch.float64
    with pytest.raises(
        ValueError, match=r"^unknown dtype 'float8': use one of \['bfloat16', 'float16', 'float32', 'float64'\]$"
    ):
        tc.resolve_dtype("float8")


def test_bfloat16_trace_gives_float32_arrays_with_valid_weights():
    model = tiny_decoder().place("cpu", torch.bfloat16)
    trace = model.trace([1, 2, 3, 4])
    w = trace.attention(1, 2)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=2e-2)
    assert np.all(np.triu(w, 1) == 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_cuda_trace_matches_cpu(dtype, tol):
    cpu = tiny_vit()
    gpu = tiny_vit().place("cuda", dtype)
    a, b = cpu.trace(image()), gpu.trace(image())
    assert a.names == b.names
    for layer in range(a.n_layers):
        np.testing.assert_allclose(a.attention(layer), b.attention(layer), atol=tol)
    np.testing.assert_allclose(a.output, b.output, atol=tol * 10)


MINILM = None


def minilm():
    global MINILM
    if MINILM is None:
        MINILM = tc.load_model("minilm", device="cpu")
    return MINILM


@pytest.mark.parametrize(
    "text", ["\x00", "\x00\x00\x00", "\u200b\u200c\u200d", "\ufeff \u2060 \u200e\u200f", "\x07\t\n\x1b", "\u202e\u2066"]
)
def test_text_of_only_invisible_characters_is_refused_with_a_reason(text):
    """Once shown as "[CLS] [SEP]" with no word of explanation."""
    with pytest.raises(tc.InputError, match=r"^the sentence has no readable text: it holds only invisible characters"):
        tc.fit_to_model(minilm(), text)
    with pytest.raises(tc.InputError, match=r"^the input has no readable text: it holds only invisible characters"):
        minilm().trace(text)
    with pytest.raises(
        tc.InputError, match=r"^the second segment has no readable text: it holds only invisible characters"
    ):
        tc.fit_to_model(minilm(), "A real sentence.", "\u200b")


def test_visible_text_around_invisible_characters_still_reads():
    fitted = tc.fit_to_model(minilm(), "\u200bcat\x00")
    assert fitted.n_tokens == 3 and minilm().trace(fitted.text).tokens == ("[CLS]", "cat", "[SEP]")
    assert tc.tokenizers.readable("é") and tc.tokenizers.readable("猫") and not tc.tokenizers.readable("\u200b\x00 ")


def test_text_the_tokenizer_drops_entirely_is_refused():
    with pytest.raises(
        tc.InputError, match=r"^the tokenizer finds no tokens in the sentence \(only characters it drops\)"
    ):
        tc.fit_to_model(minilm(), "\u0301\u0301")  # combining accents alone: BERT's tokenizer strips them
