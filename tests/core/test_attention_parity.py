"""The core's written-out multi-head attention against PyTorch's own implementations, same weights."""

import pytest
import torch
import torch.nn.functional as F

import tformer_core as tc
from tformer_core.capture import capture, name_hook_points

B, T, D, H = 2, 7, 24, 4
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
MASKS = ["none", "causal", "padding", "causal+padding"]


def _setup(dtype, mask_kind, seed=0):
    torch.manual_seed(seed)
    ours = tc.MultiHeadAttention(D, H, D // H).to(dtype).eval()
    name_hook_points(ours)  # a standalone module: hooks are named q, k, v, scores, ...
    x = torch.randn(B, T, D, dtype=dtype)
    lengths = torch.tensor([T, 4])  # the second sequence ends with 3 padding tokens
    real = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) True for real tokens
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if "causal" in mask_kind:
        allowed = allowed & causal
    if "padding" in mask_kind:
        allowed = allowed & real[:, None, None, :]
    mask = None if mask_kind == "none" else allowed
    return ours, x, mask, real, causal


def _run(ours, x, mask):
    with torch.inference_mode(), capture() as sink:
        out = ours(x, mask=mask)
    return out, sink.tensors


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_matches_scaled_dot_product_attention(dtype, mask_kind):
    ours, x, mask, _, _ = _setup(dtype, mask_kind)
    out, t = _run(ours, x, mask)
    with torch.inference_mode():
        z_ref = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=mask)  # (B, h, T, dh)
        out_ref = ours.W_o(z_ref.transpose(1, 2).reshape(B, T, D))
    torch.testing.assert_close(t["z"], z_ref, atol=TOL[dtype], rtol=0)
    torch.testing.assert_close(out, out_ref, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_matches_nn_multihead_attention(dtype, mask_kind):
    ours, x, mask, real, causal = _setup(dtype, mask_kind)
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True).to(dtype).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        ref.out_proj.bias.copy_(ours.W_o.bias)
    # nn.MultiheadAttention's boolean masks mean the opposite: True = NOT allowed.
    kwargs = {}
    if "causal" in mask_kind:
        kwargs["attn_mask"] = ~causal
    if "padding" in mask_kind:
        kwargs["key_padding_mask"] = ~real
    out, t = _run(ours, x, mask)
    with torch.inference_mode():
        out_ref, weights_ref = ref(x, x, x, need_weights=True, average_attn_weights=False, **kwargs)
    torch.testing.assert_close(t["weights"], weights_ref, atol=TOL[dtype], rtol=0)
    torch.testing.assert_close(out, out_ref, atol=TOL[dtype], rtol=0)
    if mask is not None:
        assert bool((t["weights"][~mask.expand(B, H, T, T)] == 0).all())


def test_numpy_worked_example_matches_the_torch_module():
    ours, x, _, _, _ = _setup(torch.float64, "causal")
    X = x[0].numpy()
    steps = tc.attention_steps(
        X,
        ours.W_q.weight.detach().T.numpy(),
        ours.W_k.weight.detach().T.numpy(),
        ours.W_v.weight.detach().T.numpy(),
        mask="causal",
        n_heads=H,
        W_o=ours.W_o.weight.detach().T.numpy(),
    )
    ours.W_q.bias.data.zero_(), ours.W_k.bias.data.zero_(), ours.W_v.bias.data.zero_(), ours.W_o.bias.data.zero_()
    out, t = _run(ours, x[:1], torch.ones(T, T, dtype=torch.bool).tril())
    torch.testing.assert_close(torch.from_numpy(steps.weights), t["weights"][0], atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.from_numpy(steps.scores), t["scores"][0], atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.from_numpy(steps.output), out[0], atol=1e-12, rtol=0)


def test_fully_masked_query_gets_zero_weights_not_nan():
    ours, x, _, _, _ = _setup(torch.float32, "none")
    # Left padding under a causal mask: query 0 may attend to nothing.
    real = torch.tensor([[False, True, True, True, True, True, True]] * B)
    mask = torch.ones(T, T, dtype=torch.bool).tril() & real[:, None, None, :]
    out, t = _run(ours, x, mask)
    assert torch.isfinite(out).all()
    assert bool((t["weights"][:, :, 0] == 0).all())
    torch.testing.assert_close(t["weights"][:, :, 1:].sum(-1), torch.ones(B, H, T - 1))
