"""What the "Inside a block" page and the patch-embedding panel compute (tformer_views.lessons.block,
patch_embedding, charts.block), with no UI: one token's walk through a block recomposes the model's own
next-layer input (MiniLM, the translator's encoder and decoder, vit-tiny, the real DeiT-Tiny), every
intermediate matches the trace, and the diagrams follow the model's norm placement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import tformer_core as tc
from tests.core.hf_helpers import DEIT, IMAGES
from tformer_views import samples
from tformer_views import seq2seq as sv
from tformer_views import vision as vv
from tformer_views.charts import block as cb
from tformer_views.charts.export import validate
from tformer_views.lessons import block as lb
from tformer_views.lessons import patch_embedding as lpe

SENTENCE = "The cat sat on the mat because it was warm."
TOLERANCE = 1e-5  # the acceptance bound: recomposed (float64) vs the model's next-layer input (float32)


@pytest.fixture(scope="module")
def minilm():
    model = tc.load_model("minilm", device="cpu")
    return model, model.trace(SENTENCE)


@pytest.fixture(scope="module")
def translator():
    model = tc.load_model("translator", device="cpu")
    return model, lb.trace_translation(model, "the big dog chases a small cat near the river").trace


@pytest.fixture(scope="module")
def translator_full(translator):
    """The same pass with every attention weight stored (the page's own trace keeps none)."""
    model, _ = translator
    source = "the big dog chases a small cat near the river"
    return model.trace(source, list(sv.translate(model, source).decoder_ids))


@pytest.fixture(scope="module")
def vit_tiny():
    model = tc.load_model("vit-tiny", device="cpu")
    image = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))
    return model, model.trace(image)


def walk_everything(model, trace, stack, tokens=None):
    """Every layer x the given tokens (all by default): the largest recomposition difference."""
    worst = 0.0
    for layer in range(trace.stack_layers[stack]):
        n = trace[f"{stack}.{layer}.resid_pre"].shape[0]
        for token in tokens if tokens is not None else range(n):
            walk = lb.block_walk(model, trace, stack, layer, token)
            worst = max(worst, walk.max_difference)
            for sub in walk.sublayers:
                assert sub.norm_difference <= TOLERANCE, (stack, layer, token, sub.part)
                assert sub.stream_difference <= TOLERANCE, (stack, layer, token, sub.part)
    return worst


# ---- recomposition against the next layer's input ------------------------------------------------------------
@pytest.mark.slow
def test_minilm_recomposes_every_layer_and_token(minilm):
    model, trace = minilm
    assert walk_everything(model, trace, "encoder") <= TOLERANCE


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_translator_recomposes_both_stacks(translator, stack):
    model, trace = translator
    assert walk_everything(model, trace, stack) <= TOLERANCE


def test_vit_tiny_recomposes(vit_tiny):
    model, trace = vit_tiny
    assert walk_everything(model, trace, "encoder", tokens=[0, 1, 30, 64]) <= TOLERANCE


@pytest.mark.skipif(not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)")
def test_real_deit_recomposes(monkeypatch):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(DEIT.parent))
    model = tc.load_model(f"{DEIT.parent.name}/{DEIT.name}", device="cpu")
    result = lb.trace_image(model, (IMAGES / "dogbird.png").read_bytes(), "dogbird.png")
    assert walk_everything(model, result.trace, "encoder", tokens=[0, 1, 2, 100, 196]) <= TOLERANCE
    assert lb.block_layout(model, "encoder").norm == "pre"


def test_the_walk_is_a_real_recomputation_and_can_fail(minilm):
    """The check compares with the next layer: a wrong placement (pre-norm on a post-norm model) is far off."""
    model, trace = minilm
    walk = lb.block_walk(model, trace, "encoder", 2, 3)
    assert walk.reference_name == "encoder.3.resid_pre"
    np.testing.assert_allclose(walk.reference, trace["encoder.3.resid_pre"][3])
    wrong = walk.sublayers[-1].total  # the sum before the last LayerNorm: what pre-norm would pass on
    assert np.max(np.abs(wrong - walk.reference)) > 0.1
    last = lb.block_walk(model, trace, "encoder", 5, 0)
    assert last.reference_name == "encoder.5.resid_post"


# ---- every intermediate against the trace ---------------------------------------------------------------------
def test_attention_weights_and_ffn_match_the_trace(minilm):
    model, trace = minilm
    for layer, token in ((0, 1), (4, 7)):
        walk = lb.block_walk(model, trace, "encoder", layer, token)
        attn, ffn = walk.sublayers
        np.testing.assert_allclose(attn.attention.weights, trace.attention(layer)[:, token], atol=1e-6)
        np.testing.assert_allclose(attn.attention.weights.sum(-1), 1.0, atol=1e-12)
        np.testing.assert_allclose(attn.out, trace[f"encoder.{layer}.attn.out"][token], atol=1e-5)
        np.testing.assert_allclose(ffn.ffn.hidden[0], trace[f"encoder.{layer}.mlp.hidden"][token], atol=1e-5)
        np.testing.assert_allclose(ffn.out, trace[f"encoder.{layer}.mlp.out"][token], atol=1e-4)
        # Post-norm: the attention reads the stream itself; the FFN reads the first LayerNorm's output.
        np.testing.assert_array_equal(attn.sublayer_in, walk.x)
        np.testing.assert_array_equal(ffn.sublayer_in, attn.norm_output)
        ln = model.encoder.blocks[layer].ln_attn
        assert attn.norm.eps == ln.eps == 1e-12


def test_decoder_self_attention_is_causal_and_cross_attention_reads_the_encoder(translator, translator_full):
    model, trace = translator
    walk = lb.block_walk(model, trace, "decoder", 1, 2)
    assert [s.part for s in walk.sublayers] == ["attn", "cross", "mlp"]
    self_attn, cross, _ = walk.sublayers
    n_target = len(trace.target_tokens)
    np.testing.assert_array_equal(self_attn.attention.visible, [0, 1, 2])
    assert np.all(self_attn.attention.weights[:, 3:] == 0) and self_attn.attention.weights.shape == (4, n_target)
    full = translator_full
    np.testing.assert_allclose(self_attn.attention.weights, full.attention(1, stack="decoder")[:, 2], atol=1e-6)
    np.testing.assert_allclose(cross.attention.weights, full.attention(1, stack="cross")[:, 2], atol=1e-6)
    assert cross.attention.keys == trace.tokens and cross.attention.keys_from == "the encoder's output"
    np.testing.assert_array_equal(cross.stream_in, self_attn.stream_out)  # the cross-attention's Q side


def test_pre_norm_reads_the_normalised_copy_and_adds_to_the_stream(vit_tiny):
    model, trace = vit_tiny
    walk = lb.block_walk(model, trace, "encoder", 1, 5)
    attn, ffn = walk.sublayers
    np.testing.assert_allclose(attn.norm_output, trace["encoder.1.ln_attn"][5], atol=1e-5)
    np.testing.assert_array_equal(attn.sublayer_in, attn.norm_output)
    np.testing.assert_array_equal(attn.stream_out, walk.x + attn.out)  # no norm on the stream
    np.testing.assert_array_equal(ffn.stream_in, attn.stream_out)
    assert walk.token_label == "r0c4"


def test_the_trace_the_page_caches_keeps_what_the_walk_reads_and_no_attention_internals(minilm):
    model, _ = minilm
    trace = lb.trace_text(model, SENTENCE)
    names = set(trace.activations)
    assert {"encoder.0.resid_pre", "encoder.0.attn.out", "encoder.0.ln_attn", "encoder.0.mlp.out"} <= names
    assert not [n for n in names if n.rpartition(".")[2] in ("q", "k", "v", "weights", "z", "hidden")]
    assert not [n for n in names if ".embed." in n]
    assert lb.block_read("decoder.1.cross_attn.mask") and lb.block_read("decoder.1.cross_attn.out")
    assert not lb.block_read("decoder.1.cross_attn.k") and not lb.block_read("head.logits")
    assert lb.block_walk(model, trace, "encoder", 3, 2).max_difference <= TOLERANCE


def test_models_whose_attention_is_not_the_lectures_are_read_from_the_trace():
    assert lb._plain_attention(tc.BlockConfig(n_heads=4))
    assert not lb._plain_attention(tc.BlockConfig(n_heads=4, rope=tc.Rope()))
    assert not lb._plain_attention(tc.BlockConfig(n_heads=4, n_kv_heads=2))
    assert not lb._plain_attention(tc.BlockConfig(n_heads=4, qk_norm=True))


def test_out_of_range_choices_are_refused(minilm):
    model, trace = minilm
    with pytest.raises(tc.InputError, match=r"^layer 6 is out of range: the encoder has 6 layers \(0\.\.5\)$"):
        lb.block_walk(model, trace, "encoder", 6, 0)
    with pytest.raises(tc.InputError, match=r"^token 40 is out of range: there are 13 tokens \(0\.\.12\)$"):
        lb.block_walk(model, trace, "encoder", 0, 40)
    with pytest.raises(tc.InputError, match=r"^this trace has no 'decoder' stack; it has \('encoder',\)$"):
        lb.block_walk(model, trace, "decoder", 0, 0)


# ---- the residual stream across layers --------------------------------------------------------------------------
def test_stream_norms_are_the_norms_of_the_trace(translator):
    _, trace = translator
    norms = lb.stream_norms(trace, "decoder")
    assert set(norms.values) == {"resid_pre", "attn.out", "cross_attn.out", "mlp.out", "resid_post"}
    np.testing.assert_allclose(
        norms.values["cross_attn.out"][1], np.linalg.norm(trace["decoder.1.cross_attn.out"], axis=-1), rtol=1e-6
    )
    frame = norms.frame(3)
    assert set(frame["scope"]) == {f"token 3: {trace.target_tokens[3]}", "mean over tokens"}
    mean = frame[(frame["quantity"] == "FFN adds") & (frame["scope"] == "mean over tokens")]["norm"]
    np.testing.assert_allclose(mean, norms.values["mlp.out"].mean(axis=1))
    assert norms.table(3).columns[0] == "residual stream in (x) (token 3)"
    validate(cb.norms_chart(frame, title="t"))


# ---- the flow diagram ----------------------------------------------------------------------------------------------
def test_the_flow_follows_the_models_placement(translator, vit_tiny):
    model, _ = translator
    post = lb.flow_nodes(lb.block_layout(model, "encoder"))
    assert [n.kind for n in post] == ["io", "attn", "add", "norm", "mlp", "add", "norm", "io"]
    assert [n.skip_from for n in post if n.kind == "add"] == [0, 3]  # x, then the first norm's output
    decoder = lb.flow_nodes(lb.block_layout(model, "decoder"))
    assert [n.kind for n in decoder][4:7] == ["cross", "add", "norm"]
    assert decoder[1].label == "Masked multi-head self-attention"
    assert "K, V from the encoder" in decoder[4].detail
    pre = lb.flow_nodes(lb.block_layout(vit_tiny[0], "encoder"))
    assert [n.kind for n in pre] == ["io", "norm", "attn", "add", "norm", "mlp", "add", "io"]
    assert [n.skip_from for n in pre if n.kind == "add"] == [0, 3]  # x, then the first sum
    assert pre[5].detail == "64 → 128 (GELU) → 64"
    assert [n.kind for n in lb.flow_nodes(lb.block_layout(vit_tiny[0], "encoder"), "post")][2:4] == ["add", "norm"]
    for nodes in (post, decoder, pre):
        spec = cb.flow_chart(nodes, title="flow")
        validate(spec)
        boxes = next(iter(spec["datasets"].values()))
        assert len(boxes) == len(nodes)


def test_activation_chart_has_one_point_per_hidden_unit(minilm):
    model, trace = minilm
    ffn = lb.block_walk(model, trace, "encoder", 0, 1).sublayers[1].ffn
    assert list(lb.ffn_rows(ffn, "gelu")) == ["x W₁ + b₁", "GELU(·)"]
    np.testing.assert_array_equal(ffn.activated, ffn.hidden)
    spec = cb.activation_chart(ffn.hidden_pre[0], ffn.hidden[0], "GELU")
    validate(spec)
    (frame,) = spec["datasets"].values()
    assert len(frame) == 1536 and (frame["state"] == "input > 0").sum() == ffn.active[0]


# ---- the lecture's LayerNorm example -------------------------------------------------------------------------------
def test_the_layer_norm_example_has_whole_means_and_variances():
    ln = tc.layer_norm_steps(lb.EXAMPLE_X, lb.EXAMPLE_GAMMA, lb.EXAMPLE_BETA, lb.EXAMPLE_EPS)
    np.testing.assert_array_equal(ln.mean, [3, 5, 1])
    np.testing.assert_array_equal(ln.var, [4, 5, 3])
    assert lb.written_mean(lb.EXAMPLE_X[0]) == r"\mu = \frac{1 + 5 + 1 + 5}{4} = 3"
    assert lb.written_variance(lb.EXAMPLE_X[2]).endswith("{4} = 3")
    assert lb.written_output(ln, 0).startswith(r"y = [1\cdot(-1) + 0, 1\cdot1 + 0, 2\cdot(-1) + 1, 0.5\cdot1 + (-1)]")
    assert lb.tex(1e-5) == "10^{-5}" and lb.tex(2.5e-12) == r"2.5 \times 10^{-12}" and lb.tex(0.5) == "0.5"
    frame = lb.vectors_frame(lb.norm_rows(ln), 2)
    assert list(frame.columns) == ["x1", "x2"] and list(frame.index)[:2] == ["input x", "x − μ"]


# ---- patch embedding by hand -----------------------------------------------------------------------------------------
def test_the_patch_example_defaults_and_written_products():
    assert lpe.default_image(8, 8).tolist() == lpe.LECTURE_IMAGE.tolist()
    small = lpe.default_image(3, 10)
    assert small.shape == (3, 10) and small[:, 8:].sum() == 0 and small[2, 2] == 3
    np.testing.assert_array_equal(lpe.default_kernels(2, 4), lpe.LECTURE_KERNELS)
    assert set(np.unique(lpe.default_kernels(3, 2))) <= {0.0, 1.0} and lpe.default_kernels(3, 2).shape == (3, 2, 2)
    steps = tc.patch_embedding_steps(lpe.LECTURE_IMAGE, lpe.LECTURE_KERNELS, 4)
    frame = lpe.products_frame(steps)
    assert list(frame.columns) == ["patch", "kernel", "products written out", "sum"]
    row = frame.iloc[7]  # patch 3, kernel 2
    assert (row["patch"], row["kernel"], row["sum"]) == (3, 2, 9)
    assert (
        row["products written out"]
        == "2·1 + 0·1 + 2·0 + 2·0 + 4·0 + 0·0 + 4·1 + 0·0 + 0·0 + 3·1 + 2·0 + 3·0 + 0·1 + 0·1 + 0·0 + 0·0"
    )
    np.testing.assert_array_equal(lpe.patch_matrix(steps, 1), lpe.LECTURE_IMAGE[:4, 4:])
    assert lpe.patch_label(3, (2, 2)) == "patch 3 (row 1, column 1)"
    assert "X_p E" in lpe.statement(steps) and "(4 × 2)" in lpe.statement(steps)
    biased = lpe.products_frame(tc.patch_embedding_steps(lpe.LECTURE_IMAGE, lpe.LECTURE_KERNELS, 4, [1.0, -1.0]))
    assert list(biased["e_k"][:2]) == [15, 9]


def test_a_real_patch_is_the_models_embedding(vit_tiny):
    model, trace = vit_tiny
    real = lpe.real_patch(model, trace, 27)
    assert real.pixels.shape == (48,) and real.weight.shape == (48, 64)
    np.testing.assert_allclose(real.output, trace["encoder.embed.patch"][27], atol=1e-5)
    assert real.max_difference <= 1e-5
    np.testing.assert_allclose(real.pixels, trace["encoder.embed.patches"][27])
    sums = real.sums_frame(3)
    np.testing.assert_allclose(sums["Σ of 48 products"] + sums["+ bias"], sums["= e_k"])
    assert list(real.products_frame(2).index[:2]) == ["R r0 c0", "R r0 c1"]
    assert real.first_products(0).count("·") == 4 and "(44 more products)" in real.first_products(0)
    assert lpe.kernel_pictures(real, 3).size[0] == 3 * 80 + 2 * 6
    with pytest.raises(tc.InputError, match=r"^patch 64 is out of range: the picture has 64 patches \(0\.\.63\)$"):
        lpe.real_patch(model, trace, 64)
    with pytest.raises(
        tc.InputError, match=r"^this page shows Vision Transformers \(ViT, DeiT\); this model reads text$"
    ):
        lpe.real_patch(tc.load_model("minilm", device="cpu"), trace, 0)


def test_a_real_patch_picture_is_the_patch_of_the_picture_the_model_saw():
    model = tc.load_model("vit-tiny", device="cpu")
    name, data = next((n, d) for n, d in samples.samples().items() if n.startswith("shapes:"))
    result = vv.analyse(model, data, name)
    picture = lpe.patch_picture(result.image, result.grid_hw, 9, size=40)
    expected = result.image.convert("RGB").crop((4, 4, 8, 8)).resize((40, 40), Image.Resampling.NEAREST)
    assert np.array_equal(np.asarray(picture), np.asarray(expected))


# ---- other families: a GPT-2-style decoder, a T5-style encoder-decoder (RMSNorm, gated FFN, position bias) ------
def _randomised(model, seed=0):
    """Every parameter drawn at random around 0 (norm weights, the 1-D size-32 ones, around 1), float32 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.ndim == 1 and p.shape[0] == 32 else 0.0))
    return model.eval()


def test_a_gpt2_style_decoder_recomposes_with_its_causal_mask():
    model = _randomised(tc.Decoder(tc.DecoderConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=3)))
    trace = model.trace([3, 14, 15, 9, 26, 5], keep=lb.block_read).compact()
    layout = lb.block_layout(model, "decoder")
    assert (layout.norm, layout.causal, layout.activation, layout.cross) == ("pre", True, "gelu_tanh", False)
    assert walk_everything(model, trace, "decoder") <= TOLERANCE
    walk = lb.block_walk(model, trace, "decoder", 2, 1)
    np.testing.assert_array_equal(walk.sublayers[0].attention.visible, [0, 1])


def test_a_t5_style_model_recomposes_with_rms_norm_a_gated_ffn_and_position_bias():
    config = tc.Seq2SeqConfig(
        src_vocab_size=40,
        tgt_vocab_size=40,
        d_model=32,
        n_heads=4,
        d_ff=48,
        n_encoder_layers=2,
        n_decoder_layers=2,
        norm="pre",
        norm_type="rmsnorm",
        ffn_gated=True,
        activation="gelu_tanh",
        bias=False,
        scale_attention=False,
        rel_pos_buckets=8,
        rel_pos_max_distance=16,
        positional="none",
        embed_scale=False,
        ln_eps=1e-6,
    )
    model = _randomised(tc.EncoderDecoder(config))
    trace = model.trace([4, 8, 15, 16, 23, 2], [1, 7, 9, 11, 2], keep=lb.block_read).compact()
    assert "encoder.position_bias" in trace.activations
    for stack in ("encoder", "decoder"):
        assert walk_everything(model, trace, stack) <= TOLERANCE
    walk = lb.block_walk(model, trace, "decoder", 1, 3)
    norm = walk.sublayers[0].norm
    assert isinstance(norm, tc.RMSNormSteps) and norm.eps == 1e-6
    assert walk.sublayers[2].ffn.gate is not None
    assert [n.kind for n in lb.flow_nodes(walk.layout)][:4] == ["io", "norm", "attn", "add"]
    assert lb.flow_nodes(walk.layout)[1].label == "RMSNorm"


def test_a_llama_style_decoder_reads_its_rotary_grouped_attention_from_the_trace():
    from tformer_core.models.llama import Llama, LlamaConfig

    config = LlamaConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, n_layers=2)
    model = _randomised(Llama(config))
    trace = model.trace([3, 14, 15, 9, 26, 5], keep=lb.block_read).compact()
    assert not [n for n in trace.activations if n.endswith(("q_pre_rope", "k_pre_rope", ".attn.k"))]
    layout = lb.block_layout(model, "decoder")
    assert not layout.attention_recomputed and (layout.norm_type, layout.gated) == ("rmsnorm", True)
    assert walk_everything(model, trace, "decoder") <= TOLERANCE
    walk = lb.block_walk(model, trace, "decoder", 1, 4)
    assert walk.sublayers[0].attention is None and walk.sublayers[0].out_difference == 0  # the trace's own
    assert lb.flow_nodes(layout)[5].detail == "32 → 48 (SiLU, gated) → 32"
    ffn = walk.sublayers[1].ffn
    rows = lb.ffn_rows(ffn, "silu")
    assert list(rows) == ["gate g = x W_gate + b_gate", "SiLU(g)", "up u = x W₁ + b₁", "h = SiLU(g) ⊙ u"]
    np.testing.assert_allclose(rows["SiLU(g)"] * rows["up u = x W₁ + b₁"], rows["h = SiLU(g) ⊙ u"], atol=1e-15)
    np.testing.assert_allclose(rows["SiLU(g)"], torch.nn.functional.silu(torch.from_numpy(ffn.gate[0])).numpy())
    assert r"\odot" in lb.ffn_formula(layout) and "W_{gate}" in lb.ffn_formula(layout)
