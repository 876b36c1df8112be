"""Mean attention distance (ViT Fig. 7) and its text counterpart."""

import itertools
import math

import numpy as np
import pytest

import tformer_core as tc


def _with_prefix(patch_weights, n_prefix=1, prefix_mass=0.0):
    """Embed [..., N, N] patch weights in [..., n_prefix + N, n_prefix + N]; prefix tokens get `prefix_mass`."""
    N = patch_weights.shape[-1]
    w = np.zeros(patch_weights.shape[:-2] + (n_prefix + N, n_prefix + N))
    w[..., n_prefix:, n_prefix:] = patch_weights * (1 - prefix_mass * n_prefix)
    w[..., :, :n_prefix] = prefix_mass
    w[..., :n_prefix, n_prefix:] = (1 - prefix_mass * n_prefix) / N
    return w


def test_identity_attention_is_zero():
    w = _with_prefix(np.eye(196))
    assert tc.mean_attention_distance(w, (14, 14), 16) == 0.0


def test_uniform_attention_is_the_mean_distance_between_patch_centres():
    w = _with_prefix(np.full((196, 196), 1 / 196))
    # Independent: average over all ordered pairs of centres of a 14 x 14 grid, 16 px apart.
    cells = list(itertools.product(range(14), range(14)))
    brute = sum(math.dist(a, b) for a in cells for b in cells) / len(cells) ** 2 * 16
    result = float(tc.mean_attention_distance(w, (14, 14), 16))
    assert result == pytest.approx(brute, abs=1e-9)
    assert result == pytest.approx(116.5, abs=0.05)  # ~116.49 px


def test_two_by_two_grid_by_hand():
    # Patches 16 px: 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1); neighbours 16 px apart, diagonals 16*sqrt(2).
    patch_w = np.array(
        [
            [0.5, 0.5, 0.0, 0.0],  # 0.5 * 16                      = 8
            [0.0, 0.0, 0.0, 1.0],  # 16 (1 -> 3 is a neighbour)    = 16
            [0.0, 1.0, 0.0, 0.0],  # 16 * sqrt(2) (2 -> 1 diagonal) = 22.627417
            [0.0, 0.0, 0.0, 1.0],  # itself                         = 0
        ]
    )
    expected = (8 + 16 + 16 * math.sqrt(2) + 0) / 4  # 11.656854
    assert tc.mean_attention_distance(_with_prefix(patch_w), (2, 2), 16) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(11.656854, abs=1e-6)


def test_prefix_mass_renormalised_or_not():
    patch_w = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=float)  # all neighbours
    w = _with_prefix(patch_w, n_prefix=2, prefix_mass=0.25)  # half of each row on the class + distillation tokens
    assert tc.mean_attention_distance(w, (2, 2), 10, n_prefix_tokens=2) == pytest.approx(10.0)
    assert tc.mean_attention_distance(w, (2, 2), 10, n_prefix_tokens=2, renormalize=False) == pytest.approx(5.0)


def test_leading_dimensions_are_kept_and_rectangular_grids_work():
    rng = np.random.default_rng(0)
    w = rng.random((3, 4, 1 + 6, 1 + 6))
    w /= w.sum(-1, keepdims=True)
    out = tc.mean_attention_distance(w, (2, 3), 8)
    assert out.shape == (3, 4)
    assert out[2, 1] == pytest.approx(float(tc.mean_attention_distance(w[2, 1], (2, 3), 8)))
    d = tc.patch_centre_distances((2, 3), 8)
    assert d[0, 5] == pytest.approx(8 * math.hypot(1, 2))  # (0,0) -> (1,2)


def test_mismatched_sizes_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="cover 10 tokens but a 3x3 grid plus 2"):
        tc.mean_attention_distance(np.ones((10, 10)) / 10, (3, 3), 16, n_prefix_tokens=2)
    with pytest.raises(ValueError, match=r"\[\.\.\., n, n\]"):
        tc.mean_attention_distance(np.ones((3, 4)), (1, 3), 16)


def test_mean_token_distance_by_hand():
    w = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    assert tc.mean_token_distance(w) == pytest.approx((0 + 0.5 + 0) / 3)
    uniform = np.full((3, 3), 1 / 3)
    assert tc.mean_token_distance(uniform) == pytest.approx(
        (1 + 2 / 3 + 1) / 3
    )  # rows: (0+1+2)/3, (1+0+1)/3, (2+1+0)/3


def test_mad_from_a_real_trace_matches_a_loop_over_patches():
    from tests.core.tiny_models import image, tiny_vit

    model = tiny_vit(distilled=False)
    trace = model.trace(image())
    all_w = trace.all_attention()  # [layers, heads, 13, 13]
    out = tc.mean_attention_distance(all_w, trace.grid_hw, trace.patch_size, trace.n_prefix_tokens)
    rows, cols = trace.grid_hw
    for layer, head in [(0, 0), (1, 3)]:
        w = all_w[layer, head, 1:, 1:].astype(np.float64)
        total = 0.0
        for i in range(rows * cols):
            row = w[i] / w[i].sum()
            total += sum(row[j] * 4 * math.dist(divmod(i, cols), divmod(j, cols)) for j in range(rows * cols))
        assert out[layer, head] == pytest.approx(total / (rows * cols), rel=1e-6)
