"""The public weight accessors (model.weights()): TransformerLens's shapes, and they reproduce what the model
computed, for every family (encoder, decoder, Llama with grouped-query attention, seq2seq with cross-attention,
ViT). A view that reads weights through them computes the model's own numbers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tformer_core as tc
from tests.core.hf_helpers import save_with_words, tiny_opt
from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_seq2seq, tiny_vit
from tformer_core.checkpoints.fallback import load_transformers

IDS = [3, 9, 4, 17, 8]


def tiny_llama():
    torch.manual_seed(1)
    config = tc.LlamaConfig(vocab_size=40, max_positions=32, n_layers=2, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24)
    model = tc.Llama(config)
    with torch.no_grad():  # RMSNorm's gamma away from 1, so a test cannot pass by the identity
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.normal_(1.0, 0.2)
    return model


def heads_of(x, W, b):
    """x [n, D] through per-head W [h, D, dh] and b [h, dh] -> [h, n, dh]."""
    return torch.einsum("nd,hde->hne", x, W) + b[:, None, :]


def t(trace, name):
    return torch.from_numpy(np.array(trace[name]))


def check_attention(trace, prefix, attn, q_in, kv_in, pre_rope=False):
    suffix = "_pre_rope" if pre_rope else ""
    torch.testing.assert_close(heads_of(q_in, attn.W_Q, attn.b_Q), t(trace, f"{prefix}.q{suffix}"), atol=1e-5, rtol=0)
    torch.testing.assert_close(heads_of(kv_in, attn.W_K, attn.b_K), t(trace, f"{prefix}.k{suffix}"), atol=1e-5, rtol=0)
    torch.testing.assert_close(heads_of(kv_in, attn.W_V, attn.b_V), t(trace, f"{prefix}.v"), atol=1e-5, rtol=0)
    out = torch.einsum("hne,hed->nd", t(trace, f"{prefix}.z"), attn.W_O) + attn.b_O
    torch.testing.assert_close(out, t(trace, f"{prefix}.out"), atol=1e-5, rtol=0)


def check_ffn(trace, prefix, mlp, x, act):
    hidden = act(x @ mlp.W_in + mlp.b_in)
    if mlp.W_gate is not None:
        hidden = act(x @ mlp.W_gate + mlp.b_gate) * (x @ mlp.W_in + mlp.b_in)
    torch.testing.assert_close(hidden, t(trace, f"{prefix}.mlp.hidden"), atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden @ mlp.W_out + mlp.b_out, t(trace, f"{prefix}.mlp.out"), atol=1e-5, rtol=0)


def check_norm(norm, x, y):
    if norm.kind == "layernorm":
        expected = F.layer_norm(x, norm.w.shape, norm.w, norm.b, norm.eps)
    else:
        assert norm.b is None
        expected = F.rms_norm(x, norm.w.shape, norm.w, norm.eps)
    torch.testing.assert_close(expected, y, atol=1e-5, rtol=0)


def test_an_encoders_weights_reproduce_its_trace():
    model = tiny_encoder()  # post-norm, biases, learned positions, segments, embedding LayerNorm
    trace = model.trace(IDS, keep=lambda name: True)
    w = model.weights()
    L, h, D, dh = 2, 4, 16, 4
    assert (w.W_Q.shape, w.W_K.shape, w.W_O.shape, w.b_Q.shape, w.b_O.shape) == (
        (L, h, D, dh),
        (L, h, D, dh),
        (L, h, dh, D),
        (L, h, dh),
        (L, D),
    )
    assert w.W_in.shape == (L, D, 32) and w.W_out.shape == (L, 32, D) and w.positional == "learned"
    torch.testing.assert_close(w.W_E[IDS], t(trace, "encoder.embed.tok"))
    torch.testing.assert_close(w.W_pos[: len(IDS)], t(trace, "encoder.embed.pos"))
    torch.testing.assert_close(w.W_segment[[0] * len(IDS)], t(trace, "encoder.embed.segment"))
    total = t(trace, "encoder.embed.tok") + t(trace, "encoder.embed.pos") + t(trace, "encoder.embed.segment")
    check_norm(w.embed_ln, total, t(trace, "encoder.embed.out"))
    for layer in range(L):
        p, block = f"encoder.{layer}", w.block(layer)
        x = t(trace, f"{p}.resid_pre")
        check_attention(trace, f"{p}.attn", block.attn, x, x)
        check_norm(block.ln_attn, x + t(trace, f"{p}.attn.out"), t(trace, f"{p}.ln_attn"))
        check_ffn(trace, p, block.mlp, t(trace, f"{p}.resid_after_attn"), F.gelu)
        check_norm(block.ln_mlp, t(trace, f"{p}.resid_after_attn") + t(trace, f"{p}.mlp.out"), t(trace, f"{p}.ln_mlp"))
    assert w.block(0).cross_attn is None and w.ln_final is None


def test_a_decoders_weights_reproduce_its_trace():
    model = tiny_decoder()  # GPT-2: pre-norm, tanh-GELU, final LayerNorm
    trace = model.trace(IDS, keep=lambda name: True)
    w = model.weights()
    assert w.stack == "decoder" and w.embed_scale == 1.0
    for layer in range(2):
        p, block = f"decoder.{layer}", w.block(layer)
        check_norm(block.ln_attn, t(trace, f"{p}.resid_pre"), t(trace, f"{p}.ln_attn"))
        check_attention(trace, f"{p}.attn", block.attn, t(trace, f"{p}.ln_attn"), t(trace, f"{p}.ln_attn"))
        check_ffn(trace, p, block.mlp, t(trace, f"{p}.ln_mlp"), lambda x: F.gelu(x, approximate="tanh"))
    check_norm(w.ln_final, t(trace, "decoder.1.resid_post"), t(trace, "decoder.out"))


def test_llama_weights_have_one_key_value_matrix_per_key_value_head():
    model = tiny_llama()
    trace = model.trace(IDS, keep=lambda name: True)
    w = model.weights()
    attn = w.block(1).attn
    assert (attn.W_Q.shape, attn.W_K.shape, attn.W_V.shape) == ((4, 16, 4), (2, 16, 4), (2, 16, 4))
    assert attn.rotary and attn.kv_head(3) == 1 and w.positional == "none" and w.W_pos is None
    assert not attn.b_Q.any() and w.block(0).ln_attn.kind == "rmsnorm"
    for layer in range(2):
        p, block = f"decoder.{layer}", w.block(layer)
        check_norm(block.ln_attn, t(trace, f"{p}.resid_pre"), t(trace, f"{p}.ln_attn"))
        x = t(trace, f"{p}.ln_attn")
        check_attention(trace, f"{p}.attn", block.attn, x, x, pre_rope=True)
        assert block.mlp.W_gate is not None
        check_ffn(trace, p, block.mlp, t(trace, f"{p}.ln_mlp"), F.silu)


def test_seq2seq_weights_include_the_cross_attention():
    model = tiny_seq2seq()  # post-norm, sinusoidal positions, embeddings * sqrt(d_model)
    trace = model.trace([4, 5, 6, 7], [1, 8, 9], keep=lambda name: True)
    enc, dec = model.weights("encoder"), model.weights("decoder")
    assert enc.positional == dec.positional == "sinusoidal" and dec.embed_scale == 4.0
    torch.testing.assert_close(dec.W_E[[1, 8, 9]] * dec.embed_scale, t(trace, "decoder.embed.tok"))
    torch.testing.assert_close(dec.W_pos[:3], t(trace, "decoder.embed.pos"))
    memory = t(trace, "encoder.out")
    for layer in range(3):
        p, block = f"decoder.{layer}", dec.block(layer)
        x = t(trace, f"{p}.resid_pre")
        check_attention(trace, f"{p}.attn", block.attn, x, x)
        check_attention(trace, f"{p}.cross_attn", block.cross_attn, t(trace, f"{p}.resid_after_attn"), memory)
        check_norm(
            block.ln_cross,
            t(trace, f"{p}.resid_after_attn") + t(trace, f"{p}.cross_attn.out"),
            t(trace, f"{p}.ln_cross"),
        )
    assert dec.W_Q.shape == (3, 4, 16, 4) and enc.W_Q.shape == (2, 4, 16, 4)


def test_vit_weights_give_the_patch_embedding_as_a_convolution():
    model = tiny_vit()
    picture = image()
    trace = model.trace(picture, keep=lambda name: True)
    w = model.weights()
    assert w.patch.W.shape == (16, 3, 4, 4) and w.W_pos.shape == (2 + 12, 16) and w.W_E is None
    conv = F.conv2d(picture[None], w.patch.W, w.patch.b, stride=4)  # [1, D, rows, cols]
    torch.testing.assert_close(conv[0].flatten(1).T, t(trace, "encoder.embed.patch"), atol=1e-5, rtol=0)
    tokens = t(trace, "encoder.embed.tokens")
    torch.testing.assert_close(tokens[0], w.patch.cls_token)
    torch.testing.assert_close(tokens[1], w.patch.dist_token)
    torch.testing.assert_close(w.W_pos, t(trace, "encoder.embed.pos"))


def test_the_tensors_are_views_of_the_parameters_not_copies():
    model = tiny_decoder()
    attn = model.weights().block(0).attn
    assert attn.W_Q.untyped_storage().data_ptr() == model.decoder.blocks[0].attn.W_q.weight.untyped_storage().data_ptr()
    assert not attn.W_Q.requires_grad


def test_a_model_transformers_runs_has_no_weight_accessors(tmp_path):
    model = load_transformers(save_with_words(tiny_opt(), tmp_path / "opt"))
    assert not model.capabilities.weights
    with pytest.raises(
        ValueError, match=r"^OPTForCausalLM runs through transformers' own code: its weight matrices are not read"
    ):
        model.weights()
