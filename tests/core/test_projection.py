"""Query–key space (tformer_core.projection): a joint PCA of one head's queries and keys.

Checked against a PCA worked by hand, for the properties every PCA must have (orthonormal axes, explained
variance decreasing and summing to at most 1, a fixed sign), and on real traces of the tiny models: with every
axis kept, the projection loses nothing (distances, and the softmax inputs and weights of the trace)."""

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import tiny_decoder, tiny_encoder, tiny_seq2seq
from tformer_core.numerics import softmax
from tformer_core.projection import sign_fixed

# Four points built from the axes u1 = (0.6, 0.8), u2 = (0.8, -0.6) around the mean (1, 2): point i is
# mean + a_i u1 + b_i u2 with (a, b) = (3, 1), (-3, 1), (1, -1), (-1, -1). The a's and b's sum to 0 and are
# uncorrelated, so u1 and u2 are the principal axes, with variances 20 and 4 of 24 (5/6 and 1/6).
HAND_Q = np.array([[3.6, 3.8], [0.0, -1.0]])
HAND_K = np.array([[0.8, 3.4], [-0.4, 1.8]])


def _random(n_q=7, n_k=9, d=6, seed=0):
    rng = np.random.default_rng(seed)
    # Different spreads per dimension, so the axes are well separated (no ties between variances).
    spread = np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.25])[:d]
    return rng.normal(size=(n_q, d)) * spread + 1.0, rng.normal(size=(n_k, d)) * spread - 2.0


def test_the_projection_reproduces_a_pca_worked_by_hand():
    p = tc.project_qk(HAND_Q, HAND_K)
    np.testing.assert_allclose(p.components, [[0.6, 0.8], [0.8, -0.6]], atol=1e-12)
    np.testing.assert_allclose(p.mean, [1.0, 2.0], atol=1e-12)
    np.testing.assert_allclose(p.queries, [[3.0, 1.0], [-3.0, 1.0]], atol=1e-12)
    np.testing.assert_allclose(p.keys, [[1.0, -1.0], [-1.0, -1.0]], atol=1e-12)
    np.testing.assert_allclose(p.explained, [20 / 24, 4 / 24], atol=1e-12)
    one = tc.project_qk(HAND_Q, HAND_K, n_components=1)
    np.testing.assert_allclose(one.queries[:, 0], [3.0, -3.0], atol=1e-12)
    np.testing.assert_allclose(one.explained, [20 / 24], atol=1e-12)


def test_the_axes_are_orthonormal_and_the_explained_variance_decreases_to_at_most_one():
    q, k = _random()
    for n in (1, 2, 3, 6):
        p = tc.project_qk(q, k, n_components=n)
        assert p.queries.shape == (7, n) and p.keys.shape == (9, n) and p.components.shape == (n, 6)
        np.testing.assert_allclose(p.components @ p.components.T, np.eye(n), atol=1e-12)
        assert np.all(np.diff(p.explained) <= 0) and np.all(p.explained >= 0)
        assert p.explained.sum() <= 1 + 1e-12
        # Each share is the variance of the coordinates along its axis over the total variance.
        coords = np.concatenate([p.queries, p.keys])
        total = ((np.concatenate([q, k]) - p.mean) ** 2).sum()
        np.testing.assert_allclose(p.explained, (coords**2).sum(0) / total, atol=1e-12)
        np.testing.assert_allclose(coords.mean(0), 0.0, atol=1e-12)  # centred together
    np.testing.assert_allclose(tc.project_qk(q, k, n_components=6).explained.sum(), 1.0, atol=1e-12)
    two = tc.project_qk(q, k, 2).explained
    assert 0.5 < two.sum() < 1.0  # 2 of 6 axes keep most, not all


def test_the_sign_of_each_axis_is_fixed():
    q, k = _random(seed=3)
    p = tc.project_qk(q, k, 3)
    biggest = p.components[np.arange(3), np.abs(p.components).argmax(1)]
    assert np.all(biggest > 0)
    np.testing.assert_array_equal(sign_fixed(-p.components), p.components)  # what LAPACK returns flipped
    np.testing.assert_array_equal(sign_fixed(p.components), p.components)
    # The same points in another order, or moved as a whole, give the same axes and the same coordinates.
    order_q, order_k = np.random.default_rng(1).permutation(len(q)), np.random.default_rng(2).permutation(len(k))
    shuffled = tc.project_qk(q[order_q], k[order_k], 3)
    np.testing.assert_allclose(shuffled.components, p.components, atol=1e-10)
    np.testing.assert_allclose(shuffled.queries, p.queries[order_q], atol=1e-10)
    np.testing.assert_allclose(shuffled.keys, p.keys[order_k], atol=1e-10)
    moved = tc.project_qk(q + 7.5, k + 7.5, 3)
    np.testing.assert_allclose(moved.queries, p.queries, atol=1e-10)
    np.testing.assert_allclose(moved.keys, p.keys, atol=1e-10)
    again = tc.project_qk(q.astype(np.float32), k.astype(np.float32), 3)  # float32 input: computed in float64
    np.testing.assert_allclose(again.components, p.components, atol=1e-6)


def test_scaling_and_the_key_translation_change_no_attention_weight():
    q, k = _random(seed=5)
    scale = 1 / np.sqrt(6)
    plain = tc.project_qk(q, k, 2)
    scaled = tc.project_qk(q, k, 2, scale=scale)
    np.testing.assert_allclose(scaled.queries, plain.queries * np.sqrt(scale), atol=1e-10)
    np.testing.assert_allclose(scaled.components, plain.components, atol=1e-10)
    full = tc.project_qk(q, k, 6, scale=scale)
    np.testing.assert_allclose(full.logits(), q @ k.T * scale, atol=1e-10)
    aligned = tc.project_qk(q, k, 6, scale=scale, align_means=True)
    np.testing.assert_allclose(aligned.queries.mean(0), aligned.keys.mean(0), atol=1e-10)
    np.testing.assert_allclose(aligned.key_shift, np.sqrt(scale) * (q.mean(0) - k.mean(0)), atol=1e-12)
    assert not np.allclose(aligned.logits(), q @ k.T * scale)  # each row moved by a constant...
    shift = aligned.logits() - q @ k.T * scale
    np.testing.assert_allclose(shift, shift[:, :1].repeat(k.shape[0], 1), atol=1e-10)
    np.testing.assert_allclose(softmax(aligned.logits()), softmax(q @ k.T * scale), atol=1e-12)  # ...cancelled
    # The gap between the two clouds is gone: the queries' and keys' means were 3 units apart per dimension.
    assert np.linalg.norm(plain.queries.mean(0) - plain.keys.mean(0)) > 3
    assert np.linalg.norm(aligned.queries.mean(0) - aligned.keys.mean(0)) < 1e-9


def test_fewer_points_than_axes_and_bad_input():
    p = tc.project_qk([[1.0, 2.0, 3.0, 4.0]], [[0.0, 2.0, 3.0, 6.0]], n_components=3)
    assert p.queries.shape == (1, 3) and p.keys.shape == (1, 3)
    np.testing.assert_allclose(p.components @ p.components.T, np.eye(3), atol=1e-12)  # completed basis
    np.testing.assert_allclose(p.explained, [1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(p.queries[:, 1:], 0.0)
    assert abs(p.queries[0, 0] - p.keys[0, 0]) == pytest.approx(np.sqrt(1 + 4))  # their distance, on PC1
    same = tc.project_qk([[1.0, 1.0]], [[1.0, 1.0]], 2)  # one point twice: no variance at all
    np.testing.assert_array_equal(same.explained, [0.0, 0.0])
    np.testing.assert_array_equal(same.queries, [[0.0, 0.0]])
    with pytest.raises(ValueError, match=r"^queries and keys differ in size: d = 3 and 4$"):
        tc.project_qk(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"^no queries or no keys to project$"):
        tc.project_qk(np.ones((0, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"^n_components must be at least 1, got 0$"):
        tc.project_qk(np.ones((2, 3)), np.ones((2, 3)), n_components=0)
    with pytest.raises(ValueError, match=r"^scale must be a positive number, got -1\.0$"):
        tc.project_qk(np.ones((2, 3)), np.ones((2, 3)), scale=-1.0)


def _pairwise(a: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a[:, None] - a[None], axis=-1)


def _check_lossless(trace, layer, head, stack):
    q, k = trace.q(layer, head, stack), trace.k(layer, head, stack)
    d = q.shape[1]
    scale = trace.meta["attention_scale"]
    assert scale == pytest.approx(1 / np.sqrt(d))
    p = tc.qk_projection(trace, layer, head, stack, n_components=d)
    np.testing.assert_allclose(p.explained.sum(), 1.0, atol=1e-9)
    vectors = np.concatenate([q, k]).astype(np.float64) * np.sqrt(scale)
    coords = np.concatenate([p.queries, p.keys])
    np.testing.assert_allclose(_pairwise(coords), _pairwise(vectors), atol=1e-5)  # every distance kept
    np.testing.assert_allclose(coords @ p.components + p.mean, vectors, atol=1e-5)  # and the vectors themselves
    logits = p.logits()
    allowed = trace.block("mask", layer, None, stack)[0] if f"{stack}.{layer}.attn.mask" in trace else None
    scaled = np.asarray(trace.block("scaled", layer, head, stack), dtype=np.float64)
    finite = np.isfinite(scaled)
    np.testing.assert_allclose(logits[finite], scaled[finite], atol=1e-5)  # the softmax inputs, from the picture
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    np.testing.assert_allclose(softmax(logits), trace.attention(layer, head, stack), atol=1e-5)
    aligned = tc.qk_projection(trace, layer, head, stack, n_components=d, align_means=True)
    aligned_logits = aligned.logits() if allowed is None else np.where(allowed, aligned.logits(), -np.inf)
    np.testing.assert_allclose(softmax(aligned_logits), trace.attention(layer, head, stack), atol=1e-5)
    return p


@torch.no_grad()
def test_with_every_axis_a_real_trace_keeps_its_distances_dot_products_and_weights():
    trace = tiny_encoder().trace([5, 17, 3, 22, 9, 31, 2])
    p = _check_lossless(trace, 1, 2, "encoder")
    assert p.queries.shape == (7, 4) and p.keys.shape == (7, 4)  # d_head = 16 / 4
    two = tc.qk_projection(trace, 1, 2, n_components=2)
    np.testing.assert_allclose(two.queries, p.queries[:, :2], atol=1e-6)  # the first two of the same axes
    # Queries and keys of chosen positions only (special tokens hidden): the PCA is fitted on those.
    some = tc.qk_projection(trace, 1, 2, queries=[1, 2, 3], keys=[1, 2, 3, 4])
    assert some.queries.shape == (3, 2) and some.keys.shape == (4, 2)
    _check_lossless(tiny_decoder().trace([4, 8, 15, 16, 23, 3]), 0, 3, "decoder")  # causal mask


@torch.no_grad()
def test_cross_attention_projects_the_decoders_queries_with_the_encoders_keys():
    trace = tiny_seq2seq().trace([3, 7, 11, 5, 9], [1, 4, 8])
    p = _check_lossless(trace, 2, 1, "cross")
    assert p.queries.shape == (3, 4) and p.keys.shape == (5, 4)


@torch.no_grad()
def test_grouped_query_attention_projects_the_keys_of_the_shared_key_value_head():
    torch.manual_seed(0)
    model = tc.Llama(tc.LlamaConfig(vocab_size=50, d_model=48, n_heads=6, n_kv_heads=2, d_ff=64, n_layers=2))
    trace = model.trace([3, 14, 15, 9, 26, 5, 35])
    assert trace.n_kv_heads == 2 and trace.kv_head(4) == 1
    p = _check_lossless(trace, 1, 4, "decoder")
    k = trace["decoder.1.attn.k"][1].astype(np.float64) * np.sqrt(trace.meta["attention_scale"])
    np.testing.assert_allclose(p.keys @ p.components + p.mean, k, atol=1e-5)  # key/value head 1's keys
    # Query heads 3, 4 and 5 share those keys: the same key points, not the same queries.
    other = tc.qk_projection(trace, 1, 3, n_components=8)
    np.testing.assert_allclose(other.keys @ other.components + other.mean, k, atol=1e-5)


def test_minilm_a_trained_model_keeps_its_weights_through_the_full_projection():
    trace = tc.load_model("minilm").trace("The animal didn't cross the street because it was too tired.")
    p = _check_lossless(trace, 3, 5, "encoder")
    assert p.queries.shape == (16, 32)  # [CLS] the animal didn ' t ... tired . [SEP]
    two = tc.qk_projection(trace, 3, 5, n_components=2)
    assert 0.2 < two.explained.sum() < 1.0 and two.explained[0] > two.explained[1] > 0
