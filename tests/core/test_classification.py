"""Sequence classifiers of the BERT family (`*ForSequenceClassification`, e.g. a sentiment model) in the core
Encoder: logits, pooled vector and attention equal transformers' on the same weights; labels from id2label;
scores as transformers' text-classification pipeline computes them (no network)."""

import json

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.core.hf_helpers import assert_close, perturbed, roundtrip
from tformer_core.models.encoder import class_scores, first_token_attention

IDS = [2, 17, 33, 8, 61, 5, 90, 3]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _classifier(kind, **extra):
    common = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        attn_implementation="eager",
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
        **extra,
    )
    if kind == "bert":
        return T.BertForSequenceClassification(T.BertConfig(**common, type_vocab_size=2))
    if kind == "roberta":
        return T.RobertaForSequenceClassification(T.RobertaConfig(**common, type_vocab_size=1, pad_token_id=1))
    if kind == "xlm-roberta":
        config = T.XLMRobertaConfig(**common, type_vocab_size=1, pad_token_id=1)
        return T.XLMRobertaForSequenceClassification(config)
    distil = {k: v for k, v in common.items() if k not in ("hidden_size", "num_hidden_layers", "num_attention_heads")}
    distil.pop("intermediate_size")
    return T.DistilBertForSequenceClassification(
        T.DistilBertConfig(**distil, dim=32, n_layers=2, n_heads=4, hidden_dim=37)
    )


def _theirs(hf, ids=IDS):
    with torch.no_grad():
        return hf(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert", "xlm-roberta"])
def test_classifier_parity_with_transformers(kind, tmp_path):
    torch.manual_seed(0)
    hf = perturbed(_classifier(kind), scale=0.3)
    model = roundtrip(hf, tmp_path)
    assert isinstance(model, tc.Encoder) and model.config.n_labels == 3 and not model.config.mlm_head
    assert model.output_labels == ("negative", "neutral", "positive") and model.output_vocab_size == 0
    trace = model.trace(IDS)
    out = _theirs(hf)
    assert trace["head.logits"].shape == (3,)
    assert_close(trace["head.logits"], out.logits[0], what="classifier logits")
    assert_close(trace["encoder.out"], out.hidden_states[-1][0], what="final hidden states")
    for layer, weights in enumerate(out.attentions):
        assert_close(trace.attention(layer), weights[0], what=f"layer {layer} attention")
    # The pooled vector is the first token's, through the head's dense layer and its activation.
    dense = (
        hf.bert.pooler.dense if kind == "bert" else hf.pre_classifier if kind == "distilbert" else hf.classifier.dense
    )
    act = torch.relu if kind == "distilbert" else torch.tanh
    with torch.no_grad():
        pooled = act(dense(out.hidden_states[-1][0, 0]))
    assert trace["head.pooled"].shape == (32,)
    assert_close(trace["head.pooled"], pooled, what="pooled first token")
    assert trace.meta["head"] == "classification" and trace.meta["probabilities"] == "softmax"
    # Labels and probabilities, most probable first, as transformers' softmax gives them.
    p = torch.softmax(out.logits[0], -1).numpy()
    top = trace.predictions(k=3)
    assert [label for label, _ in top] == [LABELS[i] for i in np.argsort(-p)]
    np.testing.assert_allclose([q for _, q in top], np.sort(p)[::-1], atol=1e-5)
    scores = class_scores(trace)
    assert [label for label, _ in scores] == [label for label, _ in top]
    np.testing.assert_allclose([q for _, q in scores], [q for _, q in top], atol=1e-6)
    # The classifier's token: its attention in the last layer, per head, rows summing to 1.
    cls = first_token_attention(trace)
    assert cls.shape == (4, len(IDS))
    assert_close(cls, out.attentions[-1][0, :, 0, :], what="[CLS] attention, last layer")
    np.testing.assert_allclose(cls.sum(-1), 1.0, atol=1e-5)
    assert "head.logits" in trace.compact().names  # a cached trace keeps the classifier's output


def test_multi_label_scores_are_sigmoids_and_regression_is_the_number(tmp_path):
    torch.manual_seed(1)
    hf = perturbed(_classifier("bert", problem_type="multi_label_classification"), scale=0.3)
    model = roundtrip(hf, tmp_path / "multi")
    trace = model.trace(IDS)
    assert trace.meta["problem_type"] == "multi_label_classification" and trace.meta["probabilities"] == "sigmoid"
    logits = _theirs(hf).logits[0]
    scores = dict(class_scores(trace))
    np.testing.assert_allclose([scores[LABELS[i]] for i in range(3)], torch.sigmoid(logits).numpy(), atol=1e-5)

    torch.manual_seed(2)
    regression = T.BertForSequenceClassification(
        T.BertConfig(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=37,
            num_labels=1,
            problem_type="regression",
            attn_implementation="eager",
        )
    )
    model = roundtrip(perturbed(regression), tmp_path / "regression")
    trace = model.trace(IDS)
    [(label, value)] = class_scores(trace)
    assert trace.meta["probabilities"] == "none" and label == "LABEL_0"
    assert value == pytest.approx(float(_theirs(regression).logits[0, 0]), abs=1e-5)


def test_labels_that_do_not_fit_the_classifier_are_refused(tmp_path):
    torch.manual_seed(3)
    folder = tmp_path / "checkpoint"
    _classifier("roberta").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "negative", "1": "positive"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(tc.CheckpointError, match=r"id2label names 2 classes.*3 outputs"):
        tc.load_model(str(folder), device="cpu", model_dirs=[tmp_path])


def test_token_classifiers_load_as_the_encoder_alone(tmp_path):
    """A head the core does not show (per-token labels) is left out, not mistaken for a sequence classifier."""
    torch.manual_seed(4)
    config = T.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, num_labels=5
    )
    hf = perturbed(T.BertForTokenClassification(config))
    model = roundtrip(hf, tmp_path)
    assert model.config.n_labels == 0 and not model.config.mlm_head
    trace = model.trace(IDS)
    assert not trace.has_head
    with torch.no_grad():
        theirs = hf(torch.tensor([IDS]), output_hidden_states=True).hidden_states[-1][0]
    assert_close(trace["encoder.out"], theirs, what="final hidden states")


def test_classifier_config_checks():
    with pytest.raises(ValueError, match=r"^an encoder has one head: a masked-word head or a classifier, not both$"):
        tc.EncoderConfig(mlm_head=True, n_labels=2)
    with pytest.raises(ValueError, match=r"^2 labels given for 3 classes$"):
        tc.EncoderConfig(n_labels=3, labels=("a", "b"))
    model = tc.Encoder(tc.EncoderConfig(vocab_size=50, n_labels=2, d_model=16, n_heads=2))
    assert model.output_labels == ("LABEL_0", "LABEL_1")
    trace = model.trace([1, 2, 3])
    assert trace["head.logits"].shape == (2,) and sum(p for _, p in trace.predictions(2)) == pytest.approx(1.0)
