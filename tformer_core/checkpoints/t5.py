"""T5 checkpoints (t5-small/base/..., t5 v1.1, flan-t5) into the core's `EncoderDecoder`.

T5 is pre-norm with RMSNorm (no mean, no bias), has no biases anywhere, no absolute positions,
and does not divide Q K^T by sqrt(d_k): its initialisation absorbs the scale, so the core runs
attention unscaled. Each stack adds a learned relative position bias, stored in block 0's
self-attention (`relative_attention_bias`), to the self-attention logits of every layer
(bidirectional buckets in the encoder, backward-only in the decoder); cross-attention gets none.

Two variants:
- original T5: ReLU FFN (wi, wo), output layer tied to the shared embedding, and the decoder output
  multiplied by d_model^-0.5 before it;
- v1.1 / flan-t5 (feed_forward_proj "gated-gelu"): hidden = gelu_tanh(x wi_0) * (x wi_1), then wo;
  a separate lm_head and no output scaling (config tie_word_embeddings=false).

As in transformers 5: the output scaling follows `scale_decoder_outputs` (else tie_word_embeddings),
and the output layer is tied unless the checkpoint holds an lm_head different from the embedding.
"""

from __future__ import annotations

from ..generation import GenerationSettings
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from .common import activation, build_module, generation_settings
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign, same_values

__all__ = ["MODEL_TYPES", "build", "generation_rules", "t5_config"]

MODEL_TYPES = ("t5",)


def _feed_forward(hf: dict) -> tuple[str, bool]:
    """(core activation, gated) from feed_forward_proj, as T5Config derives dense_act_fn."""
    proj = HFConfig(hf).text("feed_forward_proj", "relu")
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise CheckpointError(f"not supported yet: T5 feed_forward_proj {proj[:40]!r}")
    name = "gelu_new" if proj == "gated-gelu" else parts[-1]
    return activation(name, "feed_forward_proj"), len(parts) == 2


def _scales_output(hf: dict) -> bool:
    c = HFConfig(hf)
    if "scale_decoder_outputs" in c:
        return c.flag("scale_decoder_outputs", True)
    return c.flag("tie_word_embeddings", True)


def generation_rules(hf: dict, generation: dict | None = None) -> GenerationSettings:
    """Greedy-decoding rules from config.json and generation_config.json (`common.generation_settings`).

    T5 starts decoding from its padding token when the config names no decoder start token.
    """
    return generation_settings(hf, generation, default_start=HFConfig(hf).token_id("pad_token_id", 0))


def _stack_mapping(w: Weights, stack: str, n_layers: int, ffn: dict[str, str]) -> dict:
    """Core parameter name -> tensor for one T5 stack ("encoder" or "decoder")."""
    m = {}
    # stored once, in block 0's self-attention; the core's stack owns it
    relative = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    m[f"{stack}.rel_pos.embedding.weight"] = w[relative]
    m[f"{stack}.ln_final.weight"] = w[f"{stack}.final_layer_norm.weight"]
    for i in range(n_layers):
        theirs, ours = f"{stack}.block.{i}.layer.", f"{stack}.blocks.{i}."
        sublayers = [("attn", "ln_attn", "0.SelfAttention")]
        if stack == "decoder":
            sublayers.append(("cross_attn", "ln_cross", "1.EncDecAttention"))
        for attn, ln, name in sublayers:
            for o, t in (("W_q", "q"), ("W_k", "k"), ("W_v", "v"), ("W_o", "o")):
                m[f"{ours}{attn}.{o}.weight"] = w[f"{theirs}{name}.{t}.weight"]
            m[f"{ours}{ln}.weight"] = w[f"{theirs}{name.split('.')[0]}.layer_norm.weight"]
        ff = len(sublayers)  # the FFN sub-layer's index: 1 in the encoder, 2 in the decoder
        for o, t in ffn.items():
            m[f"{ours}{o}.weight"] = w[f"{theirs}{ff}.DenseReluDense.{t}.weight"]
        m[f"{ours}ln_mlp.weight"] = w[f"{theirs}{ff}.layer_norm.weight"]
    return m


def build(hf: dict, tensors: dict, generation: dict | None = None) -> EncoderDecoder:
    """The checkpoint's tensors in a core EncoderDecoder, with its greedy-decoding rules."""
    _feed_forward(hf)  # a variant the core cannot express is named before any tensor is looked for
    w = Weights(tensors)
    embedding = w["shared.weight"] if w.has("shared.weight") else w["encoder.embed_tokens.weight"]
    V, D = embedding.shape
    tied = True
    if w.has("lm_head.weight"):
        head = w["lm_head.weight"]
        tied = same_values(head, embedding)
    config = t5_config(hf, V, tied)
    if config.d_model != D:
        raise CheckpointError(f"shared.weight has width {D}, the config says d_model={config.d_model}")
    model = build_module(EncoderDecoder, config)
    m = {"encoder.embed.tok.weight": embedding}
    if not tied:
        m["head.unembed.weight"] = w["lm_head.weight"]
    # gated: hidden = act(x wi_0) * (x wi_1), the core's act(x W_gate) * (x W_in)
    ffn = {"mlp.W_in": "wi", "mlp.W_out": "wo"}
    if config.ffn_gated:
        ffn = {"mlp.W_gate": "wi_0", "mlp.W_in": "wi_1", "mlp.W_out": "wo"}
    for stack, n_layers in (("encoder", config.n_encoder_layers), ("decoder", config.n_decoder_layers)):
        m.update(_stack_mapping(w, stack, n_layers, ffn))
    assign(model, m, w)
    model.generation = generation_rules(hf, generation)
    return model


def t5_config(hf: dict, vocab_size: int, tied: bool) -> Seq2SeqConfig:
    """The core's config for a T5 config.json (the vocabulary and the output layer's tying come from the
    weights); every value checked (CheckpointError names the key)."""
    act, gated = _feed_forward(hf)
    c = HFConfig(hf)
    n_encoder = c.layers("num_layers")
    n_decoder = c.layers("num_decoder_layers", n_encoder)
    d_model = c.whole("d_model")
    return Seq2SeqConfig(
        src_vocab_size=vocab_size,
        tgt_vocab_size=vocab_size,
        max_positions=c.whole("n_positions", 512),
        n_encoder_layers=n_encoder,
        n_decoder_layers=n_decoder,
        d_model=d_model,
        n_heads=c.whole("num_heads", high=4096),
        d_head=c.whole("d_kv"),
        d_ff=c.whole("d_ff"),
        activation=act,
        ffn_gated=gated,
        norm="pre",
        norm_type="rmsnorm",
        ln_eps=c.number("layer_norm_epsilon", 1e-6),
        bias=False,
        scale_attention=False,
        positional="none",
        embed_scale=False,
        embed_norm=False,
        share_embeddings=True,
        tie_output=tied,
        output_bias=False,
        output_scale=d_model**-0.5 if _scales_output(hf) else 1.0,
        rel_pos_buckets=c.whole("relative_attention_num_buckets", 32, high=4096),
        rel_pos_max_distance=c.whole("relative_attention_max_distance", 128),
    )
