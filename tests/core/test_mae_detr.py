"""MAE and DETR in the core's traced modules, against transformers' ViTMAEForPreTraining and
DetrForObjectDetection on tiny random configs (saved and loaded as checkpoints, as a user's would be)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig, ViTMAEConfig, ViTMAEForPreTraining

import tformer_core as tc
from tformer_core.capture import matching
from tformer_core.checkpoints import load_folder
from tformer_core.checkpoints.detr import timm_to_transformers
from tformer_core.models.detr import DetrPreprocessing, sine_positions
from tformer_core.models.mae import sincos_positions


def save_tiny_mae(folder, seed=0):
    torch.manual_seed(seed)
    config = ViTMAEConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        decoder_hidden_size=24,
        decoder_num_hidden_layers=2,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=48,
        norm_pix_loss=True,
    )
    model = ViTMAEForPreTraining(config).eval()
    model.set_attn_implementation("eager")
    model.save_pretrained(folder)
    return model


# Pictures of at most 160 pixels: the tiny ResNet's two stages leave one feature cell per 8 x 8 pixels, and at
# DETR's own 800 x 1333 its encoder's attention would take gigabytes (refused by TFORMER_PASS_MB).
TINY_DETR_PREPROCESSOR = {"size": {"shortest_edge": 96, "longest_edge": 160}}


def save_tiny_detr(folder, seed=0, stages=2):
    """A random DetrForObjectDetection with a ResNet of `stages` tiny stages, saved with a preprocessor for
    pictures of at most 160 pixels."""
    torch.manual_seed(seed)
    backbone = ResNetConfig(
        num_channels=3,
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16][:stages],
        depths=[1] * stages,
        layer_type="basic",
        out_features=[f"stage{stages}"],
    )
    config = DetrConfig(
        backbone_config=backbone,
        use_timm_backbone=False,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=5,
        num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "remote"},
        label2id={"cat": 0, "dog": 1, "remote": 2},
    )
    model = DetrForObjectDetection(config).eval()
    model.set_attn_implementation("eager")
    with torch.no_grad():  # batch-norm statistics away from 0 / 1, so that their use is tested
        for module in model.modules():
            if hasattr(module, "running_var") and module.running_var is not None:
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
    model.save_pretrained(folder)
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(TINY_DETR_PREPROCESSOR))
    return model


@pytest.fixture(scope="module")
def mae(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mae")
    return save_tiny_mae(folder), load_folder(folder)


@pytest.fixture(scope="module")
def detr(tmp_path_factory):
    folder = tmp_path_factory.mktemp("detr")
    return save_tiny_detr(folder), load_folder(folder)


def _decoder_attention(theirs, layer, run):
    """transformers' MAE decoder attention of `layer` (it returns none in transformers 5), from its own query and
    key projections of the hidden states its attention reads: softmax(q k^T / sqrt(d_head)) per head."""
    seen = {}
    attention = theirs.decoder.decoder_layers[layer].attention
    handle = attention.register_forward_pre_hook(lambda module, args: seen.setdefault("x", args[0]))
    try:
        run()
    finally:
        handle.remove()
    x, heads = seen["x"], theirs.config.decoder_num_attention_heads
    q, k = (proj(x).unflatten(-1, (heads, -1)).transpose(1, 2) for proj in (attention.q_proj, attention.k_proj))
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)[0].detach().numpy()


def test_mae_reconstruction_mask_and_attention_match_transformers(mae):
    theirs, ours = mae
    x, noise = torch.randn(1, 3, 16, 16), torch.rand(1, 16)
    with torch.no_grad():
        out = theirs(pixel_values=x, noise=noise, output_attentions=True)
    trace = ours.trace(x[0], noise=noise)
    np.testing.assert_allclose(trace["head.pixels"], out.logits[0].numpy(), atol=1e-5)
    np.testing.assert_array_equal(trace["encoder.embed.mask"], out.mask[0].numpy())
    assert int(trace["encoder.embed.mask"].sum()) == 12  # 75 % of 16 patches
    for layer in range(2):
        np.testing.assert_allclose(trace.attention(layer), out.attentions[layer][0].numpy(), atol=1e-5)
    assert trace.stack_layers == {"encoder": 2, "decoder": 2}
    assert len(trace.tokens) == 1 + 4 and len(trace.target_tokens) == 1 + 16
    kept = list(trace.tokens[1:])
    masked = [f"r{i // 4}c{i % 4}" for i in np.flatnonzero(trace["encoder.embed.mask"])]
    assert not set(kept) & set(masked)


def test_the_mae_decoder_has_its_own_heads_and_they_match_transformers(mae):
    """The tiny MAE's encoder has 4 heads of 8 numbers, its decoder 2 of 12: a trace reads each stack with its own
    heads and its own 1/sqrt(d_head) (a single count would refuse head 3... or recompute with the wrong scale)."""
    theirs, ours = mae
    x, noise = torch.randn(1, 3, 16, 16), torch.rand(1, 16)
    trace = ours.trace(x[0], noise=noise).compact()  # compact: the weights are recomputed from Q and K
    assert (trace.heads_in("encoder"), trace.heads_in("decoder"), trace.n_heads) == (4, 2, 4)
    assert trace.meta.stack_scales == {"decoder": pytest.approx(12**-0.5)}
    assert trace.meta.attention_scale == pytest.approx(8**-0.5)
    for layer in range(2):
        with torch.no_grad():
            expected = _decoder_attention(theirs, layer, lambda: theirs(pixel_values=x, noise=noise))
        np.testing.assert_allclose(trace.attention(layer, None, "decoder"), expected, atol=1e-5)
        np.testing.assert_allclose(trace.attention(layer, 1, "decoder"), expected[1], atol=1e-5)
    assert trace.attention(0, 3, "encoder").shape == (1 + 4, 1 + 4)
    with pytest.raises(tc.InputError, match=r"^head 3 is out of range: the model has 2 heads \(0\.\.1\)$"):
        trace.attention(0, 3, "decoder")
    queries, keys = trace.tokens_for("decoder")
    assert queries == keys == trace.target_tokens and trace.tokens_for("encoder")[0] == trace.tokens
    assert trace.attention_stacks == ("encoder", "decoder")  # no cross-attention: the decoder reads every patch


def test_an_maes_weights_are_its_checkpoints_in_transformerlenss_shapes(mae):
    theirs, ours = mae
    decoder = ours.weights("decoder")
    layer = theirs.decoder.decoder_layers[1].attention
    W_Q = layer.q_proj.weight.T.reshape(24, 2, 12).transpose(0, 1)  # [heads, d_model, d_head]
    torch.testing.assert_close(decoder.block(1).attn.W_Q, W_Q, rtol=0, atol=0)
    assert decoder.n_layers == 2 and decoder.W_pos.shape == (1 + 16, 24) and decoder.patch is None
    encoder = ours.weights()
    conv = theirs.vit.embeddings.patch_embeddings.projection.weight
    torch.testing.assert_close(encoder.patch.W, conv, rtol=0, atol=0)
    assert encoder.block(0).attn.n_heads == 4 and encoder.positional == "sinusoidal"
    assert ours.capabilities == tc.Capabilities(head="pixels") and isinstance(ours, tc.MaskedAutoencoder)


def test_mae_masks_the_same_patches_for_a_seed_and_others_for_another(mae):
    _, ours = mae
    x = torch.randn(3, 16, 16)
    a, b, c = ours.trace(x, seed=1), ours.trace(x, seed=1), ours.trace(x, seed=2)
    np.testing.assert_array_equal(a["encoder.embed.mask"], b["encoder.embed.mask"])
    assert not np.array_equal(a["encoder.embed.mask"], c["encoder.embed.mask"])
    only = ours.trace(x, seed=1, keep=matching("head.pixels"))  # the mask stays: it names the tokens
    np.testing.assert_array_equal(only["encoder.embed.mask"], a["encoder.embed.mask"])
    assert only.tokens == a.tokens and "encoder.0.attn.q" not in only
    assert ours.config.norm_pix_loss


def test_mae_positions_are_the_papers_fixed_sine_cosine_table():
    table = sincos_positions((2, 3), 8)  # patch (r, c) = (1, 2): row 1 + 1*3 + 2 = 6
    omega = 1 / 10000 ** (np.arange(2) / 2)
    expected = np.concatenate([np.sin(2 * omega), np.cos(2 * omega), np.sin(1 * omega), np.cos(1 * omega)])
    np.testing.assert_allclose(table[6].numpy(), expected, rtol=1e-6)
    assert not table[0].any()  # the class token's row


def test_detr_boxes_classes_and_every_attention_match_transformers(detr):
    theirs, ours = detr
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        out = theirs(pixel_values=x, output_attentions=True)
    trace = ours.trace(x[0])
    np.testing.assert_allclose(trace["head.logits"], out.logits[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(trace["head.boxes"], out.pred_boxes[0].numpy(), atol=1e-5)
    for layer in range(2):
        np.testing.assert_allclose(trace.attention(layer, None, "encoder"), out.encoder_attentions[layer][0], atol=1e-5)
        np.testing.assert_allclose(trace.attention(layer, None, "decoder"), out.decoder_attentions[layer][0], atol=1e-5)
        np.testing.assert_allclose(trace.attention(layer, None, "cross"), out.cross_attentions[layer][0], atol=1e-5)
    assert trace.grid_hw == (12, 16)  # stride 8 for this two-stage ResNet
    assert trace.attention(0, 1, "cross").shape == (5, 12 * 16)
    assert ours.output_labels == ("cat", "dog", "remote")
    # A DETR trace is its own kind; its decoder reads the feature cells through cross-attention.
    assert trace.kind == "detr" and trace.attention_stacks == ("encoder", "decoder", "cross")
    assert trace.tokens_for("cross") == (trace.target_tokens, trace.tokens)
    assert isinstance(ours, tc.DetectionModel) and ours.capabilities == tc.Capabilities(head="detection", weights=False)
    with pytest.raises(
        tc.InputError, match=r"^DETR's weights are not offered as StackWeights: its positions enter every attention"
    ):
        ours.weights()


def test_detr_reads_a_checkpoint_with_timms_resnet_names(tmp_path):
    """The original facebook/detr-resnet-50 files name the backbone as timm does; renamed, the same model."""
    from safetensors.torch import load_file, save_file

    theirs = save_tiny_detr(tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    to_timm = {v: k for k, v in _timm_names().items()}
    prefix = "model.backbone.conv_encoder.model."
    renamed = {(prefix + to_timm[k[len(prefix) :]] if k.startswith(prefix) else k): t for k, t in tensors.items()}
    assert sum(k != r for k, r in zip(tensors, renamed)) > 20
    (tmp_path / "timm").mkdir()
    save_file(renamed, str(tmp_path / "timm" / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "preprocessor_config.json"):
        (tmp_path / "timm" / name).write_text((tmp_path / "hf" / name).read_text())
    ours = load_folder(tmp_path / "timm")
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        np.testing.assert_allclose(ours.trace(x[0])["head.boxes"], theirs(pixel_values=x).pred_boxes[0], atol=1e-5)


def _timm_names():
    names = {"conv1.weight": "embedder.embedder.convolution.weight"}
    for p in ("weight", "bias", "running_mean", "running_var"):
        names[f"bn1.{p}"] = f"embedder.embedder.normalization.{p}"
        for s in (1, 2):
            for k in (1, 2):
                names[f"layer{s}.0.bn{k}.{p}"] = f"encoder.stages.{s - 1}.layers.0.layer.{k - 1}.normalization.{p}"
        names[f"layer2.0.downsample.1.{p}"] = f"encoder.stages.1.layers.0.shortcut.normalization.{p}"
    for s in (1, 2):
        for k in (1, 2):
            names[f"layer{s}.0.conv{k}.weight"] = f"encoder.stages.{s - 1}.layers.0.layer.{k - 1}.convolution.weight"
    names["layer2.0.downsample.0.weight"] = "encoder.stages.1.layers.0.shortcut.convolution.weight"
    for timm, hf in names.items():
        assert timm_to_transformers(timm) == hf
    return names


def test_detr_positions_are_sines_of_the_normalised_row_and_column():
    pos = sine_positions(2, 3, 8)  # 4 numbers for the row, 4 for the column
    y, x = 2 / (2 + 1e-6) * 2 * np.pi, 1 / (3 + 1e-6) * 2 * np.pi  # cell (row 1, column 0), 1-based, normalised
    dim_t = 10000 ** (2 * (np.arange(4) // 2) / 4)
    expected = [
        np.sin(y / dim_t[0]),
        np.cos(y / dim_t[1]),
        np.sin(y / dim_t[2]),
        np.cos(y / dim_t[3]),
        np.sin(x / dim_t[0]),
        np.cos(x / dim_t[1]),
        np.sin(x / dim_t[2]),
        np.cos(x / dim_t[3]),
    ]
    np.testing.assert_allclose(pos[3].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_detr_preprocessing_keeps_the_aspect_ratio_within_the_longest_edge():
    pre = DetrPreprocessing(shortest=800, longest=1333)
    assert pre.size(640, 480) == (1066, 800)
    assert pre.size(4000, 1000) == (1332, 333)  # the longest edge wins: 333 = round(1333 / 4), 1332 = 333 * 4
    assert tuple(pre(Image.new("RGB", (64, 32))).shape) == (3, 666, 1332)


def test_bad_inputs_get_messages(mae, detr):
    with pytest.raises(
        ValueError, match=r"^expected one preprocessed image of shape \(3, 16, 16\) \(C, H, W\), got \(3, 8, 8\)$"
    ):
        mae[1].trace(torch.randn(3, 8, 8))
    with pytest.raises(
        tc.InputError, match=r"^expected one preprocessed picture \(3, H, W\), H and W at least 32, got \(3, 16, 16\)$"
    ):
        detr[1].trace(torch.randn(3, 16, 16))
    with pytest.raises(tc.InputError, match=r"^noise must have one number per patch \(16\), got 3$"):
        mae[1].trace(torch.randn(3, 16, 16), noise=torch.rand(1, 3))


def test_a_mae_without_its_decoder_is_refused_with_a_message(tmp_path):
    from transformers import ViTMAEModel

    ViTMAEModel(
        ViTMAEConfig(
            image_size=16,
            patch_size=4,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
        )
    ).save_pretrained(tmp_path)
    with pytest.raises(tc.CheckpointError, match="no decoder"):
        load_folder(tmp_path)
