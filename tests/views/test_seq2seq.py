"""The encoder-decoder page's numbers (tformer_views.seq2seq): greedy translation step by step,
teacher forcing, the step views and the alignment, on the bundled translator and a tiny T5 with its
own tokenizer (no network)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import tformer_core as tc
from tests.core.hf_helpers import save_tiny_t5
from tformer_train import data as td
from tformer_views import seq2seq as sv

SENTENCE = "the big dog chases a small cat near the river"


@pytest.fixture(scope="module")
def translator():
    return tc.load_model("translator", device="cpu")


@pytest.fixture(scope="module")
def greedy(translator):
    return sv.translate(translator, SENTENCE)


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    folder = save_tiny_t5(root / "tiny-t5")
    return folder, tc.load_model(str(folder), device="cpu", model_dirs=[root])


@pytest.mark.slow
def test_greedy_translation_of_held_out_sentences_is_the_reference(translator):
    for pair in td.sample_pairs(25, 4_242, "held-out"):
        t = sv.translate(translator, pair.source_text)
        assert t.output_text == pair.target_text
        assert t.finished and t.produced[-1] == "<eos>" and t.decoder_tokens[0] == "<bos>"
        assert t.n_steps == len(pair.target) + 1 == len(t.steps)


def test_each_step_is_the_row_of_the_whole_pass(greedy):
    """Step t's own pass and row t of one pass over the whole output are the same computation (causal mask)."""
    trace = greedy.trace
    for t in range(greedy.n_steps):
        step = sv.at_step(greedy, t)
        assert step.trace is greedy.steps[t] and step.input_tokens == greedy.decoder_tokens[: t + 1]
        rows = step.cross_rows()  # [layers, heads, source]
        assert rows.shape == (2, 4, len(greedy.source_tokens))
        np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-5)
        for layer in range(2):
            np.testing.assert_allclose(rows[layer], trace.attention(layer, None, "cross")[:, t], atol=1e-5)
            m = step.self_attention(layer, 1)
            np.testing.assert_allclose(m.weights, trace.attention(layer, 1, "decoder")[: t + 1, : t + 1], atol=1e-5)
        # The token written is the model's most likely one at that step.
        assert step.predictions(1)[0][0] == greedy.produced[t]


def test_the_step_view_draws_the_causal_mask(greedy):
    m = sv.at_step(greedy, 4).self_attention(1, 2)
    assert m.weights.shape == (5, 5) and m.allowed is not None
    upper = np.triu_indices(5, 1)
    assert not m.allowed[upper].any() and m.allowed[np.tril_indices(5)].all()
    np.testing.assert_array_equal(m.weights[upper], 0.0)
    assert m.masked[upper].all() and not m.masked[np.tril_indices(5)].any()
    np.testing.assert_allclose(m.weights.sum(1), 1.0, atol=1e-6)
    with pytest.raises(
        tc.InputError, match=rf"^step {greedy.n_steps} is out of range: this translation has {greedy.n_steps} steps$"
    ):
        sv.at_step(greedy, greedy.n_steps)


def test_alignment_rows_are_the_written_tokens_and_sum_to_one(greedy):
    one = sv.alignment(greedy, 1, 2)
    mean = sv.alignment(greedy, 1, None)
    assert one.query_labels == greedy.produced and one.key_labels == greedy.source_tokens
    assert one.weights.shape == (greedy.n_steps, len(greedy.source_tokens))
    np.testing.assert_allclose(one.weights.sum(1), 1.0, atol=1e-5)
    heads = [sv.alignment(greedy, 1, h).weights for h in range(4)]
    np.testing.assert_allclose(mean.weights, np.mean(heads, axis=0), atol=1e-7)
    # The translator's best head aligns words across the reordering: "varo" (dog) looks at "dog".
    assert greedy.source_tokens[int(np.argmax(one.weights[0]))] == "dog" and greedy.produced[0] == "varo"


def test_teacher_forcing_with_the_models_own_output_gives_the_same_attention(translator, greedy):
    forced = sv.teacher_force(translator, SENTENCE, greedy.output_text)
    assert forced.mode == "teacher" and forced.steps is None
    assert forced.decoder_ids == greedy.decoder_ids  # <bos> ... <eos>
    for layer in range(2):
        np.testing.assert_allclose(
            forced.trace.attention(layer, None, "cross"), greedy.trace.attention(layer, None, "cross"), atol=1e-6
        )
    step = sv.at_step(forced, 3)
    assert step.trace is forced.trace and step.row == 3
    np.testing.assert_allclose(step.cross_rows(), sv.at_step(greedy, 3).cross_rows(), atol=1e-5)


def test_teacher_forcing_a_different_target_shows_where_the_model_disagrees(translator):
    forced = sv.teacher_force(translator, SENTENCE, "varo gros ta ga mise mik na wo kasas")
    assert forced.produced == ("varo", "gros", "ta", "ga", "mise", "mik", "na", "wo", "kasas", "<eos>")
    # After "ga" the model would write the place phrase ("fluvo"), not the given "mise".
    assert sv.at_step(forced, 4).predictions(1)[0][0] == "fluvo"


def test_unknown_words_are_visible(translator):
    t = sv.translate(translator, "the big dog chases a purple cat")
    assert t.unknown_words == ("purple",)
    assert "<unk>" in t.source_tokens and "<unk>" in t.produced
    forced = sv.teacher_force(translator, "the dog sleeps", "varo ta ga dormas zorp")
    assert "zorp" in forced.unknown_words and "<unk>" in forced.produced


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: sv.translate(m, ""), "^the source is empty: type at least one word$"),
        (lambda m: sv.translate(m, "   "), "^the source is empty: type at least one word$"),
        # 20 x "the dog": 40 word tokens, over the 32 the model reads
        (
            lambda m: sv.translate(m, " ".join(["the dog"] * 20)),
            r"^the source has 40 tokens; this model handles at most 32\.",
        ),
        (lambda m: sv.translate(m, SENTENCE, 0), "^the number of new tokens must be 1 to 64, got 0$"),
        (lambda m: sv.translate(m, SENTENCE, 1000), "^the number of new tokens must be 1 to 64, got 1000$"),
        (lambda m: sv.teacher_force(m, SENTENCE, " "), "^the target is empty: type the translation to check"),
        (
            lambda m: sv.teacher_force(m, SENTENCE, " ".join(["varo"] * 40)),
            r"^the target has 42 tokens with its start and end tokens; this model handles at most 32\.",
        ),
    ],
)
def test_bad_input_gets_a_message(translator, call, message):
    with pytest.raises(tc.InputError, match=message):
        call(translator)


def test_a_length_limit_stops_the_translation_unfinished(translator):
    t = sv.translate(translator, SENTENCE, 3)
    assert t.n_steps == 3 and not t.finished and "<eos>" not in t.produced


def test_other_models_are_refused(translator):
    with pytest.raises(
        tc.InputError, match=r"^this page shows encoder-decoder models \(translation\); this one is not$"
    ):
        sv.translate(tc.load_model("vit-tiny", device="cpu"), "a dog")


def test_a_hub_style_t5_is_forced_with_its_own_target_tokenizer(tiny_t5):
    folder, model = tiny_t5
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    target = "Das Haus ist wunderbar."
    forced = sv.teacher_force(model, "The house is wonderful.", target)
    assert list(forced.decoder_ids) == [0, *tok(text_target=target)["input_ids"]]  # <pad> starts the decoder
    assert forced.decoder_ids[-1] == 1 and forced.output_text == target
    # transformers computes the same cross-attention for these ids (T5: no scaling, relative bias).
    hf = transformers.T5ForConditionalGeneration.from_pretrained(str(folder), attn_implementation="eager").eval()
    src = torch.tensor([tok("The house is wonderful.")["input_ids"]])
    with torch.no_grad():
        out = hf(input_ids=src, decoder_input_ids=torch.tensor([forced.decoder_ids]), output_attentions=True)
    for layer, weights in enumerate(out.cross_attentions):
        np.testing.assert_allclose(forced.trace.attention(layer, None, "cross"), weights[0].numpy(), atol=1e-4)
    greedy = sv.translate(model, "The house is wonderful.", 6)
    ids = hf.generate(src, max_new_tokens=6, do_sample=False, num_beams=1)[0].tolist()
    assert list(greedy.decoder_ids) == ids
