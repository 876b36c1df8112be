"""Gradient-weighted relevancy (Chefer et al. 2021): the rule by hand, gradients by finite differences."""

import numpy as np
import pytest
import torch

from tests.core.tiny_models import image, tiny_decoder, tiny_encoder, tiny_vit
from tformer_core import probes
from tformer_core.capture import Edit
from tformer_core.relevancy import propagate, relevancy

A = [3, 7, 1, 12, 9, 4]


def test_the_rule_on_a_worked_example():
    attention = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])  # one layer, one head
    gradients = np.array([[[[1.0, -1.0], [2.0, -3.0]]]])  # G * A = [[1, 0], [1, -1.5]] -> clamped [[1, 0], [1, 0]]
    np.testing.assert_array_equal(propagate(attention, gradients), [[2.0, 0.0], [1.0, 1.0]])
    two = np.concatenate([attention, attention])  # a second layer: R + Abar R = [[2, 0], [1, 1]] + [[2, 0], [2, 0]]
    np.testing.assert_array_equal(propagate(two, np.concatenate([gradients, gradients])), [[4.0, 0.0], [3.0, 1.0]])


def _by_hand(attention, gradients):
    n = attention.shape[-1]
    R = np.eye(n)
    for layer in range(attention.shape[0]):
        abar = np.zeros((n, n))
        for head in range(attention.shape[1]):
            abar += np.maximum(gradients[layer, head] * attention[layer, head], 0.0)
        R = R + (abar / attention.shape[1]) @ R
    return R


def test_vit_relevancy_uses_the_models_attention_and_true_gradients():
    model = tiny_vit().double()
    x = image().double()
    probe = probes.class_probe(model, x)
    result = relevancy(probe)[0]
    trace = model.trace(x)
    np.testing.assert_allclose(result.attention, trace.all_attention(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(result.relevance, _by_hand(result.attention, result.gradients), rtol=1e-12)
    assert result.score == pytest.approx(probe.measure()[0], rel=1e-12)
    eps = 1e-6
    for layer, head, i, j in [(0, 1, 0, 3), (1, 2, 0, 0), (1, 0, 5, 7), (0, 3, 9, 2)]:

        def nudge(a, d, layer=layer, head=head, i=i, j=j):
            a = a.clone()
            a[:, head, i, j] += d
            return a

        up = probe.measure([Edit(f"encoder.{layer}.attn.weights", lambda a, hook: nudge(a, eps))])[0]
        down = probe.measure([Edit(f"encoder.{layer}.attn.weights", lambda a, hook: nudge(a, -eps))])[0]
        assert result.gradients[layer, head, i, j] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)
    assert np.abs(result.relevance - np.eye(len(trace.tokens))).max() > 1e-6
    assert all(p.grad is None for p in model.parameters())  # nothing accumulated in the shared model


def test_decoder_relevancy_is_causal_and_runs_inside_inference_mode():
    model = tiny_decoder().double()
    with torch.inference_mode():
        result = relevancy(probes.next_token_probe(model, A))[0]
    R = result.relevance
    assert np.all(R[np.triu_indices(len(A), 1)] == 0)  # no token is relevant to one before it
    assert R[-1, :-1].max() > 0  # the last position draws on earlier ones
    assert all(p.grad is None for p in model.parameters())


def test_a_similarity_probe_gives_one_map_per_sentence():
    model = tiny_encoder().double()
    results = relevancy(probes.similarity_probe(model, A, [5, 2, 8]))
    assert [r.relevance.shape for r in results] == [(6, 6), (3, 3)]
    with pytest.raises(ValueError, match=r"^relevancy follows a stack's self-attention: one of \['encoder'\]$"):
        relevancy(probes.similarity_probe(model, A, A), stack="cross")
