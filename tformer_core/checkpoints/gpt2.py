"""GPT-2 family checkpoints into the core's `Decoder`.

GPT-2 stores its projections as Conv1D, y = x W + b with W [in, out]: the transpose of a Linear
weight. Q, K and V are one matrix c_attn [D, 3D], split here into W^Q, W^K, W^V.
"""

from __future__ import annotations

from ..generation import GenerationSettings
from ..models.decoder import Decoder, DecoderConfig
from .common import activation, build_module
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign

__all__ = ["MODEL_TYPES", "build", "config"]

MODEL_TYPES = ("gpt2",)


def config(c: HFConfig) -> DecoderConfig:
    """The core's config for a GPT-2 config.json, every value checked (CheckpointError names the key)."""
    if c.flag("scale_attn_by_inverse_layer_idx", False) or not c.flag("scale_attn_weights", True):
        raise CheckpointError("this GPT-2 variant scales attention differently: not supported yet")
    D, n_heads = c.whole("n_embd"), c.whole("n_head")
    c.heads_divide("n_head", n_heads, "n_embd", D)
    return DecoderConfig(
        vocab_size=c.whole("vocab_size"),
        max_positions=c.whole("n_positions"),
        n_layers=c.layers("n_layer"),
        d_model=D,
        n_heads=n_heads,
        d_ff=c.whole("n_inner", 4 * D),
        activation=activation(c.text("activation_function"), "activation_function"),
        ln_eps=c.number("layer_norm_epsilon"),
        norm="pre",
        tie_embeddings=True,
    )


def build(hf: dict, tensors: dict, generation: dict | None = None) -> Decoder:
    c = HFConfig(hf)
    model = build_module(Decoder, config(c))
    w = Weights(tensors, prefixes=("transformer.",))
    m = {
        "decoder.embed.tok.weight": w["wte.weight"],
        "decoder.embed.pos.weight": w["wpe.weight"],
        "decoder.ln_final.weight": w["ln_f.weight"],
        "decoder.ln_final.bias": w["ln_f.bias"],
    }
    for i in range(model.config.n_layers):
        h, b = f"h.{i}.", f"decoder.blocks.{i}."
        q, k, v = w[h + "attn.c_attn.weight"].t().chunk(3, dim=0)  # each (D, D) as Linear weights
        qb, kb, vb = w[h + "attn.c_attn.bias"].chunk(3)
        m.update(
            {
                b + "attn.W_q.weight": q,
                b + "attn.W_k.weight": k,
                b + "attn.W_v.weight": v,
                b + "attn.W_q.bias": qb,
                b + "attn.W_k.bias": kb,
                b + "attn.W_v.bias": vb,
                b + "attn.W_o.weight": w[h + "attn.c_proj.weight"].t(),
                b + "attn.W_o.bias": w[h + "attn.c_proj.bias"],
                b + "mlp.W_in.weight": w[h + "mlp.c_fc.weight"].t(),
                b + "mlp.W_in.bias": w[h + "mlp.c_fc.bias"],
                b + "mlp.W_out.weight": w[h + "mlp.c_proj.weight"].t(),
                b + "mlp.W_out.bias": w[h + "mlp.c_proj.bias"],
            }
        )
        for ours, theirs in (("ln_attn", "ln_1"), ("ln_mlp", "ln_2")):
            m[b + f"{ours}.weight"], m[b + f"{ours}.bias"] = w[h + f"{theirs}.weight"], w[h + f"{theirs}.bias"]
    assign(model, m, w)
    model.generation = GenerationSettings(eos_id=c.token_id("eos_token_id"), max_new_tokens=20)
    return model
