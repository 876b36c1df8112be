"""tformer_views.lessons.block's formulas and tables for the "Inside a block" page: a norm's LaTeX with the
numbers of the lecture's example (worked by hand), and the strongest keys of an attention row."""

import numpy as np

from tformer_core.block_steps import layer_norm_steps, rms_norm_steps
from tformer_views.lessons import block as lb


def example_norm(kind: str = "layernorm", eps: float = lb.EXAMPLE_EPS):
    X, params = lb.example_norm_inputs(4)
    return layer_norm_steps(X, params[0], params[1], eps) if kind == "layernorm" else rms_norm_steps(X, params[0], eps)


def test_the_example_starts_from_the_lectures_numbers_in_any_width():
    X, params = lb.example_norm_inputs(6)
    np.testing.assert_array_equal(X[:, :4], lb.EXAMPLE_X)
    np.testing.assert_array_equal(X[:, 4:], 0)
    np.testing.assert_array_equal(params[:, :4], [lb.EXAMPLE_GAMMA, lb.EXAMPLE_BETA])
    np.testing.assert_array_equal(params[:, 4:], [[1, 1], [0, 0]])  # γ = 1, β = 0: the identity
    X, params = lb.example_norm_inputs(2)
    np.testing.assert_array_equal(X, lb.EXAMPLE_X[:, :2])


def test_eps_must_be_positive():
    assert lb.eps_problem(1e-5) is None
    assert lb.eps_problem(0.0) == (
        "ε must be greater than 0 (it keeps the division away from 0 when every x_i is equal); got 0."
    )
    assert lb.eps_problem(-1.0).endswith("got -1.")


def test_layer_norm_formulas_carry_the_tokens_numbers():
    # "I" = [1, 5, 1, 5]: μ = 3, σ² = 4, √(σ² + ε) = 2.0000025; "love" = [2, 4, 6, 8]: μ = 5, σ² = 5.
    norm = example_norm()
    stats, steps = lb.norm_formulas(norm)
    assert stats.endswith(r"= 3,\qquad \sigma^2 = \frac{1}{d}\sum_{i=1}^{d} (x_i-\mu)^2 = 4,\qquad d = 4")
    assert r"\sqrt{\sigma^2+\varepsilon} = 2\ (\varepsilon = 10^{-5})" in steps
    assert r"= 5,\qquad" in lb.norm_formulas(norm, row=1)[0]
    assert lb.normalized_formula(norm) == r"\hat x_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \varepsilon}}"
    assert lb.output_formula(norm).endswith(r"+ \beta_i")


def test_a_layer_norm_row_written_out():
    mean, variance, normalized, output = lb.written_row(example_norm(), 0)
    assert mean == r"\mu = \frac{1 + 5 + 1 + 5}{4} = 3"
    assert variance == r"\sigma^2 = \frac{(1 - 3)^2 + (5 - 3)^2 + (1 - 3)^2 + (5 - 3)^2}{4} = 4"
    assert normalized == r"\hat x = \frac{x - 3}{\sqrt{4 + 10^{-5}}} = [-1, 1, -1, 1]"
    # y = γ x̂ + β with γ = [1, 1, 2, 0.5], β = [0, 0, 1, -1]: [-1, 1, -1, -0.5]
    assert output.endswith("= [-1, 1, -1, -0.5]")


def test_an_rms_norm_row_written_out():
    norm = example_norm("rmsnorm", eps=1.0)
    (formula,) = lb.norm_formulas(norm, row=2)  # "tea" = [0, 0, 0, 4]: RMS = √(16 / 4 + 1) = √5
    assert r"+ \varepsilon} = 2.236,\qquad" in formula and r"\varepsilon = 1)" in formula
    rms, output = lb.written_row(norm, 2)
    assert rms == r"\mathrm{RMS}(x) = \sqrt{\frac{0^2 + 0^2 + 0^2 + 4^2}{4} + 1} = 2.236"
    assert lb.output_formula(norm) == r"y_i = \gamma_i\,\hat x_i" and output.endswith(f"{4 * 0.5 / 5**0.5:.4g}]")
    assert lb.normalized_formula(norm) == r"\hat x_i = \frac{x_i}{\mathrm{RMS}(x)}"


def test_strongest_keys_per_head_strongest_first_ties_in_order():
    weights = np.array([[0.1, 0.4, 0.1, 0.3, 0.05, 0.05, 0.0], [1 / 7] * 7])
    row = lb.AttentionRow(weights, tuple("abcdefg"), "decoder", "encoder")
    frame = lb.strongest_keys(row)
    assert list(frame.columns) == [1, 2, 3, 4, 5] and list(frame.index) == ["head 0", "head 1"]
    assert list(frame.loc["head 0"]) == ["b (0.400)", "d (0.300)", "a (0.100)", "c (0.100)", "e (0.050)"]
    assert list(frame.loc["head 1"]) == [f"{k} (0.143)" for k in "abcde"]
    assert frame.index.name == "strongest keys"
    assert list(lb.strongest_keys(row, k=2).columns) == [1, 2]
