"""The parity helper's own checks: a comparison that broadcasts or ignores a difference proves nothing."""

import numpy as np
import pytest
import torch

from tests.core.hf_helpers import assert_close


def test_equal_shapes_within_tolerance_pass_and_return_the_largest_difference():
    diff = assert_close(np.array([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.00005, 3.0]), atol=1e-4)
    assert diff == pytest.approx(5e-5, abs=1e-6)


def test_a_broadcastable_shape_is_a_mismatch():
    # (1, T) against (T,) broadcasts to equal values; a missing batch axis must still fail.
    with pytest.raises(AssertionError, match=r"logits: shape \(1, 3\) != reference shape \(3,\)"):
        assert_close(np.zeros((1, 3)), torch.zeros(3), what="logits")


def test_a_difference_over_the_tolerance_fails_with_its_size():
    with pytest.raises(AssertionError, match=r"K: max \|difference\| 1\.00e-03 > 0\.0001"):
        assert_close(torch.tensor([[0.0, 1.001]]), np.array([[0.0, 1.0]]), what="K")
