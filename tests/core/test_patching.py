"""Residual-stream patching from input B into input A: invariants that can be checked by hand, and the batched
grid equal to one pass per cell."""

import numpy as np
import pytest
import torch

from tests.core.test_interventions import tiny_llama
from tests.core.tiny_models import tiny_decoder
from tformer_core import patching, probes
from tformer_core.errors import InputError
from tformer_core.interventions import patch

A = [3, 7, 1, 12, 9, 4]
B = [3, 7, 1, 15, 9, 4]  # differs from A at position 3 only
MODELS = {"gpt2": lambda: tiny_decoder().double(), "llama": lambda: tiny_llama().double()}


def _last_logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids]))[0, -1].double().numpy()


@pytest.mark.parametrize("kind", MODELS)
def test_the_grid_holds_bs_difference_where_nothing_after_the_patch_reads_a(kind):
    model = MODELS[kind]()
    grid = patching.residual_patching(model, A, B, answers=(5, 11))
    la, lb = _last_logits(model, A), _last_logits(model, B)
    assert grid.clean == pytest.approx(la[11] - la[5], abs=1e-12)
    assert grid.source == pytest.approx(lb[11] - lb[5], abs=1e-12)
    assert grid.patched.shape == (3, 6) and grid.layers == ("0", "1", "out")
    # The stream leaving the last layer at the last position is all the read-out sees: B's difference.
    assert grid.patched[-1, -1] == pytest.approx(grid.source, abs=1e-9)
    assert grid.moved[-1, -1] == pytest.approx(1.0)
    # The embedding of the one token where A and B differ: the whole of B's pass.
    assert grid.patched[0, 3] == pytest.approx(grid.source, abs=1e-9)
    # Before position 3 the inputs agree (causal): patching there changes nothing at any layer.
    np.testing.assert_allclose(grid.patched[:, :3], grid.clean, atol=1e-9)
    # Past the last layer only the last position is read: patching another position changes nothing.
    np.testing.assert_allclose(grid.patched[-1, :-1], grid.clean, atol=1e-9)


def test_the_batched_grid_equals_one_pass_per_cell_whatever_the_passes(monkeypatch):
    model = tiny_llama().double()
    other = [8, 2, 1, 15, 6, 13]
    grid = patching.residual_patching(model, A, other, answers=(5, 11))
    trace_b = model.trace(other)
    expected = np.zeros_like(grid.patched)
    for layer in range(3):
        name = f"decoder.{layer}.resid_pre" if layer < 2 else "decoder.1.resid_post"
        for p in range(6):
            with model.intervene([patch(name, trace_b, {p: p})]):
                logits = _last_logits(model, A)
            expected[layer, p] = logits[11] - logits[5]
    np.testing.assert_allclose(grid.patched, expected, rtol=1e-9, atol=1e-9)
    assert grid.passes == 1 and grid.rows == 1 + 3 * 6
    monkeypatch.setattr(probes, "ROW_TOKENS", 5 * 6)  # four cells a pass
    split = patching.residual_patching(model, A, other, answers=(5, 11))
    assert split.passes == 5
    np.testing.assert_allclose(split.patched, expected, rtol=1e-9, atol=1e-9)


def test_the_answers_are_each_inputs_own_or_what_b_says_instead():
    logits_a = np.log(np.array([0.5, 0.3, 0.1, 0.1]))
    assert patching.answers_of(logits_a, np.log(np.array([0.1, 0.6, 0.2, 0.1]))) == (0, 1)
    # Both predict 0: A's answer is the token that loses most (1: 0.3 -> 0.05), B's the one that gains most (2).
    same = np.log(np.array([0.55, 0.05, 0.3, 0.1]))
    assert patching.answers_of(logits_a, same) == (1, 2)
    with pytest.raises(
        ValueError, match=r"^the two inputs predict the same next tokens: there is no difference to trace$"
    ):
        patching.answers_of(logits_a, logits_a)


def test_inputs_of_different_lengths_are_refused_clearly():
    """Once a ValueError, shown as "something went wrong on the server": the user's input, named as such."""
    with pytest.raises(patching.UnequalInputs) as caught:
        patching.residual_patching(tiny_decoder(), A, A[:4])
    assert isinstance(caught.value, InputError)  # the page tells it as the input's problem
    assert str(caught.value).startswith(
        f"A has {len(A)} tokens and B has 4: patching puts B's token at each position into A's at the same "
        "position, one to one, so both inputs need the same number of tokens. A: "
        + " | ".join(map(str, A))
        + ". B: "
        + " | ".join(map(str, A[:4]))
    )
    assert caught.value.tokens_b == tuple(map(str, A[:4]))
