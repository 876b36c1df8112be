"""ViT-MAE checkpoints (transformers' ViTMAEForPreTraining, e.g. facebook/vit-mae-base) into the core's `MAE`.

The encoder's tensors are named as a ViT's (`vit.encoder.layer.{i}.*`, see checkpoints/vit.py); the
decoder's blocks as `decoder.decoder_layers.{i}.*` in the original files (`decoder.decoder_encoder.layer.{i}.*`
in files transformers 5 writes). A checkpoint without the decoder (a ViTMAEModel) cannot rebuild pixels
and is refused with a message.
"""

from __future__ import annotations

from pathlib import Path

from ..inputs.preprocessing import ImagePreprocessing
from ..models.mae import MAE, MAEConfig
from .common import build_module
from .errors import CheckpointError
from .hfconfig import HFConfig
from .vit import LAYER, encoder_ends, encoder_fields
from .vit import preprocessing as vit_preprocessing
from .weights import Weights, assign

MODEL_TYPES = ("vit_mae",)
DECODER_LAYERS = ("decoder.decoder_layers.{i}.", "decoder.decoder_encoder.layer.{i}.")


def mae_config(c: HFConfig) -> MAEConfig:
    """The core's config for a ViT-MAE config.json, checked."""
    if not c.flag("qkv_bias", True):
        raise CheckpointError("ViT-MAE checkpoints without Q/K/V biases are not supported")
    encoder = encoder_fields(c)
    d_dec, dec_heads = c.whole("decoder_hidden_size"), c.whole("decoder_num_attention_heads")
    c.heads_divide("decoder_num_attention_heads", dec_heads, "decoder_hidden_size", d_dec)
    image_size, patch_size = c.whole("image_size", high=1 << 14), c.whole("patch_size", high=1 << 14)
    if image_size % patch_size:
        raise CheckpointError(f"config.json: image_size {image_size} is not a whole number of {patch_size}-px patches")
    return MAEConfig(
        image_size=image_size,
        patch_size=patch_size,
        **encoder,
        decoder_d_model=d_dec,
        decoder_n_heads=dec_heads,
        decoder_d_ff=c.whole("decoder_intermediate_size"),
        decoder_n_layers=c.layers("decoder_num_hidden_layers"),
        mask_ratio=c.number("mask_ratio", 0.75),
        norm_pix_loss=c.flag("norm_pix_loss", False),
    )


def _decoder_prefix(w: Weights) -> str:
    for prefix in DECODER_LAYERS:
        if w.has(prefix.format(i=0) + "layernorm_before.weight"):
            return prefix
    raise CheckpointError(
        "this ViT-MAE checkpoint has no decoder (a ViTMAEModel): the pixels of the masked patches cannot be "
        "rebuilt. Use a ViTMAEForPreTraining checkpoint, e.g. facebook/vit-mae-base"
    )


def build(hf: dict, tensors: dict, generation: dict | None = None) -> MAE:
    """The checkpoint's tensors in a core MAE."""
    c = HFConfig(hf)
    config = mae_config(c)
    w = Weights(tensors, prefixes=("vit.",))
    decoder = _decoder_prefix(w)
    model = build_module(MAE, config)
    m = {
        **encoder_ends(w),
        "decoder.embed.project.weight": w["decoder.decoder_embed.weight"],
        "decoder.embed.project.bias": w["decoder.decoder_embed.bias"],
        "decoder.embed.mask_token": w["decoder.mask_token"],
        "decoder.embed.pos": w["decoder.decoder_pos_embed"],
        "decoder.ln_final.weight": w["decoder.decoder_norm.weight"],
        "decoder.ln_final.bias": w["decoder.decoder_norm.bias"],
        "head.predict.weight": w["decoder.decoder_pred.weight"],
        "head.predict.bias": w["decoder.decoder_pred.bias"],
    }
    for stack, n, prefix in (
        ("encoder", config.n_layers, "encoder.layer.{i}."),
        ("decoder", config.decoder_n_layers, decoder),
    ):
        for i in range(n):
            for ours, theirs in LAYER.items():
                for p in ("weight", "bias"):
                    m[f"{stack}.blocks.{i}.{ours}.{p}"] = w[prefix.format(i=i) + f"{theirs}.{p}"]
    assign(model, m, w)
    return model


def preprocessing(folder: Path, config: MAEConfig) -> ImagePreprocessing:
    """preprocessor_config.json's picture preprocessing, checked as a ViT's."""
    return vit_preprocessing(folder, config)
