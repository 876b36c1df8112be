"""The lecture's worked example, checked against numbers computed by hand."""

import math

import numpy as np
import pytest

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
        (dict(X=[[1, "a"]], W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)), "X must hold numbers"),
        (dict(X=[[1, np.nan]], W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)), r"X\[0, 1\] is not a finite number"),
        (dict(X=np.ones((2, 3)), W_q=np.eye(2), W_k=np.eye(3), W_v=np.eye(3)), "W_q has 2 rows but X has 3 columns"),
        (dict(X=np.ones((2, 2)), W_q=np.ones((2, 3)), W_k=np.eye(2), W_v=np.eye(2)), "same number of columns"),
        (dict(X=np.ones((0, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)), "non-empty 2-D"),
        (dict(X=np.ones((2, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2), mask=np.ones((3, 3), bool)), "shape"),
        (dict(X=np.ones((2, 2)), W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2), mask="future"), "causal"),
        (dict(X=np.ones((2, 4)), W_q=np.ones((4, 3)), W_k=np.ones((4, 3)), W_v=np.eye(4), n_heads=2), "2 equal heads"),
    ],
)
def test_bad_input_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tc.attention_steps(**kwargs)
