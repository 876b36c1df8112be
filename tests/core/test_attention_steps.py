"""The lecture's worked example, checked against numbers computed by hand."""

import math

import numpy as np
import pytest
import torch

import tformer_core as tc

# X: three tokens with d_model = 2; W^Q = W^K = I, so Q = K = X and d_k = 2.
X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
W_Q = W_K = np.eye(2)
W_V = np.array([[1.0, 2.0], [3.0, 4.0]])

# By hand: s = 1/sqrt(2) = 0.70710678, e = exp(s) = 2.02811498.
S = 1 / math.sqrt(2)
E = math.exp(S)
A = E / (2 * E + 1)  # 0.40111209: weight of a key whose score is 1 when the row is (1, 0, 1)
B = 1 / (2 * E + 1)  # 0.19777581


def test_projections_scores_and_scaling():
    steps = tc.attention_steps(X, W_Q, W_K, W_V)
    np.testing.assert_array_equal(steps.Q, X)
    np.testing.assert_array_equal(steps.V, [[1, 2], [3, 4], [4, 6]])  # V = X W^V, row 3 = row 1 + row 2
    np.testing.assert_array_equal(steps.scores, [[1, 0, 1], [0, 1, 1], [1, 1, 2]])  # q_i . k_j
    np.testing.assert_allclose(steps.scaled, np.array([[1, 0, 1], [0, 1, 1], [1, 1, 2]]) * 0.70710678, atol=1e-8)
    assert steps.d_k == 2 and steps.scale == pytest.approx(0.7071067811865476)


def test_softmax_rows_and_output_by_hand():
    steps = tc.attention_steps(X, W_Q, W_K, W_V)
    expected_weights = np.array(
        [
            [A, B, A],  # 0.40111, 0.19778, 0.40111
            [B, A, A],
            [1 / (2 + E), 1 / (2 + E), E / (2 + E)],  # 0.24826, 0.24826, 0.50349
        ]
    )
    np.testing.assert_allclose(steps.weights, expected_weights, atol=1e-12)
    np.testing.assert_allclose(steps.weights[0], [0.401112, 0.197776, 0.401112], atol=1e-6)
    np.testing.assert_allclose(steps.weights[2], [0.248255, 0.248255, 0.503490], atol=1e-6)
    # Row 0: A*(1,2) + B*(3,4) + A*(4,6) = (5A + 3B, 8A + 4B); with 2A + B = 1 that is (3 - A, 4).
    np.testing.assert_allclose(steps.output[0], [3 - A, 4.0], atol=1e-12)
    np.testing.assert_allclose(steps.output, [[2.598888, 4.0], [3.005560, 4.406673], [3.006980, 4.510470]], atol=1e-6)


def test_causal_mask_gives_minus_inf_then_zero():
    steps = tc.attention_steps(X, W_Q, W_K, W_V, mask="causal")
    assert np.isneginf(steps.scaled[0, 1]) and np.isneginf(steps.scaled[0, 2]) and np.isneginf(steps.scaled[1, 2])
    np.testing.assert_array_equal(steps.weights[0], [1, 0, 0])  # the first token sees only itself
    # Row 1 keeps scores (0, 1): weights 1/(1+e), e/(1+e) = 0.330238, 0.669762.
    np.testing.assert_allclose(steps.weights[1], [1 / (1 + E), E / (1 + E), 0], atol=1e-12)
    np.testing.assert_allclose(steps.weights[1, :2], [0.330238, 0.669762], atol=1e-6)
    np.testing.assert_allclose(steps.output[0], [1, 2])  # = v_0
    assert np.all(np.triu(steps.weights, 1) == 0)


def test_padding_mask_hides_keys():
    steps = tc.attention_steps(X, W_Q, W_K, W_V, mask=[True, True, False])  # third token is padding
    np.testing.assert_array_equal(steps.weights[:, 2], 0)
    # Row 0 over keys (0, 1): scores (1, 0) -> e/(e+1), 1/(e+1).
    np.testing.assert_allclose(steps.weights[0, :2], [E / (E + 1), 1 / (E + 1)], atol=1e-12)
    np.testing.assert_allclose(steps.weights.sum(-1), 1.0, atol=1e-12)


def test_fully_masked_row_is_zero_not_nan():
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    steps = tc.attention_steps(X, W_Q, W_K, W_V, mask=mask)
    np.testing.assert_array_equal(steps.weights[1], 0)
    np.testing.assert_array_equal(steps.output[1], 0)
    assert np.isfinite(steps.output).all()


def test_several_heads_split_concat_and_output_projection():
    rng = np.random.default_rng(0)
    X4 = rng.normal(size=(5, 6))
    Wq, Wk, Wv = rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 8))
    Wo = rng.normal(size=(8, 6))
    steps = tc.attention_steps(X4, Wq, Wk, Wv, n_heads=2, W_o=Wo)
    assert steps.weights.shape == (2, 5, 5) and steps.z.shape == (2, 5, 4) and steps.concat.shape == (5, 8)
    assert steps.d_k == 2 and steps.scale == pytest.approx(1 / math.sqrt(2))
    for h in range(2):
        # Head h is single-head attention with the h-th block of columns of each W.
        one = tc.attention_steps(X4, Wq[:, 2 * h : 2 * h + 2], Wk[:, 2 * h : 2 * h + 2], Wv[:, 4 * h : 4 * h + 4])
        np.testing.assert_allclose(steps.weights[h], one.weights, atol=1e-14)
        np.testing.assert_allclose(steps.concat[:, 4 * h : 4 * h + 4], one.output, atol=1e-14)
    np.testing.assert_allclose(steps.output, steps.concat @ Wo, atol=1e-14)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(X=[[1, "a"]], W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)), "^X must hold numbers only$"),
        (dict(X=[[1, np.nan]], W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)), r"X\[0, 1\] is not a finite number"),
        (dict(X=np.ones((2, 3)), W_q=np.eye(2), W_k=np.eye(3), W_v=np.eye(3)), "W_q has 2 rows but X has 3 columns"),
        (
            dict(X=np.ones((2, 2)), W_q=np.ones((2, 3)), W_k=np.eye(2), W_v=np.eye(2)),
            r"W_q and W_k must have the same number of columns \(d_k\): 3 vs 2",
        ),
        (
            dict(X=np.ones((0, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)),
            r"X must be a non-empty 2-D matrix, got shape \(0, 2\)",
        ),
        (
            dict(X=np.ones((2, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2), mask=np.ones((3, 3), bool)),
            r"the mask must have shape \(2,\) or \(2, 2\) for 2 tokens, got \(3, 3\)",
        ),
        (
            dict(X=np.ones((2, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2), mask="future"),
            "mask must be None, 'causal' or a boolean array, got 'future'",
        ),
        (
            dict(X=np.ones((2, 4)), W_q=np.ones((4, 3)), W_k=np.ones((4, 3)), W_v=np.eye(4), n_heads=2),
            "W_q has 3 columns, which do not split into 2 equal heads",
        ),
    ],
)
def test_bad_input_names_the_problem(kwargs, message):
    with pytest.raises(tc.InputError, match=message):
        tc.attention_steps(**kwargs)


# The lectures' F.scaled_dot_product_attention demo: Q, K and V = K given directly, d_k = 4 (scale 1/2).
SDPA_Q = [[0, 1, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
SDPA_K = [[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_q_k_v_given_directly_reproduce_the_lectures_pytorch_demo():
    steps = tc.attention_from_qkv(SDPA_Q, SDPA_K, SDPA_K)
    # Query [0 1 0 0] scores the keys by their second entry: [1, 0, 1, 1] / 2; e^0.5 / (3 e^0.5 + 1) = 0.27727.
    np.testing.assert_allclose(steps.scaled[0], [0.5, 0, 0.5, 0.5])
    np.testing.assert_allclose(steps.weights[0], np.array([e := np.exp(0.5), 1, e, e]) / (3 * e + 1))
    expected = [[1.0, 0.8318, 0.7227, 0.4455]] * 3 + [[1.0, 0.7227, 0.8318, 0.5545]]
    np.testing.assert_allclose(steps.z, expected, atol=5e-5)
    torch_z = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(m, dtype=torch.float64) for m in (SDPA_Q, SDPA_K, SDPA_K))
    )
    np.testing.assert_allclose(steps.z, torch_z.numpy(), rtol=0, atol=1e-15)


def test_given_q_k_v_equal_the_steps_from_x_and_the_ws():
    rng = np.random.default_rng(3)
    X, W_q, W_k, W_v = (
        rng.normal(size=(5, 6)),
        rng.normal(size=(6, 4)),
        rng.normal(size=(6, 4)),
        rng.normal(size=(6, 2)),
    )
    from_x = tc.attention_steps(X, W_q, W_k, W_v, "causal", n_heads=2)
    given = tc.attention_from_qkv(X @ W_q, X @ W_k, X @ W_v, "causal", n_heads=2)
    for name in ("scores", "weights", "z", "concat"):
        np.testing.assert_array_equal(getattr(given, name), getattr(from_x, name))


def test_given_q_k_v_may_have_fewer_queries_than_keys_and_bad_shapes_are_named():
    steps = tc.attention_from_qkv(np.eye(2, 3), np.eye(4, 3), np.ones((4, 2)), mask=[True, True, True, False])
    assert steps.weights.shape == (2, 4) and np.all(steps.weights[:, 3] == 0)
    np.testing.assert_allclose(steps.weights.sum(axis=1), 1.0)
    with pytest.raises(tc.InputError, match=r"^Q and K must have the same number of columns \(d_k\): 3 vs 4$"):
        tc.attention_from_qkv(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 4)))
    with pytest.raises(tc.InputError, match=r"^K and V need one row per key: K has 2 rows, V has 3$"):
        tc.attention_from_qkv(np.ones((2, 3)), np.ones((2, 3)), np.ones((3, 3)))


def test_pytorch_padding_conventions_are_opposite_and_the_same_mask():
    """nn.MultiheadAttention's key_padding_mask (True = padding) and SDPA's bool attn_mask (True = may attend)
    hide the same key only when one is the negation of the other; both equal our additive -inf mask."""
    from tformer_views.lessons import attention as ls

    conventions = ls.mask_conventions(4, [2])
    assert conventions.key_padding_mask.tolist() == [False, False, True, False]
    assert conventions.sdpa_bool.tolist() == [True, True, False, True]
    assert conventions.additive.tolist() == [0, 0, -np.inf, 0] and conventions.hf_attention_mask.tolist() == [
        1,
        1,
        0,
        1,
    ]
    ours = tc.attention_from_qkv(SDPA_Q, SDPA_K, SDPA_K, mask=conventions.sdpa_bool)
    q, k = (torch.tensor(m, dtype=torch.float64)[None] for m in (SDPA_Q, SDPA_K))  # [batch 1, n, d]
    # nn.MultiheadAttention with identity projections: its weights are softmax(QK^T / sqrt(d)) with its mask.
    mha = torch.nn.MultiheadAttention(4, 1, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(4).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(4))
    out, weights = mha(q, k, k, key_padding_mask=torch.tensor(conventions.key_padding_mask)[None])
    np.testing.assert_allclose(weights[0].detach().numpy(), ours.weights, atol=1e-12)
    np.testing.assert_allclose(out[0].detach().numpy(), ours.z, atol=1e-12)
    additive = torch.tensor(conventions.additive)[None, :].expand(4, 4)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q[0], k[0], k[0], attn_mask=additive)
    np.testing.assert_allclose(sdpa.numpy(), ours.z, atol=1e-12)
    # Passing the padding mask where SDPA expects "may attend" hides every key but the padding.
    wrong = torch.nn.functional.scaled_dot_product_attention(
        q[0], k[0], k[0], attn_mask=torch.tensor(conventions.key_padding_mask)[None, :].expand(4, 4)
    )
    np.testing.assert_allclose(wrong.numpy(), np.tile(np.array(SDPA_K[2], dtype=float), (4, 1)))
