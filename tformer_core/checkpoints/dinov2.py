"""DINOv2 checkpoints, with and without registers (transformers' `Dinov2Model`, `Dinov2WithRegistersModel`), into
the core's `ViT`.

What differs from a ViT's checkpoint:
- the picture's size: config.json's image_size (518 for Meta's checkpoints) is the size the position table was
  trained at; the model reads what preprocessor_config.json hands it (224 pixels, cropped), and the table is resized
  to that grid in every pass (`layers.resized_positions`);
- register tokens (`embeddings.register_tokens`, [1, R, D]) after the class token, without a position;
- layer scale: each sub-layer's output is multiplied by a learned vector before it joins the residual stream,
  x + lambda * f(x). The core folds lambda into W_O and W_out (and their biases) as it loads them: the same sums,
  and `attn.out` / `mlp.out` stay what each sub-layer adds to the residual stream, as in every other family, so
  the views that split the stream into its parts read them unchanged;
- an optional SwiGLU feed-forward (`use_swiglu_ffn`): `weights_in` holds the gate's rows, then the input's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..inputs.preprocessing import ImagePreprocessing
from ..models.vit import ViT, ViTConfig
from .common import activation, build_module
from .errors import CheckpointError
from .hfconfig import HFConfig
from .vit import PREPROCESSOR, config_image_size, encoder_ends
from .weights import Weights, assign

__all__ = ["MODEL_TYPES", "build", "dinov2_config", "picture_size", "swiglu_width"]

MODEL_TYPES = ("dinov2", "dinov2_with_registers")

# Each core parameter of a block, and its name in a Hugging Face DINOv2 layer (the names its checkpoints and
# save_pretrained use; transformers renames them as it loads).
LAYER = {
    "attn.W_q": "attention.attention.query",
    "attn.W_k": "attention.attention.key",
    "attn.W_v": "attention.attention.value",
    "ln_attn": "norm1",
    "ln_mlp": "norm2",
}


def picture_size(c: HFConfig, preprocessor: dict | None) -> int | tuple[int, int]:
    """The pictures' size the model reads, in pixels: what preprocessor_config.json hands it (its crop, or an
    exact resize); config.json's image_size when it has none, or when it resizes to a varying size."""
    if preprocessor:
        try:
            pre = ImagePreprocessing.from_hf(preprocessor, 224)
        except (TypeError, KeyError, ValueError, AttributeError) as error:
            raise CheckpointError(f"{PREPROCESSOR} cannot be read as a picture preprocessing") from error
        if pre.crop is not None:
            return int(pre.crop[0]), int(pre.crop[1])
        if pre.resize is not None and pre.resize[0] == "exact":
            height, width = pre.resize[1]
            return int(height), int(width)
    return config_image_size(c)


def swiglu_width(d_model: int, mlp_ratio: float) -> int:
    """SwiGLU's hidden width as DINOv2 sizes it: two thirds of d_model * mlp_ratio, rounded up to a multiple of 8
    (384 * 4 -> 1024)."""
    hidden = int(d_model * mlp_ratio)
    return (int(hidden * 2 / 3) + 7) // 8 * 8


def dinov2_config(c: HFConfig, preprocessor: dict | None, registers: bool) -> ViTConfig:
    """The core's config for a DINOv2 config.json (`registers`: DINOv2 with registers' config.json) read at the
    size preprocessor_config.json gives, checked."""
    d_model, n_heads = c.whole("hidden_size"), c.whole("num_attention_heads")
    c.heads_divide("num_attention_heads", n_heads, "hidden_size", d_model)
    patch = c.whole("patch_size", high=1 << 14)
    trained = config_image_size(c)
    trained_hw = (trained, trained) if isinstance(trained, int) else trained
    pos_grid = (trained_hw[0] // patch, trained_hw[1] // patch)  # as transformers sizes the table: whole patches
    if min(pos_grid) < 1:
        raise c.fail("image_size", f"is smaller than one patch of {patch} pixels")
    size = picture_size(c, preprocessor)
    size_hw = (size, size) if isinstance(size, int) else size
    for side in size_hw:
        if side % patch:
            raise CheckpointError(
                f"{PREPROCESSOR}: the model reads pictures of {size_hw[0]}x{size_hw[1]} pixels, "
                f"not a whole number of patches of patch_size {patch} pixels"
            )
    ratio = c.number("mlp_ratio", 4)
    swiglu = c.flag("use_swiglu_ffn", False)
    hidden = swiglu_width(d_model, ratio) if swiglu else int(d_model * ratio)
    if hidden < 1:
        raise c.fail("mlp_ratio", "gives a feed-forward layer of no width")
    grid = (size_hw[0] // patch, size_hw[1] // patch)
    return ViTConfig(
        image_size=size,
        patch_size=patch,
        n_channels=c.whole("num_channels", 3, high=64),
        n_layers=c.layers("num_hidden_layers"),
        d_model=d_model,
        n_heads=n_heads,
        d_ff=hidden,
        activation="silu" if swiglu else activation(c.text("hidden_act", "gelu"), "hidden_act"),
        ffn_gated=swiglu,
        qkv_bias=c.flag("qkv_bias", True),
        ln_eps=c.number("layer_norm_eps", 1e-6),
        n_classes=0,
        n_registers=c.whole("num_register_tokens", 4, low=0, high=1024) if registers else 0,
        pos_grid=None if pos_grid == grid else pos_grid,
        pos_antialias=registers,  # transformers' DINOv2 with registers resizes with antialias, DINOv2 without
    )


def build(hf: dict, tensors: dict, generation: dict | None = None, preprocessor: dict | None = None) -> ViT:
    """The checkpoint's tensors in a core ViT without a class head (a DINOv2 backbone: its output is the final
    hidden states); `preprocessor`: preprocessor_config.json's values (the picture's size), None without one."""
    c = HFConfig(hf)
    w = Weights(tensors, prefixes=(f"{hf['model_type']}.",))
    if w.has("classifier.weight"):
        raise CheckpointError(
            "DINOv2 with a classification head (a linear layer on the class token and the patches' mean) is not "
            "supported yet: load the backbone (facebook/dinov2-small, facebook/dinov2-with-registers-small, ...)"
        )
    config = dinov2_config(c, preprocessor, hf["model_type"] == "dinov2_with_registers")
    model = build_module(ViT, config)
    m = encoder_ends(w)
    if config.n_registers:
        m["encoder.embed.registers"] = w["embeddings.register_tokens"]
    for i in range(config.n_layers):
        m.update(_layer(w, i, config))
    assign(model, m, w)
    return model


def _layer(w: Weights, i: int, config: ViTConfig) -> dict[str, torch.Tensor]:
    """Layer i's tensors by core name, layer scale folded into W_O and W_out: lambda * (x W + b) = x (W lambda)
    + b lambda, with lambda [D] scaling each output feature (a row of the Linear's weight)."""
    theirs = f"encoder.layer.{i}"
    ours = f"encoder.blocks.{i}"
    m: dict[str, Any] = {}
    for core, name in LAYER.items():
        for p in ("weight", "bias"):
            if p == "bias" and core in ("attn.W_q", "attn.W_k", "attn.W_v") and not config.qkv_bias:
                continue
            m[f"{ours}.{core}.{p}"] = w[f"{theirs}.{name}.{p}"]
    scale_attn, scale_mlp = w[f"{theirs}.layer_scale1.lambda1"], w[f"{theirs}.layer_scale2.lambda1"]
    if config.ffn_gated:
        gate_and_in = w[f"{theirs}.mlp.weights_in.weight"]  # (2F, D): the gate's rows, then the input's
        gate_and_in_bias = w[f"{theirs}.mlp.weights_in.bias"]
        F = config.d_ff
        if gate_and_in.shape[0] != 2 * F or tuple(gate_and_in_bias.shape) != (2 * F,):
            raise CheckpointError(
                f"the tensor {theirs}.mlp.weights_in is {tuple(gate_and_in.shape)}, but config.json implies "
                f"({2 * F}, {config.d_model}): the weights and the config do not belong together"
            )
        m[f"{ours}.mlp.W_gate.weight"], m[f"{ours}.mlp.W_in.weight"] = gate_and_in[:F], gate_and_in[F:]
        m[f"{ours}.mlp.W_gate.bias"], m[f"{ours}.mlp.W_in.bias"] = gate_and_in_bias[:F], gate_and_in_bias[F:]
        mlp_out = f"{theirs}.mlp.weights_out"
    else:
        m[f"{ours}.mlp.W_in.weight"], m[f"{ours}.mlp.W_in.bias"] = (
            w[f"{theirs}.mlp.fc1.weight"],
            w[f"{theirs}.mlp.fc1.bias"],
        )
        mlp_out = f"{theirs}.mlp.fc2"
    for core, name, scale in (
        ("attn.W_o", f"{theirs}.attention.output.dense", scale_attn),
        ("mlp.W_out", mlp_out, scale_mlp),
    ):
        weight, bias = w[f"{name}.weight"], w[f"{name}.bias"]
        if tuple(scale.shape) != (weight.shape[0],):
            raise CheckpointError(
                f"the layer scale of {theirs} is {tuple(scale.shape)}, but its output is {weight.shape[0]} wide: "
                "the weights and the config do not belong together"
            )
        m[f"{ours}.{core}.weight"] = weight * scale[:, None]  # (D, in): row j scaled by lambda_j
        m[f"{ours}.{core}.bias"] = bias * scale
    return m
