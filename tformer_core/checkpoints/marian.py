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
from .bart import check_post_norm, check_same_shape_stacks, layer_mapping, output_head, stack_sizes
from .common import build_module, generation_settings
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign

__all__ = ["MAX_TABLE", "MODEL_TYPES", "build", "generation_rules"]

# The sinusoid table is computed (in float64) when the model is built, even on the meta device: bounded
# here so that a config cannot ask for gigabytes of it. Marian's is 512 x 512; 16.8 million entries is 134 MB.
MAX_TABLE = 1 << 24

MODEL_TYPES = ("marian",)


def _check_saved_positions(w: Weights, config: Seq2SeqConfig) -> None:
    """Older checkpoints also store the sinusoid table; it must be the one the core computes."""
    expected = None
    for stack in ("encoder", "decoder"):
        name = f"{stack}.embed_positions.weight"
        if w.has(name):
            saved = w[name]
            if saved.is_meta:  # the dry run has shapes only; the real build compares the numbers
                continue
            if expected is None:
                table = sinusoidal_encoding(config.max_positions, config.d_model, layout="split")
                expected = torch.from_numpy(table).float()
            saved = saved.float()
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
    c = HFConfig(hf)
    if c.raw("normalize_embedding"):
        raise CheckpointError("not supported yet: Marian with normalize_embedding=true (transformers ignores it too)")
    if hf.get("static_position_embeddings") is False:
        raise CheckpointError("not supported yet: Marian with learned positions (static_position_embeddings=false)")
    w = Weights(tensors, prefixes=("model.",))
    shared = c.flag("share_encoder_decoder_embeddings", True)
    if shared:
        source = w["shared.weight"] if w.has("shared.weight") else w["encoder.embed_tokens.weight"]
        target = source
    else:
        source, target = w["encoder.embed_tokens.weight"], w["decoder.embed_tokens.weight"]
    tied, head = output_head(w, target, target.shape[0])
    sizes = stack_sizes(hf)
    if sizes["max_positions"] * sizes["d_model"] > MAX_TABLE:
        raise CheckpointError(
            f"config.json: max_position_embeddings x d_model = {sizes['max_positions'] * sizes['d_model']:,} "
            f"is more than the sinusoid table tformer computes (at most {MAX_TABLE:,} numbers)"
        )
    config = Seq2SeqConfig(
        src_vocab_size=source.shape[0],
        tgt_vocab_size=target.shape[0],
        **sizes,
        norm="post",
        ln_eps=1e-5,
        positional="sinusoidal",
        pe_base=10000.0,
        pe_layout="split",
        embed_norm=False,
        share_embeddings=shared,
        tie_output=tied,
        output_bias=True,
    )
    _check_saved_positions(w, config)
    model = build_module(EncoderDecoder, config)
    m = {"encoder.embed.tok.weight": source, **head}
    if not shared:
        m["decoder.embed.tok.weight"] = target
    m.update(layer_mapping(w, config.n_encoder_layers, config.n_decoder_layers))
    assign(model, m, w)
    model.generation = generation_rules(hf, generation)
    return model
