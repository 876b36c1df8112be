"""Sinusoidal encoding: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""

import math

import numpy as np
import pytest
import torch

import tformer_core as tc
from tformer_core.models.positional import SinusoidalPositions


def test_position_zero_is_sin0_cos0():
    pe = tc.sinusoidal_encoding(3, 8)
    np.testing.assert_array_equal(pe[0], [0, 1, 0, 1, 0, 1, 0, 1])


def test_values_at_chosen_positions_and_dims():
    pe = tc.sinusoidal_encoding(4, 4)  # base 10000: frequencies 1 and 1/10000^(2/4) = 1/100
    np.testing.assert_allclose(pe[1], [0.84147098, 0.54030231, 0.00999983, 0.99995000], atol=1e-8)
    pe100 = tc.sinusoidal_encoding(4, 4, base=100.0)  # frequencies 1 and 1/100^(2/4) = 1/10
    np.testing.assert_allclose(pe100[2], [0.90929743, -0.41614684, 0.19866933, 0.98006658], atol=1e-8)
    pe6 = tc.sinusoidal_encoding(4, 6)
    assert pe6[3, 4] == pytest.approx(math.sin(3 / 10000 ** (4 / 6)))  # 2i = 4: sin(0.0064633)
    assert pe6[3, 4] == pytest.approx(0.00646326, abs=1e-8)
    assert pe6[3, 5] == pytest.approx(math.cos(3 / 10000 ** (4 / 6)))


def test_odd_width_ends_with_a_sine():
    pe = tc.sinusoidal_encoding(5, 5, base=100.0)
    assert pe.shape == (5, 5)
    assert pe[2, 4] == pytest.approx(math.sin(2 / 100 ** (4 / 5)))


def test_every_row_has_the_same_norm():
    # sin^2 + cos^2 = 1 for each of the d/2 pairs, so |PE(pos)|^2 = d/2 at every position.
    pe = tc.sinusoidal_encoding(50, 16)
    np.testing.assert_allclose((pe**2).sum(1), 8.0, atol=1e-12)


def test_dot_product_depends_only_on_offset():
    pe = tc.sinusoidal_encoding(60, 32)
    assert pe[3] @ pe[10] == pytest.approx(pe[20] @ pe[27], abs=1e-10)
    assert pe[3] @ pe[10] != pytest.approx(pe[3] @ pe[4], abs=1e-3)


def test_torch_module_uses_the_same_table():
    module = SinusoidalPositions(20, 10, base=100.0).double()
    np.testing.assert_array_equal(module(7, offset=3)[0].numpy(), tc.sinusoidal_encoding(20, 10, 100.0)[3:10])
    assert "table" not in module.state_dict()  # derived from the config, never saved


@pytest.mark.parametrize(
    "args, message",
    [
        ((-1, 4), "^n_positions must be a whole number >= 0, got -1$"),
        ((3, 0), "^d_model must be a whole number >= 1, got 0$"),
        ((3, 2.5), r"^d_model must be a whole number >= 1, got 2\.5$"),
        ((3, 4, 0.0), r"^base must be a positive number, got 0\.0$"),
        ((3, 4, float("nan")), "^base must be a positive number, got nan$"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        tc.sinusoidal_encoding(*args)


def test_module_table_dtype_follows_model():
    module = SinusoidalPositions(4, 4).to(torch.float64)
    assert module(2).dtype == torch.float64
