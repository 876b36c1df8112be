"""BART checkpoints (facebook/bart-*, distilbart) into the core's `EncoderDecoder`.

BART is the original post-norm Transformer with learned positions (two reserved rows: position p
reads row p + 2), a LayerNorm on each stack's embedding sum (`layernorm_embedding`), one token
embedding shared by encoder, decoder and (usually) the output layer, and a bias on the logits
(`final_logits_bias`, zeros when the checkpoint leaves it out).

Marian uses the same layer names; `marian.py` reuses `layer_mapping`, `output_head` and
the post-norm and same-shape checks from here.
"""

from __future__ import annotations

import torch

from ..generation import GenerationSettings
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from .common import activation, build_module, generation_settings
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign, same_values

__all__ = [
    "MODEL_TYPES",
    "build",
    "check_post_norm",
    "check_same_shape_stacks",
    "generation_rules",
    "layer_mapping",
    "output_head",
    "stack_sizes",
]

MODEL_TYPES = ("bart",)

# core attention part -> Hugging Face module, per attention kind
_ATTENTION = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "out_proj"}


def check_same_shape_stacks(hf: dict, family: str) -> None:
    """The core builds encoder and decoder blocks from one config: heads and FFN width must agree."""
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(enc) != hf.get(dec):
            raise CheckpointError(
                f"not supported yet: {family} with {enc}={hf.get(enc)} but {dec}={hf.get(dec)} "
                "(the core uses one block shape for encoder and decoder)"
            )


def check_post_norm(hf: dict, family: str) -> None:
    """BART and Marian are post-norm; the pre-norm variants (mBART-style flags) are another architecture."""
    for key in ("normalize_before", "add_final_layer_norm"):
        if hf.get(key):
            raise CheckpointError(f"not supported yet: {family} with {key}=true (a pre-norm variant)")


def layer_mapping(w: Weights, n_encoder_layers: int, n_decoder_layers: int) -> dict[str, torch.Tensor]:
    """Blocks of both stacks: BART's and Marian's names -> the core's parameter names."""
    m: dict[str, torch.Tensor] = {}
    for stack, n_layers in (("encoder", n_encoder_layers), ("decoder", n_decoder_layers)):
        parts = {
            "attn": "self_attn",
            "ln_attn": "self_attn_layer_norm",
            "mlp.W_in": "fc1",
            "mlp.W_out": "fc2",
            "ln_mlp": "final_layer_norm",
        }
        if stack == "decoder":
            parts.update({"cross_attn": "encoder_attn", "ln_cross": "encoder_attn_layer_norm"})
        for i in range(n_layers):
            theirs_prefix, ours_prefix = f"{stack}.layers.{i}.", f"{stack}.blocks.{i}."
            for ours, theirs in parts.items():
                if ours in ("attn", "cross_attn"):
                    modules = {f"{ours}.{o}": f"{theirs}.{t}" for o, t in _ATTENTION.items()}
                else:
                    modules = {ours: theirs}
                for o, t in modules.items():
                    for p in ("weight", "bias"):
                        m[f"{ours_prefix}{o}.{p}"] = w[f"{theirs_prefix}{t}.{p}"]
    return m


def output_head(w: Weights, embedding: torch.Tensor, vocab_size: int) -> tuple[bool, dict[str, torch.Tensor]]:
    """(tie_output, mapping of the head): lm_head is tied unless the checkpoint holds a different matrix.

    final_logits_bias is a buffer that transformers fills with zeros when a checkpoint lacks it.
    """
    m: dict[str, torch.Tensor] = {}
    tied = True
    if w.has("lm_head.weight"):
        head = w["lm_head.weight"]
        if not same_values(head, embedding):
            tied = False
            m["head.unembed.weight"] = head
    if w.has("final_logits_bias"):
        m["head.unembed.bias"] = w["final_logits_bias"].reshape(-1)
    else:
        m["head.unembed.bias"] = torch.zeros(vocab_size, dtype=embedding.dtype)
    return tied, m


def generation_rules(hf: dict, generation: dict | None = None) -> GenerationSettings:
    """Greedy-decoding rules from config.json and generation_config.json (`common.generation_settings`)."""
    return generation_settings(hf, generation)


def stack_sizes(hf: dict) -> dict:
    """The Seq2SeqConfig sizes BART and Marian read from config.json, checked."""
    c = HFConfig(hf)
    d_model, n_heads = c.whole("d_model"), c.whole("encoder_attention_heads")
    c.heads_divide("encoder_attention_heads", n_heads, "d_model", d_model)
    return dict(
        max_positions=c.whole("max_position_embeddings"),
        n_encoder_layers=c.layers("encoder_layers"),
        n_decoder_layers=c.layers("decoder_layers"),
        d_model=d_model,
        n_heads=n_heads,
        d_ff=c.whole("encoder_ffn_dim"),
        activation=activation(c.text("activation_function", "gelu"), "activation_function"),
        embed_scale=c.flag("scale_embedding", False),
    )


def build(hf: dict, tensors: dict, generation: dict | None = None) -> EncoderDecoder:
    check_post_norm(hf, "BART")
    check_same_shape_stacks(hf, "BART")
    w = Weights(tensors, prefixes=("model.",))
    embedding = w["shared.weight"] if w.has("shared.weight") else w["encoder.embed_tokens.weight"]
    V = embedding.shape[0]
    tied, head = output_head(w, embedding, V)
    config = Seq2SeqConfig(
        src_vocab_size=V,
        tgt_vocab_size=V,
        **stack_sizes(hf),
        norm="post",
        ln_eps=1e-5,
        positional="learned",
        position_first_row=2,
        embed_norm=True,
        share_embeddings=True,
        tie_output=tied,
        output_bias=True,
    )
    model = build_module(EncoderDecoder, config)
    m = {"encoder.embed.tok.weight": embedding, **head}
    for stack in ("encoder", "decoder"):
        m[f"{stack}.embed.pos.weight"] = w[f"{stack}.embed_positions.weight"]
        m[f"{stack}.embed.ln.weight"] = w[f"{stack}.layernorm_embedding.weight"]
        m[f"{stack}.embed.ln.bias"] = w[f"{stack}.layernorm_embedding.bias"]
    m.update(layer_mapping(w, config.n_encoder_layers, config.n_decoder_layers))
    assign(model, m, w)
    model.generation = generation_rules(hf, generation)
    return model
