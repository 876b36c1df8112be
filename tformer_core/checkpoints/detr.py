"""DETR checkpoints (transformers' DetrForObjectDetection, e.g. facebook/detr-resnet-50) into the core's `DETR`.

The backbone runs through transformers' ResNetBackbone. A checkpoint made with a transformers ResNet
(`backbone_config`, model_type "resnet") loads as it is; one made with timm's ResNet-50 or -101
(`use_timm_backbone`, the original facebook/detr-resnet-50 files) has its backbone tensors renamed from
timm's names (conv1, layer1.0.conv2, downsample.0 ...) to transformers' (same shapes, same computation:
stride in the 3 x 3 convolution, batch norm frozen), so timm itself is never needed. Names of both
generations of transformers' files are read (out_proj / o_proj, fc1 / mlp.fc1, backbone.conv_encoder.model /
backbone.model). DC5 (dilation) and learned position embeddings are refused with a message.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..models.detr import DETR, DETRConfig, DetrPreprocessing
from .common import build_module
from .errors import CheckpointError
from .hfconfig import HFConfig, read_json
from .weights import Weights, assign

MODEL_TYPES = ("detr",)
TIMM_RESNETS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3)}
BACKBONE_PREFIXES = ("backbone.conv_encoder.model.", "backbone.model.")
ATTENTION = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": ("out_proj", "o_proj")}


def _backbone(c: HFConfig) -> dict:
    raw = c.raw("backbone_config")
    if isinstance(raw, dict) and raw.get("model_type") == "resnet":
        b = HFConfig(raw)
        depths, sizes = b.raw("depths"), b.raw("hidden_sizes")
        if not (isinstance(depths, list) and isinstance(sizes, list) and len(depths) == len(sizes) > 0):
            raise c.fail("backbone_config", "depths and hidden_sizes must be lists of one number per stage")
        out = b.raw("out_features") or [f"stage{len(depths)}"]
        if list(out) != [f"stage{len(depths)}"]:
            raise c.fail("backbone_config", "DETR reads the last stage only (out_features must be its name)")
        return dict(
            backbone_layer_type=b.text("layer_type", "bottleneck"),
            backbone_embedding_size=b.whole("embedding_size", 64),
            backbone_hidden_sizes=tuple(int(s) for s in sizes),
            backbone_depths=tuple(int(d) for d in depths),
        )
    if raw is None or (isinstance(raw, dict) and raw.get("model_type") == "timm_backbone"):
        name = (raw or {}).get("backbone") or c.raw("backbone", "resnet50")
        if name not in TIMM_RESNETS:
            raise CheckpointError(f"config.json: the backbone {str(name)[:40]!r} is not supported (ResNet-50 or -101)")
        return dict(backbone_depths=TIMM_RESNETS[name])
    raise c.fail("backbone_config", "only ResNet backbones are supported")


def detr_config(c: HFConfig, n_classes: int) -> DETRConfig:
    """The core's config for a DETR config.json (`n_classes`: the classifier's, from the weights), checked."""
    if c.flag("dilation", False):
        raise CheckpointError("DETR with a dilated backbone (DC5) is not supported")
    if c.text("position_embedding_type", "sine") != "sine":
        raise CheckpointError("DETR with learned position embeddings is not supported (the sine ones are)")
    if c.whole("encoder_attention_heads") != c.whole("decoder_attention_heads", c.whole("encoder_attention_heads")):
        raise CheckpointError("config.json: DETR's encoder and decoder must have the same number of heads here")
    if c.whole("encoder_ffn_dim") != c.whole("decoder_ffn_dim", c.whole("encoder_ffn_dim")):
        raise CheckpointError("config.json: DETR's encoder and decoder must have the same FFN width here")
    d_model, heads = c.whole("d_model"), c.whole("encoder_attention_heads")
    c.heads_divide("encoder_attention_heads", heads, "d_model", d_model)
    labels = c.raw("id2label", {}) or {}
    names = tuple(str(labels.get(str(i), labels.get(i, f"LABEL_{i}"))) for i in range(n_classes))
    return DETRConfig(
        d_model=d_model,
        n_heads=heads,
        d_ff=c.whole("encoder_ffn_dim"),
        n_encoder_layers=c.layers("encoder_layers"),
        n_decoder_layers=c.layers("decoder_layers"),
        n_queries=c.whole("num_queries"),
        n_classes=n_classes,
        n_channels=c.whole("num_channels", 3, high=64),
        activation="relu",
        labels=names,
        **_backbone(c),
    )


def timm_to_transformers(name: str) -> str:
    """A timm ResNet tensor name as transformers' ResNet names it ("layer2.0.bn3.weight" ->
    "encoder.stages.1.layers.0.layer.2.normalization.weight"); other names unchanged."""
    if m := re.fullmatch(r"conv1\.(\w+)", name):
        return f"embedder.embedder.convolution.{m[1]}"
    if m := re.fullmatch(r"bn1\.(\w+)", name):
        return f"embedder.embedder.normalization.{m[1]}"
    if m := re.fullmatch(r"layer(\d+)\.(\d+)\.(conv|bn)(\d+)\.(\w+)", name):
        part = "convolution" if m[3] == "conv" else "normalization"
        return f"encoder.stages.{int(m[1]) - 1}.layers.{m[2]}.layer.{int(m[4]) - 1}.{part}.{m[5]}"
    if m := re.fullmatch(r"layer(\d+)\.(\d+)\.downsample\.([01])\.(\w+)", name):
        part = "convolution" if m[3] == "0" else "normalization"
        return f"encoder.stages.{int(m[1]) - 1}.layers.{m[2]}.shortcut.{part}.{m[4]}"
    return name


def _backbone_tensors(w: Weights, model: DETR) -> dict[str, torch.Tensor]:
    """Every tensor of the core's backbone from the checkpoint (timm or transformers names)."""
    found: dict[str, str] = {}
    for key in w.tensors:
        bare = key.removeprefix("model.")
        for prefix in BACKBONE_PREFIXES:
            if bare.startswith(prefix):
                found[timm_to_transformers(bare[len(prefix) :])] = key
    m = {}
    for name, tensor in model.backbone.model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            m[f"backbone.model.{name}"] = tensor  # a counter used in training only
        elif name in found:
            m[f"backbone.model.{name}"] = w[found[name]]
        else:
            raise CheckpointError(
                f"{w.describe()} has no backbone tensor for {name} (its ResNet differs from config.json)"
            )
    return m


def _either(w: Weights, *names: str) -> torch.Tensor:
    for name in names:
        if w.has(name):
            return w[name]
    return w[names[0]]  # raises, naming the first


def _transformer_tensors(w: Weights, config: DETRConfig) -> dict[str, torch.Tensor]:
    m = {
        "encoder.project.weight": w["input_projection.weight"],
        "encoder.project.bias": w["input_projection.bias"],
        "decoder.queries.weight": w["query_position_embeddings.weight"],
        "decoder.ln_final.weight": w["decoder.layernorm.weight"],
        "decoder.ln_final.bias": w["decoder.layernorm.bias"],
        "head.classify.weight": w["class_labels_classifier.weight"],
        "head.classify.bias": w["class_labels_classifier.bias"],
    }
    for i in range(3):
        for p in ("weight", "bias"):
            m[f"head.box.{i}.{p}"] = w[f"bbox_predictor.layers.{i}.{p}"]
    for stack, n in (("encoder", config.n_encoder_layers), ("decoder", config.n_decoder_layers)):
        parts = {"attn": "self_attn", "ln_attn": "self_attn_layer_norm", "ln_mlp": "final_layer_norm"}
        if stack == "decoder":
            parts |= {"cross_attn": "encoder_attn", "ln_cross": "encoder_attn_layer_norm"}
        for i in range(n):
            theirs, ours = f"{stack}.layers.{i}.", f"{stack}.blocks.{i}."
            for p in ("weight", "bias"):
                for mine, name in parts.items():
                    if mine in ("attn", "cross_attn"):
                        for w_ours, w_theirs in ATTENTION.items():
                            alts = (w_theirs,) if isinstance(w_theirs, str) else w_theirs
                            m[f"{ours}{mine}.{w_ours}.{p}"] = _either(w, *(f"{theirs}{name}.{a}.{p}" for a in alts))
                    else:
                        m[f"{ours}{mine}.{p}"] = w[f"{theirs}{name}.{p}"]
                for mine, name in (("W_in", "fc1"), ("W_out", "fc2")):
                    m[f"{ours}mlp.{mine}.{p}"] = _either(w, f"{theirs}{name}.{p}", f"{theirs}mlp.{name}.{p}")
    return m


def build(hf: dict, tensors: dict, generation: dict | None = None) -> DETR:
    """The checkpoint's tensors in a core DETR."""
    c = HFConfig(hf)
    w = Weights(tensors, prefixes=("model.",))
    n_classes = w["class_labels_classifier.weight"].shape[0] - 1
    model = build_module(DETR, detr_config(c, n_classes))
    assign(model, {**_backbone_tensors(w, model), **_transformer_tensors(w, model.config)}, w)
    return model


def preprocessing(folder: Path, config: DETRConfig) -> DetrPreprocessing:
    """preprocessor_config.json's sizes (shortest / longest edge, default 800 / 1333), ImageNet's mean and std."""
    path = folder / "preprocessor_config.json"
    return preprocessing_from(read_json(path) if path.is_file() else {})


def preprocessing_from(values: dict) -> DetrPreprocessing:
    """The preprocessing a preprocessor_config.json's values describe (see `preprocessing`)."""
    cfg = HFConfig(values, "preprocessor_config.json")
    size = cfg.raw("size", {}) or {}
    size = size if isinstance(size, dict) else {}
    inner = HFConfig(size, "preprocessor_config.json")
    return DetrPreprocessing(
        shortest=inner.whole("shortest_edge", 800, high=4096), longest=inner.whole("longest_edge", 1333, high=8192)
    )
