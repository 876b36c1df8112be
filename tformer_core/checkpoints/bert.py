"""BERT family checkpoints (BERT, RoBERTa, DistilBERT, MiniLM, XLM-R, CamemBERT) into the core's `Encoder`.

All are post-norm encoders with learned positions and a LayerNorm on the embedding sum; they
differ in names, in RoBERTa's two reserved position rows, and in whether segments exist.

Heads: a masked-word head (`*ForMaskedLM`) or a sequence classifier (`*ForSequenceClassification`,
e.g. a sentiment model: BERT's pooler and classifier, RoBERTa's classifier.dense and out_proj,
DistilBERT's pre_classifier and classifier), with its labels from config.json's id2label. Other heads
(token classification, question answering, next-sentence prediction) are left out: the encoder is shown.
"""

from __future__ import annotations

from ..models.encoder import PROBLEM_TYPES, Encoder, EncoderConfig
from .common import activation, build_module
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign

__all__ = ["CLASSIFIERS", "LAYERS", "MLM_HEADS", "MODEL_TYPES", "ROBERTA_LIKE", "build", "encoder_config"]

MODEL_TYPES = ("bert", "roberta", "distilbert", "xlm-roberta", "camembert")
# Checkpoints that are RoBERTa under another name (their weights sit under "roberta.").
ROBERTA_LIKE = ("xlm-roberta", "camembert")


def encoder_config(hf: dict, model_type: str, has_mlm_head: bool, head: dict) -> EncoderConfig:
    """The core config; `head` holds the classifier's fields (n_labels, labels, ...) or is empty."""
    c = HFConfig(hf)
    if model_type == "distilbert":
        d_model, n_heads = c.whole("dim"), c.whole("n_heads")
        c.heads_divide("n_heads", n_heads, "dim", d_model)
        return EncoderConfig(
            **head,
            vocab_size=c.whole("vocab_size"),
            max_positions=c.whole("max_position_embeddings"),
            n_layers=c.layers("n_layers"),
            d_model=d_model,
            n_heads=n_heads,
            d_ff=c.whole("hidden_dim"),
            activation=activation(c.text("activation", "gelu"), "activation"),
            ln_eps=1e-12,
            n_token_types=0,
            mlm_head=has_mlm_head,
        )
    position_type = c.text("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise CheckpointError(f"config.json: position_embedding_type {position_type[:40]!r} is not supported yet")
    # RoBERTa's position rows start after its padding id (rows 0..pad are never used).
    first_row = c.token_id("pad_token_id", 0) + 1 if model_type == "roberta" else 0
    max_positions = c.whole("max_position_embeddings")
    if max_positions <= first_row:
        raise CheckpointError(
            f"config.json: max_position_embeddings ({max_positions}) leaves no position after the "
            f"{first_row} reserved rows (pad_token_id + 1)"
        )
    d_model, n_heads = c.whole("hidden_size"), c.whole("num_attention_heads")
    c.heads_divide("num_attention_heads", n_heads, "hidden_size", d_model)
    return EncoderConfig(
        **head,
        vocab_size=c.whole("vocab_size"),
        max_positions=max_positions - first_row,
        n_layers=c.layers("num_hidden_layers"),
        d_model=d_model,
        n_heads=n_heads,
        d_ff=c.whole("intermediate_size"),
        activation=activation(c.text("hidden_act"), "hidden_act"),
        ln_eps=c.number("layer_norm_eps"),
        n_token_types=c.whole("type_vocab_size", 0, low=0),
        position_first_row=first_row,
        mlm_head=has_mlm_head,
    )


# Per family: where each layer's tensors are, and each core parameter's name there.
_BERT_LAYER = {
    "attn.W_q": "attention.self.query",
    "attn.W_k": "attention.self.key",
    "attn.W_v": "attention.self.value",
    "attn.W_o": "attention.output.dense",
    "ln_attn": "attention.output.LayerNorm",
    "mlp.W_in": "intermediate.dense",
    "mlp.W_out": "output.dense",
    "ln_mlp": "output.LayerNorm",
}
_DISTILBERT_LAYER = {
    "attn.W_q": "attention.q_lin",
    "attn.W_k": "attention.k_lin",
    "attn.W_v": "attention.v_lin",
    "attn.W_o": "attention.out_lin",
    "ln_attn": "sa_layer_norm",
    "mlp.W_in": "ffn.lin1",
    "mlp.W_out": "ffn.lin2",
    "ln_mlp": "output_layer_norm",
}
LAYERS = {
    "bert": ("encoder.layer.{i}.", _BERT_LAYER),
    "roberta": ("encoder.layer.{i}.", _BERT_LAYER),
    "distilbert": ("transformer.layer.{i}.", _DISTILBERT_LAYER),
}
# Masked-word heads: (dense transform, its LayerNorm, the output bias).
MLM_HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
    "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"),
}


# Sequence classifiers: (the first token's dense layer, the output layer); the activation between them.
CLASSIFIERS = {
    "bert": ("pooler.dense", "classifier", "tanh"),
    "roberta": ("classifier.dense", "classifier.out_proj", "tanh"),
    "distilbert": ("pre_classifier", "classifier", "relu"),
}
_OTHER_HEADS = ("ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice", "ForNextSentencePrediction")


def _classifier(hf: dict, model_type: str, w: Weights) -> dict:
    """The EncoderConfig fields of the checkpoint's sequence classifier, or {} when it has none.

    BERT's pooler is saved by plain BertModel checkpoints too: a classifier needs its output layer, and
    config.json's architectures, when given, must not name another head that has one (token
    classification, multiple choice)."""
    pool, out, act = CLASSIFIERS[model_type]
    architectures = hf.get("architectures") or []
    other = any(isinstance(a, str) and a.endswith(_OTHER_HEADS) for a in architectures)
    if other or not (w.has(f"{pool}.weight") and w.has(f"{out}.weight")):
        return {}
    n_labels = w[f"{out}.weight"].shape[0]
    c = HFConfig(hf)
    problem_type = c.text("problem_type", "")
    if problem_type not in PROBLEM_TYPES:
        raise CheckpointError(f"config.json: problem_type {problem_type[:40]!r} is not one transformers knows")
    return {"n_labels": n_labels, "pool_activation": act, "labels": _labels(c, n_labels), "problem_type": problem_type}


def _labels(c: HFConfig, n_labels: int) -> tuple[str, ...]:
    """id2label as a tuple (class i's name at i); config.json's keys are the ids as text ("0", "1", ...)."""
    table = c.raw("id2label", {})
    if not isinstance(table, dict):
        raise c.fail("id2label", "must be a table of class ids and names")
    if not table:
        return ()
    names: dict[int, str] = {}
    for key, name in table.items():
        try:
            names[int(key)] = str(name)
        except (TypeError, ValueError) as error:
            raise c.fail("id2label", f"has the key {str(key)[:20]!r}, which is not a class id") from error
    if sorted(names) != list(range(n_labels)):
        raise CheckpointError(
            f"config.json: id2label names {len(names)} classes ({min(names)} to {max(names)}), but the "
            f"classifier has {n_labels} outputs: the labels and the weights do not belong together"
        )
    return tuple(names[i][:200] for i in range(n_labels))


def build(hf: dict, tensors: dict, generation: dict | None = None) -> Encoder:
    """The checkpoint's tensors in a core Encoder (generation_config.json plays no part in an encoder)."""
    model_type = "roberta" if hf["model_type"] in ROBERTA_LIKE else hf["model_type"]
    w = Weights(tensors, prefixes=(f"{model_type}.",))
    head = _classifier(hf, model_type, w)
    mlm = not head and w.has(MLM_HEADS[model_type][0] + ".weight")
    model = build_module(Encoder, encoder_config(hf, model_type, mlm, head))
    m: dict = {
        "encoder.embed.tok.weight": w["embeddings.word_embeddings.weight"],
        "encoder.embed.pos.weight": w["embeddings.position_embeddings.weight"],
        "encoder.embed.ln.weight": w["embeddings.LayerNorm.weight"],
        "encoder.embed.ln.bias": w["embeddings.LayerNorm.bias"],
    }
    if model.config.n_token_types:  # BERT's segments (DistilBERT has none)
        m["encoder.embed.segment.weight"] = w["embeddings.token_type_embeddings.weight"]
    layer, names = LAYERS[model_type]
    for i in range(model.config.n_layers):
        for ours, theirs in names.items():
            for p in ("weight", "bias"):
                m[f"encoder.blocks.{i}.{ours}.{p}"] = w[layer.format(i=i) + f"{theirs}.{p}"]
    if model.config.mlm_head:
        dense, norm, bias = MLM_HEADS[model_type]
        for p in ("weight", "bias"):
            m[f"head.transform.{p}"] = w[f"{dense}.{p}"]
            m[f"head.ln.{p}"] = w[f"{norm}.{p}"]
        m["head.unembed.bias"] = w[bias]
    if model.config.n_labels:
        pool, out, _ = CLASSIFIERS[model_type]
        for ours, theirs in (("pool", pool), ("classify", out)):
            for p in ("weight", "bias"):
                m[f"head.{ours}.{p}"] = w[f"{theirs}.{p}"]
    assign(model, m, w)
    return model
