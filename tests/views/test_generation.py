"""tformer_views.generation (a decoder-only model continuing a text, step by step) and the Text attention page's
other views of issue 15 (sequence classification, the page's token limit, fallback seq2seq models): tiny random
models saved the way a user's checkpoints are, no network.

The builders here (`save_tiny_gpt2`, `save_classifier`) are shared with tests/app/test_text_decoder.py.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import VOCAB, perturbed, save_with_words, tiny_opt, tiny_pegasus
from tformer_core.checkpoints.fallback import load_transformers
from tformer_views import generation as gen
from tformer_views import seq2seq as sv
from tformer_views import text as tv
from tformer_views.tokens import display_next, display_token, display_tokens

SENTENCE = "The animal didn't cross the street because it was too tired."
CORPUS = [SENTENCE, "The cat sat on the mat.", "Attention is all you need.", "It was too tired to cross."] * 5
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def save_tiny_gpt2(folder: Path, n_positions: int = 64) -> Path:
    """A tiny random GPT-2 (2 layers x 4 heads) with its own byte-level BPE tokenizer, in the Hugging Face layout."""
    from tokenizers import ByteLevelBPETokenizer

    torch.manual_seed(0)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = T.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    config = T.GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=n_positions,
        bos_token_id=0,
        eos_token_id=0,
    )
    perturbed(T.GPT2LMHeadModel(config), scale=0.3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_classifier(folder: Path, kind: str = "bert") -> Path:
    """A tiny random sequence classifier (labels negative / neutral / positive) with a small word tokenizer:
    "bert" runs in the core's Encoder (path tformer), "electra" through transformers (path transformers)."""
    torch.manual_seed(0)
    common = dict(vocab_size=len(VOCAB), id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, **SMALL)
    if kind == "bert":
        hf = T.BertForSequenceClassification(T.BertConfig(**common, max_position_embeddings=64))
    else:
        hf = T.ElectraForSequenceClassification(T.ElectraConfig(**common, embedding_size=16))
    return save_with_words(perturbed(hf, scale=0.3), folder)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return tc.load_model(str(save_tiny_gpt2(root / "tiny-gpt2")), device="cpu", model_dirs=[root])


# ---- continuing a text --------------------------------------------------------------------------------
def test_a_greedy_continuation_keeps_each_steps_attention_rows_and_top_k(gpt2):
    c = gen.continue_text(gpt2, SENTENCE, 6)
    ref = gpt2.generate(SENTENCE, 6)
    assert c.ids == tuple(ref.ids) and c.tokens == tuple(ref.tokens) and c.n_prompt == ref.n_prompt
    assert c.n_steps == 6 and c.sampling is None and c.path == "tformer" and not c.finished
    assert c.text == gpt2.tokenizer.decode(list(ref.generated_ids))
    for t in range(c.n_steps):
        step = c.step(t)
        assert step.query == c.n_prompt - 1 + t and len(step.keys) == step.query + 1
        assert step.rows.shape == (2, 4, c.n_prompt + t) and step.rows.dtype == np.float32
        np.testing.assert_allclose(step.rows.sum(-1), 1.0, atol=1e-5)
        # The row of the position read last, in every layer: as the teacher-forced pass over the whole text has it.
        expected = np.stack([ref.trace.attention(layer)[:, step.query, : step.query + 1] for layer in range(2)])
        np.testing.assert_allclose(step.rows, expected, atol=1e-5)
        # Greedy: the token written is the most probable one, and its probability is the model's.
        # (a byte-level piece shown as the character it completes, or as the start of one: tokens.display_next)
        assert step.produced == step.top[0][0] == display_next(c.tokens[: step.query + 1], c.tokens[step.query + 1])
        assert step.probability == pytest.approx(step.top[0][1], abs=1e-5)
        assert step.probability == pytest.approx(ref.probabilities[t], abs=1e-5)
        assert [p for _, p in step.top] == sorted((p for _, p in step.top), reverse=True)
    matrix, rows, keys = c.step(2).grid()
    assert matrix.shape == (8, c.n_prompt + 2) and rows[:5] == ["L0 H0", "L0 H1", "L0 H2", "L0 H3", "L1 H0"]
    assert keys[-1] == display_tokens(c.tokens[: c.n_prompt + 2])[-1]  # the token written at step 1, read at step 2
    frame = c.tokens_frame()
    assert list(frame["step"]) == list(range(1, 7)) and list(frame["probability"]) == list(c.probabilities)
    top = c.step(0).top_frame(5)
    assert list(top.columns) == ["token", "probability", "written"] and top["written"].tolist()[0]


def test_sampling_is_reproducible_and_matches_the_core(gpt2):
    sampling = gen.sampling_of(1.5, 20, 7)
    assert sampling == tc.Sampling(1.5, 20, 7)
    a = gen.continue_text(gpt2, SENTENCE, 8, sampling)
    b = gen.continue_text(gpt2, SENTENCE, 8, tc.Sampling(1.5, 20, 7))
    ref = gpt2.generate(SENTENCE, 8, sampling=tc.Sampling(1.5, 20, 7))
    assert a.ids == b.ids == tuple(ref.ids) and a.sampling == sampling
    np.testing.assert_allclose(a.probabilities, ref.probabilities, atol=1e-6)
    other = gen.continue_text(gpt2, SENTENCE, 8, tc.Sampling(1.5, 20, 8))
    assert other.ids != a.ids  # another seed draws other tokens (20 candidates at a flat temperature)
    # Temperature 0 is greedy whatever the seed and top-k say: one cached result for all of them.
    assert gen.sampling_of(0.0, 20, 7) is None
    assert gen.continue_text(gpt2, SENTENCE, 3, tc.Sampling(0.0, 5, 3)).ids == gen.continue_text(gpt2, SENTENCE, 3).ids


@pytest.mark.parametrize(
    "prompt, new, message",
    [
        ("", 4, "^the text to continue is empty: type at least one word$"),
        ("   ", 4, "^the text to continue is empty: type at least one word$"),
        (SENTENCE, 0, "^the number of new tokens must be 1 to 64, got 0$"),
        (SENTENCE, 65, "^the number of new tokens must be 1 to 64, got 65$"),
        (" ".join(["cat"] * 300), 4, "^the text to continue has 301 tokens; a continuation starts from at most 256 "),
    ],
)
def test_bad_requests_are_refused_with_a_message_before_any_pass(gpt2, prompt, new, message):
    with pytest.raises(tc.InputError, match=message):
        gen.continue_text(gpt2, prompt, new)


def test_a_prompt_filling_every_position_leaves_no_step(tmp_path):
    model = tc.load_model(str(save_tiny_gpt2(tmp_path / "short", n_positions=8)), device="cpu", model_dirs=[tmp_path])
    fitted = tv.fit_text(model, SENTENCE)  # the page cuts a text to the model's positions first
    c = gen.continue_text(model, fitted.text, 5)
    assert c.n_prompt == 8 and c.n_steps == 0 and c.text == ""


def test_only_decoders_continue(tmp_path):
    encoder = tc.load_model(str(save_classifier(tmp_path / "bert")), device="cpu", model_dirs=[tmp_path])
    with pytest.raises(tc.InputError, match=r"^only a decoder-only model with a tokenizer continues a text$"):
        gen.continue_text(encoder, "the cat sat", 3)


def test_a_decoder_transformers_runs_continues_greedily_only(tmp_path):
    hf = tiny_opt()
    model = load_transformers(save_with_words(hf, tmp_path / "opt"))
    assert model.kind == "decoder" and not gen.supports_sampling(model)
    c = gen.continue_text(model, "the cat sat on", 4)
    prompt = model.tokenizer.encode("the cat sat on")
    with torch.no_grad():  # the reference: transformers' own greedy search on the same weights
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False, num_beams=1)[0].tolist()
    assert c.path == "transformers" and c.ids == tuple(theirs) and c.n_prompt == len(prompt)
    assert c.n_steps == len(theirs) - len(prompt)  # stopped where transformers stopped (the end token, or 4)
    for t in range(c.n_steps):
        np.testing.assert_allclose(c.step(t).rows.sum(-1), 1.0, atol=1e-5)
    with pytest.raises(
        tc.InputError, match=r"^this model runs through transformers' own code, which tformer decodes greedily only$"
    ):
        gen.continue_text(model, "the cat sat on", 4, tc.Sampling(0.8, None, 0))


def test_the_next_token_table_lists_the_top_k_after_every_position(gpt2):
    trace = gpt2.trace(SENTENCE).compact()
    frame = gen.next_token_frame(trace, 5)
    ids, probs = tc.next_token_table(trace, 5)
    labels = trace.meta["labels"]
    assert list(frame.columns) == ["position", "token", "#1", "#2", "#3", "#4", "#5"]
    assert len(frame) == len(trace.tokens) and frame["token"].tolist()[0] == display_token(trace.tokens[0])
    last = frame.iloc[-1]
    assert last["#1"] == f"{display_next(trace.tokens, labels[ids[-1, 0]])}  {probs[-1, 0]:.3f}"
    assert [last[f"#{j + 1}"].rsplit("  ", 1)[0] for j in range(5)] == [t for t, _ in tv.top_predictions(trace, 5)]


# ---- the page's token limit -------------------------------------------------------------------------
def test_the_page_reads_at_most_its_limit_of_a_long_text(gpt2):
    long = " ".join(["the cat sat on the mat."] * 40)
    # The first sentence is 8 pieces, each later one 7 (" the" takes the space): 8 + 39 x 7 = 281 in all,
    # and the cut fills the limit with whole pieces: 8 + 7 + 5 = 20 ("... the cat sat on the").
    assert gpt2.tokenizer.count(long) == 281
    fitted = tv.fit_text(gpt2, long, limit=20)
    assert fitted.max_tokens == 20 and fitted.n_tokens == 20 == gpt2.tokenizer.count(fitted.text)
    assert fitted.text == " ".join(long.split()[:17]) and fitted.n_dropped == 281 - 20  # 6 + 6 + 5 words
    whole = tv.fit_text(gpt2, long)  # the model's own 64 positions are below the page's limit
    assert whole.max_tokens == 64 and whole.n_tokens == 64 == gpt2.tokenizer.count(whole.text)
    assert whole.n_dropped == 281 - 64
    with pytest.raises(tc.InputError, match=r"^the sentence is empty: type at least one word$"):
        tv.fit_text(gpt2, "  ")


# ---- sequence classification ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind, path", [("bert", "tformer"), ("electra", "transformers")])
def test_a_classifier_shows_its_labels_and_its_first_tokens_attention(tmp_path, kind, path):
    folder = save_classifier(tmp_path / kind, kind)
    model = tc.load_model(str(folder), device="cpu", model_dirs=[tmp_path])
    trace = model.trace("the cat sat on the mat").compact()
    assert tv.prediction_kind(trace) == "classification" and trace.meta["path"] == path
    scores, what = tv.class_scores(trace)
    # The reference: transformers' classifier on the same weights and tokens, its softmax, highest first.
    hf = T.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = hf(**T.AutoTokenizer.from_pretrained(folder)("the cat sat on the mat", return_tensors="pt")).logits
    p = torch.softmax(logits[0].double(), -1).numpy()
    expected = sorted(((LABELS[i], p[i]) for i in range(3)), key=lambda item: -item[1])
    assert what == "probability" and [label for label, _ in scores] == [label for label, _ in expected]
    np.testing.assert_allclose([q for _, q in scores], [q for _, q in expected], atol=1e-5)
    view = tv.first_token_view(trace)
    assert view.layer == 1 and view.token == "[CLS]" and view.head_labels == ("head 0", "head 1", "head 2", "head 3")
    assert view.weights.shape == (4, len(trace.tokens)) and len(view.token_labels) == len(trace.tokens)
    np.testing.assert_allclose(view.weights, trace.attention(1)[:, 0, :], atol=1e-6)


def test_other_heads_keep_their_kind(gpt2):
    assert tv.prediction_kind(gpt2.trace("the cat")) == "next-token"


# ---- encoder-decoder models transformers runs --------------------------------------------------------------
def test_the_encoder_decoder_page_accepts_an_encoder_decoder_transformers_runs(tmp_path):
    hf = tiny_pegasus()
    model = load_transformers(save_with_words(hf, tmp_path / "pegasus"))
    assert model.kind == "encoder-decoder" and not isinstance(model, tc.EncoderDecoder)
    assert sv.require_seq2seq(model) is model
    translation = sv.translate(model, "the big cat sat", 4)
    source = model.tokenizer.encode("the big cat sat")
    with torch.no_grad():  # the reference: transformers' own greedy search on the same weights
        theirs = hf.generate(torch.tensor([source]), max_new_tokens=4, do_sample=False, num_beams=1)[0].tolist()
    assert translation.mode == "greedy" and translation.decoder_ids == tuple(theirs)
    assert translation.n_steps == len(theirs) - 1  # after the start token: stopped where transformers stopped
    assert sv.at_step(translation, 0).cross_rows().shape[:2] == (2, 4)
    with pytest.raises(
        tc.InputError, match=r"^this page shows encoder-decoder models \(translation\); this one is not$"
    ):
        sv.require_seq2seq(tc.load_model(str(save_classifier(tmp_path / "bert")), device="cpu", model_dirs=[tmp_path]))
