"""ViT and DeiT checkpoints into the core's `ViT`.

The checkpoint's patch embedding is a Conv2d with kernel = stride = P, weight (D, C, P, P); the
core flattens patches channel-first, so the same numbers become a Linear weight (D, C*P*P).
"""

from __future__ import annotations

from ..models.vit import ViT, ViTConfig
from .common import activation
from .weights import CheckpointError, Weights, assign

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


def build(hf: dict, tensors: dict, generation: dict | None = None) -> ViT:
    """The checkpoint's tensors in a core ViT (generation_config.json plays no part in a ViT)."""
    model_type = hf["model_type"]
    w = Weights(tensors, prefixes=(f"{model_type}.",))
    distilled = w.has("embeddings.distillation_token")
    if w.has("cls_classifier.weight"):  # DeiT "with teacher": mean of the class and distillation heads
        head, dist_head = "cls_classifier", "distillation_classifier"
    elif w.has("classifier.weight"):
        head, dist_head = "classifier", None
    else:
        head = dist_head = None
    n_classes = tensors[head + ".weight"].shape[0] if head else 0
    if not hf.get("qkv_bias", True):
        raise CheckpointError("ViT checkpoints without Q/K/V biases are not supported yet")
    config = ViTConfig(
        image_size=hf["image_size"],
        patch_size=hf["patch_size"],
        n_channels=hf.get("num_channels", 3),
        n_layers=hf["num_hidden_layers"],
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        activation=activation(hf["hidden_act"]),
        ln_eps=hf["layer_norm_eps"],
        n_classes=n_classes,
        distilled=distilled,
        dist_head=dist_head is not None,
    )
    model = ViT(config)
    conv = w["embeddings.patch_embeddings.projection.weight"]  # (D, C, P, P)
    m = {
        "encoder.embed.project.weight": conv.reshape(conv.shape[0], -1),
        "encoder.embed.project.bias": w["embeddings.patch_embeddings.projection.bias"],
        "encoder.embed.cls_token": w["embeddings.cls_token"],
        "encoder.embed.pos": w["embeddings.position_embeddings"],
        "encoder.ln_final.weight": w["layernorm.weight"],
        "encoder.ln_final.bias": w["layernorm.bias"],
    }
    if distilled:
        m["encoder.embed.dist_token"] = w["embeddings.distillation_token"]
    for i in range(config.n_layers):
        for ours, theirs in LAYER.items():
            for p in ("weight", "bias"):
                m[f"encoder.blocks.{i}.{ours}.{p}"] = w[f"encoder.layer.{i}.{theirs}.{p}"]
    if head:
        m["head.classifier.weight"], m["head.classifier.bias"] = tensors[head + ".weight"], tensors[head + ".bias"]
    if dist_head:
        m["head.dist_classifier.weight"] = tensors[dist_head + ".weight"]
        m["head.dist_classifier.bias"] = tensors[dist_head + ".bias"]
    assign(model, m)
    labels = hf.get("id2label") or {}
    if n_classes and len(labels) == n_classes:
        model.class_names = [labels.get(str(i), labels.get(i, str(i))) for i in range(n_classes)]
    return model
