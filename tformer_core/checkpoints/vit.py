"""ViT and DeiT checkpoints into the core's `ViT`.

The checkpoint's patch embedding is a Conv2d with kernel = stride = P, weight (D, C, P, P); the
core flattens patches channel-first, so the same numbers become a Linear weight (D, C*P*P).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..inputs.preprocessing import ImagePreprocessing
from ..models.vit import ViT, ViTConfig
from .common import activation, build_module
from .errors import CheckpointError
from .hfconfig import HFConfig, read_json
from .weights import Weights, assign

__all__ = [
    "LAYER",
    "MODEL_TYPES",
    "PREPROCESSOR",
    "build",
    "config_image_size",
    "encoder_ends",
    "encoder_fields",
    "preprocessing",
    "vit_config",
]

MODEL_TYPES = ("vit", "deit")


# Each core parameter of a block, and its name in a Hugging Face ViT / DeiT layer.
LAYER = {
    "attn.W_q": "attention.attention.query",
    "attn.W_k": "attention.attention.key",
    "attn.W_v": "attention.attention.value",
    "attn.W_o": "attention.output.dense",
    "ln_attn": "layernorm_before",
    "ln_mlp": "layernorm_after",
    "mlp.W_in": "intermediate.dense",
    "mlp.W_out": "output.dense",
}


def config_image_size(c: HFConfig) -> int | tuple[int, int]:
    """config.json's image_size: one side (square pictures) or [height, width], in pixels."""
    size = c.raw("image_size")
    if isinstance(size, (list, tuple)):
        if len(size) != 2:
            raise c.fail("image_size", "must be one number or [height, width]")
        height, width = (HFConfig({"image_size": side}).whole("image_size", high=1 << 14) for side in size)
        return height, width
    return c.whole("image_size", high=1 << 14)


def _heads(w: Weights) -> tuple[str | None, str | None]:
    """The names of the classifier and of DeiT's distillation classifier in the checkpoint (None: absent)."""
    if w.has("cls_classifier.weight"):  # DeiT "with teacher": mean of the class and distillation heads
        return "cls_classifier", "distillation_classifier"
    if w.has("classifier.weight"):
        return "classifier", None
    return None, None


def encoder_fields(c: HFConfig) -> dict[str, Any]:
    """The ViT encoder's sizes as config.json gives them, checked: read alike for a ViT and for ViT-MAE's encoder."""
    d_model, n_heads = c.whole("hidden_size"), c.whole("num_attention_heads")
    c.heads_divide("num_attention_heads", n_heads, "hidden_size", d_model)
    return {
        "n_channels": c.whole("num_channels", 3, high=64),
        "n_layers": c.layers("num_hidden_layers"),
        "d_model": d_model,
        "n_heads": n_heads,
        "d_ff": c.whole("intermediate_size"),
        "activation": activation(c.text("hidden_act"), "hidden_act"),
        "ln_eps": c.number("layer_norm_eps"),
    }


def vit_config(c: HFConfig, n_classes: int, distilled: bool, dist_head: bool) -> ViTConfig:
    """The core's config for a ViT or DeiT config.json (the heads come from the weights), checked."""
    if not c.flag("qkv_bias", True):
        raise CheckpointError("ViT checkpoints without Q/K/V biases are not supported yet")
    image_size, patch_size = config_image_size(c), c.whole("patch_size", high=1 << 14)
    for side in (image_size,) if isinstance(image_size, int) else image_size:
        if side % patch_size:
            raise CheckpointError(
                f"config.json: image_size {side} is not a whole number of patches of patch_size {patch_size} pixels"
            )
    return ViTConfig(
        image_size=image_size,
        patch_size=patch_size,
        **encoder_fields(c),
        n_classes=n_classes,
        distilled=distilled,
        dist_head=dist_head,
    )


def encoder_ends(w: Weights) -> dict[str, Any]:
    """The encoder's two ends by core name, as every Hugging Face ViT-layout checkpoint names them (ViT, DeiT, MAE,
    DINOv2): the patch embedding (its conv kernel flattened channel-first, as `patchify` reads a patch), the class
    token, the position table and the final LayerNorm."""
    conv = w["embeddings.patch_embeddings.projection.weight"]  # (D, C, P, P)
    return {
        "encoder.embed.project.weight": conv.reshape(conv.shape[0], -1),
        "encoder.embed.project.bias": w["embeddings.patch_embeddings.projection.bias"],
        "encoder.embed.cls_token": w["embeddings.cls_token"],
        "encoder.embed.pos": w["embeddings.position_embeddings"],
        "encoder.ln_final.weight": w["layernorm.weight"],
        "encoder.ln_final.bias": w["layernorm.bias"],
    }


def build(hf: dict, tensors: dict, generation: dict | None = None) -> ViT:
    """The checkpoint's tensors in a core ViT (generation_config.json plays no part in a ViT)."""
    c = HFConfig(hf)
    w = Weights(tensors, prefixes=(f"{hf['model_type']}.",))
    distilled = w.has("embeddings.distillation_token")
    head, dist_head = _heads(w)
    n_classes = w[head + ".weight"].shape[0] if head else 0
    config = vit_config(c, n_classes, distilled, dist_head is not None)
    model = build_module(ViT, config)
    m = encoder_ends(w)
    if distilled:
        m["encoder.embed.dist_token"] = w["embeddings.distillation_token"]
    for i in range(config.n_layers):
        for ours, theirs in LAYER.items():
            for p in ("weight", "bias"):
                m[f"encoder.blocks.{i}.{ours}.{p}"] = w[f"encoder.layer.{i}.{theirs}.{p}"]
    if head:
        m["head.classifier.weight"], m["head.classifier.bias"] = w[head + ".weight"], w[head + ".bias"]
    if dist_head:
        m["head.dist_classifier.weight"] = w[dist_head + ".weight"]
        m["head.dist_classifier.bias"] = w[dist_head + ".bias"]
    assign(model, m, w)
    labels = c.raw("id2label", {})
    if not isinstance(labels, dict):
        raise c.fail("id2label", "must be a table of class number -> name")
    if n_classes and len(labels) == n_classes:
        model.class_names = [str(labels.get(str(i), labels.get(i, str(i)))) for i in range(n_classes)]
    return model


PREPROCESSOR = "preprocessor_config.json"


def _sides(value: object, key: str) -> tuple[int, int] | int:
    """A size in preprocessor_config.json: a number, {"height", "width"} or {"shortest_edge"}, in pixels."""
    c = HFConfig({key: value}, PREPROCESSOR)
    if isinstance(value, dict):
        inner = HFConfig(value, PREPROCESSOR)
        if "shortest_edge" in inner:
            return inner.whole("shortest_edge", high=4096)
        if "height" in inner and "width" in inner:
            return inner.whole("height", high=4096), inner.whole("width", high=4096)
        raise c.fail(key, "must give height and width, or shortest_edge")
    return c.whole(key, high=4096)


def preprocessing(folder: Path, config: ViTConfig) -> ImagePreprocessing:
    """The picture preprocessing of preprocessor_config.json (ImageNet's defaults without one), checked: its
    sizes, means and deviations must be numbers, and it must hand the model pictures of its image_size."""
    path = folder / PREPROCESSOR
    cfg = read_json(path) if path.is_file() else {}
    c = HFConfig(cfg, PREPROCESSOR)
    for key in ("size", "crop_size"):
        if key in c:
            _sides(cfg[key], key)
    for key in ("image_mean", "image_std"):
        values = c.raw(key)
        if values is None:
            continue
        ok = isinstance(values, (list, tuple)) and len(values) == config.n_channels
        ok = ok and all(not isinstance(v, bool) and isinstance(v, (int, float)) for v in values)
        if not ok:
            raise c.fail(key, f"must be a list of {config.n_channels} numbers (one per colour channel)")
        if key == "image_std" and any(v <= 0 for v in values):
            raise c.fail(key, "must be positive numbers (pixels are divided by them)")
    c.whole("resample", 2, low=0, high=5)
    c.number("rescale_factor", 1 / 255)
    for key in ("do_resize", "do_center_crop", "do_rescale", "do_normalize"):
        c.flag(key, True)
    try:
        pre = ImagePreprocessing.from_hf(cfg, config.image_hw[0])
    except (TypeError, KeyError, ValueError) as error:
        raise CheckpointError(f"{PREPROCESSOR} cannot be read as a picture preprocessing") from error
    if pre.crop is not None:
        out = tuple(pre.crop)
    elif pre.resize is not None and pre.resize[0] == "exact":
        out = tuple(pre.resize[1])
    else:
        out = None
    if out != tuple(config.image_hw):
        given = "pictures of varying size" if out is None else f"pictures of {out[0]}x{out[1]} pixels"
        raise CheckpointError(
            f"{PREPROCESSOR} gives the model {given}, but config.json's image_size is "
            f"{config.image_hw[0]}x{config.image_hw[1]}"
        )
    return pre
