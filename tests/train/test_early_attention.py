"""Attention before Transformers: the score functions worked by hand, attention pooling vs mean pooling on a
model small enough to compute by hand, the RNN encoder-decoders' alignment, and the bundled models' figures."""

import math

import numpy as np
import pytest
import torch

import tformer_core as tc
from tformer_core.bundled import recorded
from tformer_core.bundled.sentence_tokenizer import SentenceTokenizer, sentence_words
from tformer_core.models.pooling import PoolingClassifier, PoolingConfig
from tformer_core.models.rnn import RNNConfig, RNNSeq2Seq
from tformer_core.scores import score_functions
from tformer_train import corpora
from tformer_train import data as td
from tformer_train.early_attention import evaluate_sentiment, rnn_alignment_accuracy, rnn_translate


# ---- score functions ------------------------------------------------------------------------------
def test_score_functions_match_the_numbers_worked_by_hand():
    # a = (1, 2), b = (3, -1); W = [[1, .5], [0, 1]]; W1 = W2 = I, v = (1, 1) (the app's defaults)
    s = {step.name: step for step in score_functions([1, 2], [3, -1])}
    assert s["dot"].value == pytest.approx(1.0)  # 3 - 2
    np.testing.assert_allclose(s["dot"].parts["aᵢ bᵢ"], [3, -2])
    assert s["scaled dot"].value == pytest.approx(1 / math.sqrt(2))
    assert s["cosine"].value == pytest.approx(1 / math.sqrt(50))  # 1 / (sqrt 5 * sqrt 10)
    np.testing.assert_allclose(s["bilinear"].parts["W b"], [2.5, -1.0])
    assert s["bilinear"].value == pytest.approx(0.5)  # 1 * 2.5 + 2 * -1
    np.testing.assert_allclose(s["additive"].parts["W₁ a + W₂ b"], [4, 1])
    assert s["additive"].value == pytest.approx(math.tanh(4) + math.tanh(1))  # 1.7609235


def test_score_functions_take_the_users_parameters_and_refuse_bad_ones():
    W = [[2, 0], [0, 3]]
    s = {step.name: step.value for step in score_functions([1, 1], [1, 2], W=W, W1=[[1, 0]], W2=[[0, 1]], v=[2])}
    assert s["bilinear"] == pytest.approx(2 + 6)
    assert s["additive"] == pytest.approx(2 * math.tanh(1 + 2))
    assert score_functions([2, 4], [3, -1])[2].value == pytest.approx(score_functions([1, 2], [3, -1])[2].value)
    with pytest.raises(
        tc.InputError, match=r"^the cosine of a zero vector is not defined: give a and b at least one non-zero"
    ):
        score_functions([0, 0], [1, 2])
    with pytest.raises(
        tc.InputError, match=r"^a has 3 numbers and b 2: the dot product and the cosine need the same length$"
    ):
        score_functions([1, 2, 3], [1, 2])
    with pytest.raises(tc.InputError, match=r"^W must be 2 × 2, got 1 × 3$"):
        score_functions([1, 2], [3, 4], W=[[1, 2, 3]])
    with pytest.raises(
        tc.InputError,
        match=r"^a holds NaN \(not a number\) \(number 2\): the score functions take finite numbers up to 1e\+100",
    ):
        score_functions([1, float("nan")], [3, 4])


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(a=[1e200, 1], b=[3, 4]), "a holds 1e+200 (number 1)"),  # once an inf dot product and a NaN cosine
        (dict(a=[1, 2], b=[3, 1e308]), "b holds 1e+308 (number 2)"),
        (dict(a=[1, float("inf")], b=[3, 4]), "a holds inf (number 2)"),
        (dict(a=[1, 2], b=[3, 4], W=[[1, 0], [0, -float("inf")]]), "W holds -inf (row 2, column 2)"),
        (dict(a=[1, 2], b=[3, 4], W1=[[1, 0], [0, 1e101]]), "W₁ holds 1e+101 (row 2, column 2)"),
        (dict(a=[1, 2], b=[3, 4], v=[float("nan"), 1]), "v holds NaN (not a number) (number 1)"),
    ],
)
def test_numbers_that_would_overflow_are_named_with_the_limit(inputs, message):
    with pytest.raises(tc.InputError) as caught:
        score_functions(**inputs)
    assert str(caught.value).startswith(message + ": the score functions take finite numbers up to 1e+100 in size")


def test_numbers_at_the_limit_give_finite_scores_in_every_function():
    """(1e100)^3 x 64 < 1.8e308: the largest products a bilinear score of 8 numbers sums stay finite."""
    big, d = 1e100, 8
    a, b = np.full(d, big), np.full(d, -big)
    steps = score_functions(
        a, b, W=np.full((d, d), big), W1=np.full((2, d), big), W2=np.full((2, d), big), v=[big, big]
    )
    values = {s.name: s.value for s in steps}
    assert values["dot"] == pytest.approx(-d * big**2) and values["scaled dot"] == pytest.approx(
        -d * big**2 / math.sqrt(d)
    )
    assert values["cosine"] == pytest.approx(-1.0) and values["bilinear"] == pytest.approx(-(d**2) * big**3)
    assert values["additive"] == pytest.approx(0.0)  # tanh(big - big) = tanh(0) for both hidden units
    tiny = score_functions([1e-200, 2e-200], [2e-200, 4e-200])[2]  # parallel: a . b underflows, the angle does not
    assert tiny.value == pytest.approx(1.0) and tiny.parts["‖a‖"] == pytest.approx(math.sqrt(5) * 1e-200)


# ---- attention pooling --------------------------------------------------------------------------
def _tiny_pooling(pooling: str) -> PoolingClassifier:
    """1-number embeddings e = 0, 1, 2, 3; h = tanh(e); s = tanh(h); logits = (c, -c)."""
    model = PoolingClassifier(PoolingConfig(vocab_size=4, d_embed=1, d_hidden=1, d_score=1, pooling=pooling))
    with torch.no_grad():
        model.encoder.embed.tok.weight.copy_(torch.arange(4.0)[:, None])
        for layer in (model.encoder.word, model.pool.W_s):
            layer.weight.fill_(1.0)
            layer.bias.zero_()
        model.pool.v.weight.fill_(1.0)
        model.head.classify.weight.copy_(torch.tensor([[1.0], [-1.0]]))
        model.head.classify.bias.zero_()
    return model


def test_attention_pooling_on_a_model_worked_by_hand():
    trace = _tiny_pooling("attention").trace([1, 2])
    h = [math.tanh(1), math.tanh(2)]  # 0.761594, 0.964028
    s = [math.tanh(x) for x in h]  # 0.642015, 0.746153
    alpha = [math.exp(x) / sum(math.exp(y) for y in s) for x in s]  # 0.473989, 0.526011
    c = alpha[0] * h[0] + alpha[1] * h[1]  # 0.868077
    np.testing.assert_allclose(trace["pool.word_scores"], s, rtol=1e-6)
    np.testing.assert_allclose(trace["pool.weights"], alpha, rtol=1e-6)
    np.testing.assert_allclose(trace["pool.context"], [c], rtol=1e-6)
    np.testing.assert_allclose(trace["head.logits"], [c, -c], rtol=1e-6)
    assert trace.predictions(1)[0] == ("LABEL_0", pytest.approx(1 / (1 + math.exp(-2 * c))))


def test_mean_pooling_gives_every_word_one_over_n():
    trace = _tiny_pooling("mean").trace([1, 2, 3])
    np.testing.assert_allclose(trace["pool.weights"], [1 / 3] * 3)
    np.testing.assert_allclose(trace["pool.context"], [np.mean(np.tanh([1, 2, 3]))], rtol=1e-6)


def test_padding_gets_no_weight_and_does_not_change_the_prediction():
    model = _tiny_pooling("attention")
    alone = model(torch.tensor([[1, 2]]))
    padded = model(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(alone, padded)


def test_a_sentence_of_padding_only_gets_no_weights_not_nan():
    """The attention rule's convention: a row that may attend to nothing gets weights 0 (not 0/0)."""
    model = _tiny_pooling("attention")
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2]]), torch.tensor([[0, 0]]))
    torch.testing.assert_close(logits, torch.zeros(1, 2))  # c = 0, and the classifier's biases are 0


def test_the_models_before_transformers_are_kinds_of_their_own():
    pooling = _tiny_pooling("attention")
    rnn = RNNSeq2Seq(RNNConfig(src_vocab_size=10, tgt_vocab_size=12, d_embed=8, d_hidden=8, d_attn=4))
    assert isinstance(pooling, tc.PoolingModel) and pooling.trace([1, 2]).kind == pooling.kind == "pooling"
    assert isinstance(rnn, tc.RecurrentSeq2Seq) and rnn.trace([4, 5], [1, 7]).kind == rnn.kind == "rnn-seq2seq"
    assert pooling.capabilities == tc.Capabilities(qkv=False, weights=False, head="classification")
    assert rnn.capabilities == tc.Capabilities(qkv=False, weights=False, head="next-token")
    transformers_kinds = (tc.EncoderModel, tc.CausalLM, tc.EncoderDecoderModel, tc.VisionModel)
    for model in (pooling, rnn):
        assert not isinstance(model, transformers_kinds)
        with pytest.raises(ValueError, match=rf"^this {model.kind} model has no 'encoder' stack$"):
            model.weights()
    with pytest.raises(ValueError, match=r"^this model has no tokenizer: pass word ids instead of text$"):
        pooling.words("a film")


# ---- the bundled sentiment models ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sentiment():
    return {name: tc.load_model(f"sentiment-{name}", device="cpu") for name in ("attention", "mean")}


def test_the_sentence_tokenizer_reads_english_words():
    assert sentence_words("It's a GREAT film, isn’t it? 10/10") == [
        "it's",
        "a",
        "great",
        "film",
        "isn't",
        "it",
        "10",
        "10",
    ]
    tok = SentenceTokenizer(["<pad>", "<bos>", "<eos>", "<unk>", "film"], prepend_bos=True)
    assert tok.convert_ids_to_tokens(tok.encode("Film, zorp!")) == ["<bos>", "film", "<unk>"]


def test_the_shipped_sentiment_models_score_what_their_cards_say(sentiment):
    for name, model in sentiment.items():
        figures = evaluate_sentiment(model, log=lambda m: None)
        shipped = recorded(f"sentiment-{name}")["evaluation"]
        assert figures["test_accuracy"] == pytest.approx(shipped["test_accuracy"], abs=1e-9)
        assert figures["test_accuracy"] > 0.7  # against 50.5 % for the majority class
        assert figures["test_sentences"] == len(corpora.sentences("test")) == 1035


def test_the_attention_models_weights_sum_to_one_and_favour_some_words(sentiment):
    trace = sentiment["attention"].trace("a gorgeous , witty film but the plot is thin")
    alpha = trace["pool.weights"]
    assert alpha.sum() == pytest.approx(1.0, abs=1e-6)
    assert alpha.max() > 1.5 / len(alpha)  # not uniform
    mean = sentiment["mean"].trace("a gorgeous , witty film but the plot is thin")["pool.weights"]
    np.testing.assert_allclose(mean, 1 / len(mean), rtol=1e-6)


def test_the_data_sets_split_by_content_and_never_overlap():
    texts = {split: {s.text for s in corpora.sentences(split)} for split in corpora.SPLITS}
    assert not (texts["train"] & texts["test"]) and not (texts["train"] & texts["valid"])
    assert sum(len(corpora.sentences(s)) for s in corpora.SPLITS) == 9959
    images = {split: corpora.digits(split)[0] for split in corpora.SPLITS}
    assert sum(len(i) for i in images.values()) == 1797
    train = {i.tobytes() for i in images["train"]}
    assert not any(i.tobytes() in train for i in images["test"])


# ---- RNN encoder-decoders -------------------------------------------------------------------------
@pytest.mark.parametrize("score", ["additive", "dot", "bilinear"])
def test_an_rnn_traces_one_alignment_row_per_output_step(score):
    torch.manual_seed(0)
    model = RNNSeq2Seq(RNNConfig(src_vocab_size=10, tgt_vocab_size=12, score=score, d_embed=8, d_hidden=8, d_attn=4))
    trace = model.trace([4, 5, 6], [1, 7, 8, 9])
    alpha = trace["attn.weights"]
    assert alpha.shape == (4, 3)
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        alpha, np.exp(trace["attn.energies"]) / np.exp(trace["attn.energies"]).sum(-1, keepdims=True), rtol=1e-5
    )
    np.testing.assert_allclose(trace["attn.context"], alpha @ trace["encoder.states"], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # capture does not change the output
        plain = model(torch.tensor([[4, 5, 6]]), torch.tensor([[1, 7, 8, 9]]))[0]
    np.testing.assert_allclose(trace["head.logits"], plain.numpy(), rtol=1e-6)


def test_the_bilinear_score_is_the_dot_score_with_w_in_between():
    model = RNNSeq2Seq(RNNConfig(src_vocab_size=5, tgt_vocab_size=5, score="bilinear", d_hidden=4))
    s, h = torch.randn(2, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        model.attn.score.W.weight.copy_(torch.eye(4) * 2)
    torch.testing.assert_close(model.attn.score(s, h, None), 2 * torch.einsum("bh,bjh->bj", s, h))


def test_the_rnns_scores_are_the_calculators_score_functions():
    """One definition of each score function: the RNN's additive and bilinear scores of a state s and an
    annotation h are the calculator's (float64) numbers for a = s, b = h with the RNN's own parameters."""
    torch.manual_seed(0)
    for score in ("additive", "bilinear"):
        model = RNNSeq2Seq(RNNConfig(src_vocab_size=5, tgt_vocab_size=5, score=score, d_hidden=4, d_attn=3))
        scorer = model.attn.score
        s, h = torch.randn(1, 4), torch.randn(1, 1, 4)
        with torch.no_grad():
            if score == "additive":
                scorer.U.bias.zero_()
            ours = float(scorer(s, h, scorer.keys(h))[0, 0])
        if score == "additive":
            params = {"W1": scorer.W.weight, "W2": scorer.U.weight, "v": scorer.v.weight[0]}
        else:
            params = {"W": scorer.W.weight.T}  # nn.Linear holds W transposed
        steps = {x.name: x.value for x in score_functions(s[0], h[0, 0], **{k: v.detach() for k, v in params.items()})}
        assert ours == pytest.approx(steps[score], rel=1e-5)


@pytest.mark.parametrize("score", ["additive", "dot", "bilinear"])
def test_the_shipped_rnns_translate_held_out_sentences_and_align_their_words(score):
    model = tc.load_model(f"rnn-{score}", device="cpu")
    pairs = td.sample_pairs(40, 4_242, "held-out")
    outputs = rnn_translate(model, [p.source_text for p in pairs])
    assert sum(list(o) == list(p.target) for o, p in zip(outputs, pairs)) >= 38
    assert rnn_alignment_accuracy(model, pairs[:20]) > 0.9
    assert recorded(f"rnn-{score}")["evaluation"]["held_out_exact_match"] > 0.95


@pytest.mark.parametrize("name", ["sentiment-attention", "sentiment-mean", "rnn-additive", "rnn-dot", "rnn-bilinear"])
def test_the_new_model_cards_are_rendered_from_their_recorded_figures(name):
    from tformer_core.bundled import asset_dir, model_card
    from tformer_train import cards

    assert cards.render(asset_dir(name)) == model_card(name)
