"""Llama-family checkpoints (Llama, Mistral, Qwen2, Qwen3; SmolLM is model_type "llama") into the core's
`Llama` decoder.

The Hugging Face layout: model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj (K and V with
num_key_value_heads heads), mlp.{gate,up,down}_proj (SwiGLU: down(silu(gate x) * up x)), input_layernorm and
post_attention_layernorm (RMSNorm), model.norm, lm_head (absent when tied to the embedding). Q and K are
stored in the "rotate halves" order (pair i = dimensions i and i + d_head / 2), the order the core rotates.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.llama import Llama, LlamaConfig
from ..models.positional import Rope
from .common import activation, build_module, generation_settings, on_meta
from .errors import CheckpointError
from .hfconfig import HFConfig
from .weights import Weights, assign

__all__ = ["MODEL_TYPES", "build", "llama_config", "rope_settings"]

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# transformers' defaults when config.json leaves max_position_embeddings out.
_MAX_POSITIONS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def build(hf: dict, tensors: dict, generation: dict | None = None) -> Llama:
    c = HFConfig(hf)
    model_type = c.text("model_type")
    config = llama_config(c, model_type, tied_by_absence="lm_head.weight" not in tensors)
    model = _unfilled(config)
    w = Weights(tensors, prefixes=("model.",))
    assign(model, _mapping(w, config), w)
    model.generation = generation_settings(hf, generation)
    return model


def _unfilled(config: LlamaConfig) -> Llama:
    """The model with memory for its parameters but no random initialisation: `assign` overwrites every one
    of them (135 M random numbers took seconds on 2 cores, most of a cold load)."""
    if torch.empty(0).device.type == "meta":  # the loader's dry run: nothing is allocated anyway
        return build_module(Llama, config)
    with on_meta():
        model = build_module(Llama, config)
    # Module.to_empty, without its empty_like on meta tensors (PyTorch's Python kernels: their first use imports
    # sympy, a second). The rotary frequencies are recomputed on the way.
    model = model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
    if config.tie_embeddings:  # to_empty gives each module its own tensor: tie them again
        model.head.unembed.weight = model.decoder.embed.tok.weight
    return model


def llama_config(c: HFConfig, model_type: str, tied_by_absence: bool = False) -> LlamaConfig:
    """The core's config for a Llama-family config.json; every value checked (CheckpointError names the key)."""
    D, n_heads = c.whole("hidden_size"), c.whole("num_attention_heads")
    n_kv = c.whole("num_key_value_heads", n_heads)
    if n_heads % n_kv:
        raise CheckpointError(
            f"config.json: num_key_value_heads ({n_kv}) must divide num_attention_heads ({n_heads}): "
            "each key/value head serves an equal group of query heads"
        )
    head_dim = c.whole("head_dim", None)
    if head_dim is None:
        c.heads_divide("num_attention_heads", n_heads, "hidden_size", D)
        head_dim = D // n_heads
    n_layers = c.layers("num_hidden_layers")
    max_positions = c.whole("max_position_embeddings", _MAX_POSITIONS[model_type])
    window, sliding_layers = _sliding(c, model_type, n_layers)
    qkv_bias = True if model_type == "qwen2" else c.flag("attention_bias", False)
    return LlamaConfig(
        vocab_size=c.whole("vocab_size"),
        max_positions=max_positions,
        n_layers=n_layers,
        d_model=D,
        n_heads=n_heads,
        n_kv_heads=n_kv if n_kv != n_heads else None,
        d_head=head_dim,
        d_ff=c.whole("intermediate_size"),
        activation=activation(c.text("hidden_act", "silu"), "hidden_act"),
        ln_eps=c.number("rms_norm_eps", 1e-6),
        bias=c.flag("mlp_bias", False),
        qkv_bias=qkv_bias,
        out_bias=False if model_type == "qwen2" else qkv_bias,
        qk_norm=model_type == "qwen3",
        rope=rope_settings(c, max_positions),
        tie_embeddings=c.flag("tie_word_embeddings", False) or tied_by_absence,
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def _sliding(c: HFConfig, model_type: str, n_layers: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(window, the layers that use it; None = every layer) as transformers applies them."""
    if model_type == "llama":
        return None, None
    if model_type == "mistral":  # one window for every layer, when set
        return c.whole("sliding_window", None), None
    layer_types = c.raw("layer_types")
    if layer_types is not None:
        if (
            not isinstance(layer_types, list)
            or len(layer_types) != n_layers
            or not set(layer_types) <= set(_LAYER_TYPES)
        ):
            raise c.fail("layer_types", f"must list {n_layers} of {_LAYER_TYPES}, one per layer")
        sliding = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    elif c.flag("use_sliding_window", False):  # Qwen: the layers from max_window_layers on
        first = c.whole("max_window_layers", n_layers, low=0, high=n_layers)
        sliding = tuple(range(first, n_layers))
    else:
        sliding = ()
    if not sliding:
        return None, None
    return c.whole("sliding_window"), sliding


def rope_settings(c: HFConfig, max_positions: int) -> Rope:
    """Rotary settings from rope_parameters (transformers 5) or rope_scaling and rope_theta (older files)."""
    params = c.raw("rope_parameters") or c.raw("rope_scaling") or {}
    key = "rope_parameters" if c.raw("rope_parameters") else "rope_scaling"
    if not isinstance(params, dict):
        raise c.fail(key, "must be a JSON object {...}")
    if any(isinstance(v, dict) for v in params.values()):
        raise c.fail(key, "gives rotary settings per kind of layer: not supported yet")
    r = HFConfig(params, f"config.json {key}")
    kind = r.text("rope_type", r.text("type", "default"))
    if kind not in ("default", "linear", "dynamic", "llama3", "yarn"):
        raise r.fail("rope_type", f"{kind[:30]!r} is not supported yet (default, linear, dynamic, llama3, yarn)")
    if r.number("partial_rotary_factor", c.number("partial_rotary_factor", 1.0)) != 1.0:
        raise r.fail("partial_rotary_factor", "below 1 (rotating part of each head) is not supported yet")
    fields: dict[str, Any] = {"theta": r.number("rope_theta", c.number("rope_theta", 10000.0)), "type": kind}
    if kind in ("llama3", "yarn"):
        original = c.whole("original_max_position_embeddings", None) or r.whole(
            "original_max_position_embeddings", max_positions
        )
        fields["original_max_positions"] = original
    if kind in ("linear", "dynamic", "llama3"):
        fields["factor"] = r.number("factor")
    if kind == "llama3":
        fields["low_freq_factor"] = r.number("low_freq_factor")
        fields["high_freq_factor"] = r.number("high_freq_factor")
    if kind == "yarn":
        fields["factor"] = r.number("factor", max_positions / fields["original_max_positions"])
        fields["attention_factor"] = r.number("attention_factor", None)
        fields["beta_fast"] = r.number("beta_fast", 32.0)
        fields["beta_slow"] = r.number("beta_slow", 1.0)
        fields["mscale"] = r.number("mscale", None, positive=False)
        fields["mscale_all_dim"] = r.number("mscale_all_dim", None, positive=False)
        fields["truncate"] = r.flag("truncate", True)
    return Rope(**fields)


def _mapping(w: Weights, config: LlamaConfig) -> dict:
    m = {"decoder.embed.tok.weight": w["embed_tokens.weight"], "decoder.ln_final.weight": w["norm.weight"]}
    if not config.tie_embeddings:
        m["head.unembed.weight"] = w["lm_head.weight"]
    for i in range(config.n_layers):
        h, b = f"layers.{i}.", f"decoder.blocks.{i}."
        for ours, theirs in (("W_q", "q_proj"), ("W_k", "k_proj"), ("W_v", "v_proj"), ("W_o", "o_proj")):
            m[f"{b}attn.{ours}.weight"] = w[f"{h}self_attn.{theirs}.weight"]
            if config.out_bias if ours == "W_o" else config.qkv_bias:
                m[f"{b}attn.{ours}.bias"] = w[f"{h}self_attn.{theirs}.bias"]
        for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
            m[f"{b}mlp.{ours}.weight"] = w[f"{h}mlp.{theirs}.weight"]
            if config.bias:
                m[f"{b}mlp.{ours}.bias"] = w[f"{h}mlp.{theirs}.bias"]
        if config.qk_norm:
            m[f"{b}attn.q_norm.weight"] = w[f"{h}self_attn.q_norm.weight"]
            m[f"{b}attn.k_norm.weight"] = w[f"{h}self_attn.k_norm.weight"]
        m[f"{b}ln_attn.weight"] = w[f"{h}input_layernorm.weight"]
        m[f"{b}ln_mlp.weight"] = w[f"{h}post_attention_layernorm.weight"]
    return m
