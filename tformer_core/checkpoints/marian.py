"""Marian checkpoints (Helsinki-NLP/opus-mt-*) into the core's `EncoderDecoder`.

Marian is BART's layout without the embedding LayerNorm and with fixed sinusoidal positions in
the "split" layout (sines in the first half of the columns, cosines in the second; not saved in
the checkpoint), token embeddings * sqrt(d_model), SiLU ("swish") FFNs, a bias on the logits,
and decoding that starts from the padding token, which is never generated (bad_words_ids).
"""

from __future__ import annotations

import torch

from ..generation import GenerationSettings
from ..models.positional import sinusoidal_encoding
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from .bart import check_post_norm, check_same_shape_stacks, layer_mapping, output_head
from .common import activation, generation_settings
from .weights import CheckpointError, Weights, assign

MODEL_TYPES = ("marian",)


def _check_saved_positions(w: Weights, config: Seq2SeqConfig) -> None:
    """Older checkpoints also store the sinusoid table; it must be the one the core computes."""
    expected = torch.from_numpy(sinusoidal_encoding(config.max_positions, config.d_model, layout="split")).float()
    for stack in ("encoder", "decoder"):
        name = f"{stack}.embed_positions.weight"
        if w.has(name):
            saved = w[name].float()
            if saved.shape != expected.shape or not torch.allclose(saved, expected, atol=1e-4):
                raise CheckpointError(
                    f"not supported yet: this Marian checkpoint's {name} is not the split sinusoid table"
                )


def generation_rules(hf: dict, generation: dict | None = None) -> GenerationSettings:
    """Greedy-decoding rules from config.json and generation_config.json (`common.generation_settings`)."""
    return generation_settings(hf, generation)


def build(hf: dict, tensors: dict, generation: dict | None = None) -> EncoderDecoder:
    check_post_norm(hf, "Marian")
    check_same_shape_stacks(hf, "Marian")
    if hf.get("normalize_embedding"):
        raise CheckpointError("not supported yet: Marian with normalize_embedding=true (transformers ignores it too)")
    if hf.get("static_position_embeddings") is False:
        raise CheckpointError("not supported yet: Marian with learned positions (static_position_embeddings=false)")
    w = Weights(tensors, prefixes=("model.",))
    shared = hf.get("share_encoder_decoder_embeddings", True)
    if shared:
        source = w["shared.weight"] if w.has("shared.weight") else w["encoder.embed_tokens.weight"]
        target = source
    else:
        source, target = w["encoder.embed_tokens.weight"], w["decoder.embed_tokens.weight"]
    tied, head = output_head(w, target, target.shape[0])
    config = Seq2SeqConfig(
        src_vocab_size=source.shape[0],
        tgt_vocab_size=target.shape[0],
        max_positions=hf["max_position_embeddings"],
        n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        activation=activation(hf.get("activation_function", "gelu")),
        norm="post",
        ln_eps=1e-5,
        positional="sinusoidal",
        pe_base=10000.0,
        pe_layout="split",
        embed_scale=bool(hf.get("scale_embedding", False)),
        embed_norm=False,
        share_embeddings=shared,
        tie_output=tied,
        output_bias=True,
    )
    _check_saved_positions(w, config)
    model = EncoderDecoder(config)
    m = {"encoder.embed.tok.weight": source, **head}
    if not shared:
        m["decoder.embed.tok.weight"] = target
    m.update(layer_mapping(w, config.n_encoder_layers, config.n_decoder_layers))
    assign(model, m)
    model.generation = generation_rules(hf, generation)
    return model
