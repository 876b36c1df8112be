"""DINOv2, with and without registers, against transformers on tiny random checkpoints: hidden states after every
layer, attention weights and the final output, at the config's picture size and at others (the position table
resized), with layer scale, SwiGLU and Q/K/V without biases."""

import json

import pytest
import torch
import transformers as T

import tformer_core as tc
from tformer_core.checkpoints import CheckpointError

from .hf_helpers import assert_close, perturbed

TIGHT = 2e-5  # float32, the same sums in another order (layer scale folded into W_O and W_out)


def _dinov2(registers: int, **overrides):
    sizes = {
        "image_size": 32,
        "patch_size": 8,
        "num_channels": 3,
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "layerscale_value": 0.3,
        "attn_implementation": "eager",
        **overrides,
    }
    if registers:
        return T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(num_register_tokens=registers, **sizes))
    return T.Dinov2Model(T.Dinov2Config(**sizes))


def _save(hf, tmp_path, picture_hw=None):
    """The model saved as the hub has it, with a preprocessor_config.json cropping to `picture_hw` when given."""
    folder = tmp_path / "dinov2"
    hf.save_pretrained(folder)
    if picture_hw is not None:
        height, width = picture_hw
        preprocessor = {
            "image_processor_type": "BitImageProcessor",
            "do_resize": True,
            "size": {"shortest_edge": max(picture_hw)},
            "do_center_crop": True,
            "crop_size": {"height": height, "width": width},
            "resample": 3,
            "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225],
        }
        (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return folder


CASES = {
    # name: (registers, config overrides, the picture's (height, width) or None for config.json's image_size)
    "registers, larger picture": (2, {}, (48, 40)),  # table 4x4 -> 6x5
    "registers, smaller picture": (4, {"image_size": 48}, (32, 24)),  # 6x6 -> 4x3: antialiasing counts
    "registers, trained size": (1, {}, None),
    "no registers, SwiGLU, no Q/K/V bias": (0, {"use_swiglu_ffn": True, "qkv_bias": False}, (40, 48)),
    "no registers, trained size": (0, {"hidden_act": "gelu"}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dinov2_matches_transformers(case, tmp_path):
    registers, overrides, picture_hw = CASES[case]
    torch.manual_seed(3)
    hf = perturbed(_dinov2(registers, **overrides), seed=1, scale=0.1)
    model = tc.load_model(str(_save(hf, tmp_path, picture_hw)), device="cpu", model_dirs=[tmp_path])
    c = model.config
    height, width = picture_hw or (hf.config.image_size,) * 2
    assert c.image_hw == (height, width) and c.n_registers == registers
    assert c.n_prefix_tokens == 1 + registers
    image = torch.randn(3, height, width, generator=torch.Generator().manual_seed(0))
    trace = model.trace(image)
    rows, cols = height // 8, width // 8
    assert trace.tokens[: 1 + registers] == ("[CLS]", *(f"[REG{i}]" for i in range(registers)))
    assert trace.tokens[1 + registers] == "r0c0" and len(trace.tokens) == 1 + registers + rows * cols
    assert trace.n_prefix_tokens == 1 + registers and trace.patch_grid == (rows, cols)
    with torch.no_grad():
        out = hf(pixel_values=image[None], output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == c.n_layers + 1  # the embedding's output, then every layer's
    assert_close(trace["encoder.embed.out"], out.hidden_states[0][0], TIGHT, "embedding")
    for layer in range(c.n_layers):
        assert_close(trace[f"encoder.{layer}.resid_post"], out.hidden_states[layer + 1][0], TIGHT, f"layer {layer}")
        assert_close(trace.attention(layer), out.attentions[layer][0], TIGHT, f"layer {layer} attention")
    assert_close(trace["encoder.out"], out.last_hidden_state[0], TIGHT, "output")
    # The sum really passed through the parts that differ from a ViT's: a wrong table or a missing layer scale
    # would move the embedding or the first layer by far more than TIGHT.
    if picture_hw is not None:
        assert tuple(model.encoder.embed.pos.shape[1:]) == (1 + (hf.config.image_size // 8) ** 2, 32)
    assert float((trace["encoder.0.attn.out"]).std()) > 1e-3


def test_registers_have_no_position_and_the_parts_add_up(tmp_path):
    torch.manual_seed(4)
    hf = perturbed(_dinov2(3), seed=2, scale=0.1)
    model = tc.load_model(str(_save(hf, tmp_path, (40, 40))), device="cpu", model_dirs=[tmp_path])
    trace = model.trace(torch.randn(3, 40, 40, generator=torch.Generator().manual_seed(1)))
    pos = trace["encoder.embed.pos"]  # [tokens, D]: what was added to each token
    assert (pos[1:4] == 0).all() and (pos[0] != 0).any()  # the registers' rows are zeros, the class token's not
    registers = hf.embeddings.register_tokens.detach()[0]
    assert_close(trace["encoder.embed.out"][1:4], registers, 0.0, "registers enter as they are")
    assert_close(model.weights().W_pos, pos, 0.0, "weights().W_pos is what is added, at the picture's grid")
    # Layer scale folded: the attention's output is what joins the residual stream.
    joined = trace["encoder.0.resid_pre"] + trace["encoder.0.attn.out"]
    assert_close(trace["encoder.0.resid_after_attn"], joined, 1e-6, "resid_pre + attn.out")


def test_a_classification_head_is_refused_with_a_reason(tmp_path):
    hf = T.Dinov2ForImageClassification(
        T.Dinov2Config(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    hf.save_pretrained(tmp_path / "head")
    with pytest.raises(CheckpointError, match=r"classification head .* is not supported yet"):
        tc.load_model(str(tmp_path / "head"), device="cpu", model_dirs=[tmp_path])


def test_a_picture_that_is_not_whole_patches_is_refused(tmp_path):
    hf = _dinov2(1)
    with pytest.raises(CheckpointError, match="not a whole number of patches"):
        tc.load_model(str(_save(hf, tmp_path, (36, 40))), device="cpu", model_dirs=[tmp_path])
