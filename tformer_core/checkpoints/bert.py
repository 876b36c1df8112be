"""BERT family checkpoints (BERT, RoBERTa, DistilBERT, MiniLM) into the core's `Encoder`.

All are post-norm encoders with learned positions and a LayerNorm on the embedding sum; they
differ in names, in RoBERTa's two reserved position rows, and in whether segments exist.
"""

from __future__ import annotations

from ..models.encoder import Encoder, EncoderConfig
from .common import activation
from .weights import CheckpointError, Weights, assign

MODEL_TYPES = ("bert", "roberta", "distilbert")


def _config(hf: dict, model_type: str, has_mlm_head: bool) -> EncoderConfig:
    if model_type == "distilbert":
        return EncoderConfig(
            vocab_size=hf["vocab_size"],
            max_positions=hf["max_position_embeddings"],
            n_layers=hf["n_layers"],
            d_model=hf["dim"],
            n_heads=hf["n_heads"],
            d_ff=hf["hidden_dim"],
            activation=activation(hf["activation"]),
            ln_eps=1e-12,
            n_token_types=0,
            mlm_head=has_mlm_head,
        )
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported yet")
    first_row = hf["pad_token_id"] + 1 if model_type == "roberta" else 0
    return EncoderConfig(
        vocab_size=hf["vocab_size"],
        max_positions=hf["max_position_embeddings"] - first_row,
        n_layers=hf["num_hidden_layers"],
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        activation=activation(hf["hidden_act"]),
        ln_eps=hf["layer_norm_eps"],
        n_token_types=hf.get("type_vocab_size", 0),
        position_first_row=first_row,
        mlm_head=has_mlm_head,
    )


def build(hf: dict, tensors: dict) -> Encoder:
    model_type = hf["model_type"]
    w = Weights(tensors, prefixes=(f"{model_type}.",))
    head_key = {
        "bert": "cls.predictions.transform.dense.weight",
        "roberta": "lm_head.dense.weight",
        "distilbert": "vocab_transform.weight",
    }[model_type]
    model = Encoder(_config(hf, model_type, w.has(head_key)))
    m: dict = {}
    if model_type == "distilbert":
        m["encoder.embed.tok.weight"] = w["embeddings.word_embeddings.weight"]
        m["encoder.embed.pos.weight"] = w["embeddings.position_embeddings.weight"]
        m["encoder.embed.ln.weight"], m["encoder.embed.ln.bias"] = (
            w["embeddings.LayerNorm.weight"],
            w["embeddings.LayerNorm.bias"],
        )
        names = {
            "attn.W_q": "attention.q_lin",
            "attn.W_k": "attention.k_lin",
            "attn.W_v": "attention.v_lin",
            "attn.W_o": "attention.out_lin",
            "ln_attn": "sa_layer_norm",
            "mlp.W_in": "ffn.lin1",
            "mlp.W_out": "ffn.lin2",
            "ln_mlp": "output_layer_norm",
        }
        layer = "transformer.layer.{i}."
    else:
        m["encoder.embed.tok.weight"] = w["embeddings.word_embeddings.weight"]
        m["encoder.embed.pos.weight"] = w["embeddings.position_embeddings.weight"]
        if model.config.n_token_types:
            m["encoder.embed.segment.weight"] = w["embeddings.token_type_embeddings.weight"]
        m["encoder.embed.ln.weight"], m["encoder.embed.ln.bias"] = (
            w["embeddings.LayerNorm.weight"],
            w["embeddings.LayerNorm.bias"],
        )
        names = {
            "attn.W_q": "attention.self.query",
            "attn.W_k": "attention.self.key",
            "attn.W_v": "attention.self.value",
            "attn.W_o": "attention.output.dense",
            "ln_attn": "attention.output.LayerNorm",
            "mlp.W_in": "intermediate.dense",
            "mlp.W_out": "output.dense",
            "ln_mlp": "output.LayerNorm",
        }
        layer = "encoder.layer.{i}."
    for i in range(model.config.n_layers):
        for ours, theirs in names.items():
            for p in ("weight", "bias"):
                m[f"encoder.blocks.{i}.{ours}.{p}"] = w[layer.format(i=i) + f"{theirs}.{p}"]
    if model.config.mlm_head:
        head = {
            "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
            "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
            "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"),
        }[model_type]
        for p in ("weight", "bias"):
            m[f"head.transform.{p}"] = w[f"{head[0]}.{p}"]
            m[f"head.ln.{p}"] = w[f"{head[1]}.{p}"]
        m["head.unembed.bias"] = w[head[2]]
    assign(model, m)
    return model


def attach_tokenizer(model: Encoder, tokenizer) -> None:
    model.tokenizer = tokenizer
    model.mask_token_id = tokenizer.mask_token_id
