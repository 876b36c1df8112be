"""tformer_views.lessons: hand-worked attention numbers, table validation, the real-model slice, PE identities."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

import tformer_core as tc
from tformer_views.charts import spec
from tformer_views.lessons import attention as ls
from tformer_views.lessons import positional as lp
from tformer_views.lessons import tables as lt

SQRT3 = math.sqrt(3.0)


# ---- the worked example, by hand -------------------------------------------------------------------
def test_default_example_matches_the_hand_worked_numbers():
    steps = ls.run_example(ls.default_example())
    np.testing.assert_array_equal(steps.Q, [[1, 0, 2], [2, 2, 2], [2, 1, 3]])
    np.testing.assert_array_equal(steps.K, [[0, 1, 1], [4, 4, 0], [2, 3, 1]])
    np.testing.assert_array_equal(steps.V, [[1, 2, 3], [2, 8, 0], [2, 6, 3]])
    np.testing.assert_array_equal(steps.scores, [[2, 4, 4], [4, 16, 12], [4, 12, 10]])
    # Row 0: softmax([2, 4, 4] / sqrt(3)) written out.
    e = [math.exp(2 / SQRT3), math.exp(4 / SQRT3), math.exp(4 / SQRT3)]
    w = [x / sum(e) for x in e]
    np.testing.assert_allclose(steps.weights[0], w, rtol=1e-12)
    np.testing.assert_allclose(steps.weights[0], [0.13612, 0.43194, 0.43194], atol=1e-5)
    z0 = [w[0] * 1 + w[1] * 2 + w[2] * 2, w[0] * 2 + w[1] * 8 + w[2] * 6, w[0] * 3 + w[1] * 0 + w[2] * 3]
    np.testing.assert_allclose(steps.z[0], z0, rtol=1e-12)
    np.testing.assert_allclose(steps.weights.sum(axis=1), 1.0)


def test_row_walkthrough_spells_out_every_number():
    ex = ls.default_example()
    walk = ls.row_walkthrough(ls.run_example(ex), ex.tokens, query=1)  # q("love") = [2, 2, 2]
    assert list(walk.keys["key"]) == ["I", "love", "tea"]
    assert list(walk.keys["q·k written out"]) == ["2·0 + 2·1 + 2·1", "2·4 + 2·4 + 2·0", "2·2 + 2·3 + 2·1"]
    np.testing.assert_array_equal(walk.keys["q·k"], [4, 16, 12])
    np.testing.assert_allclose(walk.keys["÷√d_k"], np.array([4, 16, 12]) / SQRT3)
    exps = np.exp(np.array([4, 16, 12]) / SQRT3)
    assert walk.shift == 0.0
    np.testing.assert_allclose(walk.keys["exp(a)"], exps)
    assert walk.exp_sum == pytest.approx(exps.sum())
    np.testing.assert_allclose(walk.keys["weight"], exps / exps.sum())
    V = np.array([[1, 2, 3], [2, 8, 0], [2, 6, 3]])
    np.testing.assert_allclose(walk.contributions.iloc[:3].to_numpy(), (exps / exps.sum())[:, None] * V)
    np.testing.assert_allclose(walk.contributions.iloc[3].to_numpy(), walk.z)
    np.testing.assert_allclose(walk.z, (exps / exps.sum()) @ V)
    assert walk.contributions.index[-1] == "z(love)"


def test_walkthrough_shifts_large_scores_and_writes_negative_factors_in_parentheses():
    ex = ls.default_example()
    big = ls.Example(ex.tokens, ex.X * 30, ex.W_q, ex.W_k, -ex.W_v, ex.b_q, ex.b_k, ex.b_v, ex.W_o)
    steps = ls.run_example(big)
    walk = ls.row_walkthrough(steps, big.tokens, query=1)
    assert walk.shift == pytest.approx(16 * 900 / SQRT3)  # the row max
    assert "exp(a − max)" in walk.keys.columns
    np.testing.assert_allclose(walk.keys["weight"], steps.weights[1])
    assert np.isfinite(walk.exp_sum)
    assert ls.dot_written_out(np.array([-1.0, 0.5]), np.array([2.0, -3.0])) == "(-1)·2 + 0.5·(-3)"


def test_two_heads_worked_by_hand():
    """Head 1 and head 2 both see scores = I; concat(Z1, Z2) W^O written out in closed form."""
    X = np.eye(2)
    W_qk = np.array([[1.0, 0, 0, 1], [0, 1, 1, 0]])  # head 1: identity; head 2: swap
    W_v = np.array([[1.0, 2, 0, 1], [3, 4, 1, 0]])
    W_o = np.array([[1.0, 0], [0, 1], [1, 1], [2, -1]])
    z = np.zeros(4)
    ex = ls.Example(("a", "b"), X, W_qk, W_qk, W_v, z, z, z, W_o)
    steps = ls.run_example(ex, n_heads=2)
    a = math.exp(1 / math.sqrt(2)) / (math.exp(1 / math.sqrt(2)) + 1)  # softmax([1/sqrt(2), 0])[0]
    b = 1 - a
    np.testing.assert_allclose(steps.weights, [[[a, b], [b, a]], [[a, b], [b, a]]])
    Z1 = np.array([[a + 3 * b, 2 * a + 4 * b], [b + 3 * a, 2 * b + 4 * a]])
    Z2 = np.array([[b, a], [a, b]])
    np.testing.assert_allclose(steps.z, [Z1, Z2])
    np.testing.assert_allclose(steps.concat, np.hstack([Z1, Z2]))
    by_hand = np.column_stack([Z1[:, 0] + Z2[:, 0] + 2 * Z2[:, 1], Z1[:, 1] + Z2[:, 0] - Z2[:, 1]])
    np.testing.assert_allclose(steps.output, by_hand)


def _numpy_multihead(ex: ls.Example, h: int, mask=None) -> np.ndarray:
    """An independent multi-head attention: loops over heads, plain numpy, biases added explicitly."""
    Q, K, V = ex.X @ ex.W_q + ex.b_q, ex.X @ ex.W_k + ex.b_k, ex.X @ ex.W_v + ex.b_v
    dk, dv = Q.shape[1] // h, V.shape[1] // h
    heads = []
    for j in range(h):
        s = Q[:, j * dk : (j + 1) * dk] @ K[:, j * dk : (j + 1) * dk].T / math.sqrt(dk)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append((w / w.sum(axis=1, keepdims=True)) @ V[:, j * dv : (j + 1) * dv])
    return np.hstack(heads) @ ex.W_o


@pytest.mark.parametrize("h", [2, 3])
def test_multihead_output_matches_an_independent_numpy_loop(h):
    ex = ls.random_example(seed=4, n_tokens=5, d_model=6, d_k=2, n_heads=h)
    ex = ls.Example(ex.tokens, ex.X, ex.W_q, ex.W_k, ex.W_v, ex.W_q[0], -ex.W_k[1], ex.W_v[2], ex.W_o)  # with biases
    mask = ls.build_mask(5, causal=True)
    np.testing.assert_allclose(ls.run_example(ex, mask, n_heads=h).output, _numpy_multihead(ex, h, mask), rtol=1e-12)


def test_presets_have_consistent_shapes():
    ex = ls.default_example(3)
    assert ex.W_q.shape == ex.W_k.shape == ex.W_v.shape == (4, 9) and ex.W_o.shape == (9, 4)
    np.testing.assert_array_equal(ex.W_q[:, :3], ls.EXAMPLE_W_Q)  # head 1 is the lecture's
    assert not ex.has_bias
    r1, r2 = ls.random_example(3, 4, 5, 2, 2), ls.random_example(3, 4, 5, 2, 2)
    assert r1.X.shape == (4, 5) and r1.W_q.shape == (5, 4) and r1.W_o.shape == (4, 5)
    np.testing.assert_array_equal(r1.X, r2.X)  # the seed fixes the numbers
    assert not np.array_equal(r1.X, ls.random_example(4, 4, 5, 2, 2).X)
    np.testing.assert_array_equal(r1.X, np.round(r1.X, 2))


# ---- masks -------------------------------------------------------------------------------------------
def test_masks_put_minus_inf_in_scaled_and_zero_in_weights():
    mask = ls.build_mask(3, causal=True, padding=[0])
    np.testing.assert_array_equal(mask, [[False, False, False], [False, True, False], [False, True, True]])
    assert ls.build_mask(3, causal=False, padding=[]) is None
    steps = ls.run_example(ls.default_example(), ls.build_mask(3, causal=True))
    assert np.all(np.isneginf(steps.scaled[np.triu_indices(3, 1)]))
    np.testing.assert_array_equal(steps.weights[np.triu_indices(3, 1)], 0.0)
    np.testing.assert_allclose(steps.weights[0], [1, 0, 0])
    e = np.exp(np.array([4, 16]) / SQRT3)
    np.testing.assert_allclose(steps.weights[1, :2], e / e.sum())
    padded = ls.run_example(ls.default_example(), ls.build_mask(3, causal=False, padding=[2]))
    np.testing.assert_array_equal(padded.weights[:, 2], 0.0)
    np.testing.assert_allclose(padded.weights.sum(axis=1), 1.0)


# ---- validation messages name the cell or the shapes ----------------------------------------------------
def test_numbers_past_float64s_range_are_named_and_what_they_feed_is_left_out():
    """X[0, 2] = 1e308 in the worked example. By hand: V[0] = X0 W^V = [1e308, 2, 3e308], and 3e308 overflows;
    Q[1] K[0]ᵀ = [2, 2, 2] · [0, 1e308, 1] = 2e308 + 2 overflows too (Q and K themselves stay finite). The
    weights of row 1 would be NaN; nothing computed from V or from the scores may be shown."""
    ex = ls.default_example(1)
    X = ex.X.copy()
    X[0, 2] = 1e308
    W = {"W_q": ex.W_q, "W_k": ex.W_k, "W_v": ex.W_v}
    steps, available = ls.available_steps(X, W, dict.fromkeys(("b_q", "b_k", "b_v")), None, None, 1)
    assert available == {"Q", "K", "V", "scores", "Z"}
    assert np.isnan(steps.weights[1, 0])  # what the page used to show under "each row sums to 1"
    kept, messages = ls.non_finite(steps, available, ex.tokens)
    assert kept == {"Q", "K"}
    tail = "They pass float64's largest number, about ±1.8 × 10^308: use smaller numbers."
    assert messages == [
        f"V overflowed: 1 number is not finite (row 0 (I), column 3 = +inf). {tail} "
        "What is computed from V is not shown.",
        f"QKᵀ overflowed: 1 number is not finite (row 1 (love), key 0 (I) = +inf). {tail} "
        "What is computed from QKᵀ is not shown.",
    ]
    steps, available = ls.available_steps(ex.X, W, dict.fromkeys(("b_q", "b_k", "b_v")), None, None, 1)
    assert ls.non_finite(steps, available, ex.tokens) == (available, [])  # finite numbers: nothing said


def test_table_errors_name_the_cell():
    frame = pd.DataFrame({"token": ["I", "love"], "x1": [1.0, 2.0], "x2": [0.0, "abc"]})
    with pytest.raises(lt.TableError, match=r"^X, row 2, column x2: 'abc' is not a number$"):
        lt.matrix_from_frame(frame, "X", skip=["token"])
    labelled = pd.DataFrame({"q1": [1.0, None]}, index=["x1", "x2"])
    with pytest.raises(lt.TableError, match=r"^W\^Q, row 2 \(x2\), column q1: empty cell \(NaN\)$"):
        lt.matrix_from_frame(labelled, "W^Q")
    with pytest.raises(lt.TableError, match=r"^X is empty: it needs at least one row$"):
        lt.matrix_from_frame(pd.DataFrame({"token": [], "x1": []}), "X", skip=["token"])
    with pytest.raises(lt.TableError, match=r"^W\^K has no columns$"):
        lt.matrix_from_frame(pd.DataFrame(index=["x1"]), "W^K")
    np.testing.assert_array_equal(lt.matrix_from_frame(pd.DataFrame({"a": ["1.5", "−2"]}), "b"), [[1.5], [-2.0]])


def test_pasted_text_errors_name_the_cell():
    np.testing.assert_array_equal(lt.parse_matrix_text("[[1, 2],\n [3, 4]]", "X"), [[1, 2], [3, 4]])
    with pytest.raises(lt.TableError, match=r"^X, row 2, column 3: 'abc' is not a number$"):
        lt.parse_matrix_text("1 2 3\n4 5 abc", "X")
    with pytest.raises(lt.TableError, match=r"^X: row 2 has 1 numbers but row 1 has 2$"):
        lt.parse_matrix_text("1 2\n3", "X")
    with pytest.raises(lt.TableError, match=r"^W\^V, row 1, column 2: empty cell \(NaN\)$"):
        lt.parse_matrix_text("1 nan", "W^V")
    with pytest.raises(lt.TableError, match=r"^W\^V, row 1, column 1: inf is not a finite number$"):
        lt.parse_matrix_text("inf 1", "W^V")
    with pytest.raises(lt.TableError, match=r"^W\^Q is empty: type one row per line"):  # d_k = 0: no columns at all
        lt.parse_matrix_text("\n \n", "W^Q")
    matrix = np.array([[1.5, -2.0], [1e-7, 3.0]])
    np.testing.assert_array_equal(lt.parse_matrix_text(lt.format_matrix_text(matrix), "X"), matrix)


def test_shape_errors_name_both_shapes():
    X = np.ones((3, 4))
    W = {"W_q": np.ones((4, 3)), "W_k": np.ones((4, 2)), "W_v": np.ones((5, 3))}
    errors = ls.shape_errors(["a", "b"], X, W, 1)
    assert errors["tokens"] == "2 token names for 3 rows of X: give one name per row"
    assert errors["W_k"].startswith("W^K is 4 × 2 but W^Q is 4 × 3")
    assert errors["W_v"] == "W^V is 5 × 3 but X is 3 × 4: W^V needs d_model = 4 rows"
    good = {"W_q": np.ones((4, 3)), "W_k": np.ones((4, 3)), "W_v": np.ones((4, 3))}
    assert ls.shape_errors(["a", "b", "c"], X, good, 1) == {}
    assert (
        ls.shape_errors(["a", "b", "c"], X, good, 2)["W_q"]
        == "W^Q has 3 columns, which do not split into 2 equal heads"
    )
    b = {"b_q": np.ones((1, 2)), "b_k": None, "b_v": np.ones((1, 3))}
    assert "b^Q must be one row of 3 numbers" in ls.shape_errors(["a", "b", "c"], X, good, 1, b)["b_q"]
    assert ls.shape_errors([], X, good, 1)["tokens"].startswith("there are no tokens")
    wide = {k: np.ones((4, 4)) for k in good}
    assert "W^O needs 4 rows" in ls.shape_errors(["a", "b", "c"], X, wide, 2, None, np.ones((3, 4)))["W_o"]


def test_partial_inputs_still_give_what_they_can():
    ex = ls.default_example()
    full = ls.run_example(ex)
    W = {"W_q": ex.W_q, "W_k": ex.W_k, "W_v": None}
    b = {"b_q": None, "b_k": None, "b_v": None}
    steps, available = ls.available_steps(ex.X, W, b, None, None, 1)
    assert available == {"Q", "K", "scores"}
    np.testing.assert_array_equal(steps.weights, full.weights)
    steps, available = ls.available_steps(ex.X, {"W_q": None, "W_k": ex.W_k, "W_v": ex.W_v}, b, None, None, 1)
    assert available == {"K", "V"}
    np.testing.assert_array_equal(steps.V, full.V)
    assert ls.available_steps(None, W, b, None, None, 1) == (None, set())


# ---- the real model --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    model = tc.load_model("minilm", device="cpu")
    return model, model.trace("The animal didn't cross the street.")


@pytest.mark.parametrize("layer,head", [(0, 0), (2, 5)])
def test_real_slice_at_full_size_reproduces_the_model(minilm, layer, head):
    model, trace = minilm
    ex = ls.real_model_example(model, trace, layer, head, n_dims=384, n_head_dims=32)
    steps = ls.run_example(ex)
    assert ex.has_bias
    np.testing.assert_allclose(steps.Q, trace.q(layer, head), atol=1e-5)
    np.testing.assert_allclose(steps.K, trace.k(layer, head), atol=1e-5)
    np.testing.assert_allclose(steps.V, trace.v(layer, head), atol=1e-5)
    np.testing.assert_allclose(steps.weights, trace.attention(layer, head), atol=1e-5)
    np.testing.assert_allclose(steps.z, trace[f"encoder.{layer}.attn.z"][head], atol=1e-5)
    if layer == 0:  # post-norm BERT: layer 0's input is the embedding sum after its LayerNorm
        np.testing.assert_array_equal(ex.X, trace["encoder.embed.out"])


def test_real_slice_takes_the_first_dims_of_each_head(minilm):
    model, trace = minilm
    ex = ls.real_model_example(model, trace, 1, 11, n_dims=4, n_head_dims=3, n_heads=2)  # heads 11 and 0
    attn = model.encoder.blocks[1].attn
    Wq = attn.W_q.weight.detach().double().numpy()  # [out, in]
    cols = [11 * 32, 11 * 32 + 1, 11 * 32 + 2, 0, 1, 2]
    np.testing.assert_allclose(ex.W_q, Wq[cols, :4].T)
    np.testing.assert_allclose(ex.b_q, attn.W_q.bias.detach().double().numpy()[cols])
    np.testing.assert_allclose(ex.W_o, attn.W_o.weight.detach().double().numpy()[:4, cols].T)
    np.testing.assert_array_equal(ex.X, trace["encoder.1.resid_pre"][:, :4])
    assert "A slice" in ex.note and "first 4 of 384" in ex.note
    with pytest.raises(tc.InputError, match=r"^the slice of d_head must keep 1\.\.32 dimensions, got 33$"):
        ls.real_model_example(model, trace, 1, 0, 4, 33)


# ---- positional encoding ------------------------------------------------------------------------------------
def test_formula_cells_substitute_the_numbers():
    assert lp.formula_cell(2, 2, 100.0, 6) == "sin(2/100^(2/6)) = 0.4177"
    assert lp.formula_cell(2, 3, 100.0, 6) == "cos(2/100^(2/6)) = 0.9086"
    assert lp.formula_cell(1, 0, 10000.0, 128) == "sin(1/10000^(0/128)) = 0.8415"
    table = lp.formula_table(6, 6, 100.0, 6)
    pe = tc.sinusoidal_encoding(6, 6, 100.0)
    values = table.map(lambda s: float(s.rsplit("= ", 1)[1])).to_numpy()
    np.testing.assert_allclose(values, pe, atol=5e-5)
    assert table.loc["pos 2", "dim 2 (sin, i=1)"] == "sin(2/100^(2/6)) = 0.4177"


def test_sinusoidal_dot_product_depends_only_on_the_offset():
    d, base = 64, 10000.0
    pe = tc.sinusoidal_encoding(300, d, base)
    dot = lp.similarity(pe, "dot")
    predicted = lp.offset_formula(d, base, np.arange(300))
    for k in (0, 1, 7, 50, 200):
        diagonal = np.diagonal(dot, offset=k)  # PE(p).PE(p+k) for every p
        np.testing.assert_allclose(diagonal, predicted[k], atol=1e-9)
    assert predicted[0] == pytest.approx(d / 2)
    frame = lp.offset_products(pe, [0, 40, 99], 100)
    curves = frame.pivot(index="offset k", columns="start", values="dot")
    np.testing.assert_allclose(curves.to_numpy(), np.repeat(predicted[:101, None], 3, axis=1), atol=1e-9)
    np.testing.assert_allclose(lp.similarity(pe, "cosine"), dot / (d / 2), atol=1e-12)
    # A learned-like table has no such structure: the check above can fail.
    noise = np.random.default_rng(0).normal(size=(300, d))
    assert np.ptp(np.diagonal(noise @ noise.T, offset=1)) > 1.0


def test_pe_settings_are_checked():
    assert lp.pe_problems(50, 128, 10000.0) == []
    assert "even" in lp.pe_problems(50, 7, 100.0)[0]
    assert "greater than 1" in lp.pe_problems(50, 8, 1.0)[0]
    assert "between 1 and 512" in lp.pe_problems(0, 8, 100.0)[0]
    assert "between 2 and 1024" in lp.pe_problems(5, 2048, 100.0)[0]


def test_thin_keeps_every_position_and_few_cells():
    m = np.arange(512 * 1024, dtype=float).reshape(512, 1024)
    sub, rows, cols = spec.thin(m)
    assert sub.size <= spec.MAX_GRID_CELLS and len(rows) == 512
    np.testing.assert_array_equal(sub, m[:, cols])
    assert cols[1] - cols[0] == math.ceil(512 * 1024 / spec.MAX_GRID_CELLS)
    square, r, c = spec.thin(np.ones((512, 512)), keep_rows=False)
    assert square.size <= spec.MAX_GRID_CELLS and np.array_equal(r, c)
    small = np.ones((3, 4))
    assert spec.thin(small)[0] is small


def test_embedding_parts_add_up_to_the_layer_input(minilm):
    model, trace = minilm
    parts = lp.embedding_sum(trace, base=100.0)
    emb = model.encoder.embed
    n = len(trace.tokens)
    np.testing.assert_allclose(parts.pos, emb.pos.weight.detach().double().numpy()[:n], atol=1e-7)
    np.testing.assert_allclose(parts.total, parts.tok + parts.pos + parts.segment)
    # LayerNorm of the sum is what layer 0 receives.
    ln = torch.nn.functional.layer_norm(
        torch.from_numpy(parts.total), (384,), emb.ln.weight.double(), emb.ln.bias.double(), 1e-12
    )
    np.testing.assert_allclose(ln.detach().numpy(), trace["encoder.embed.out"], atol=1e-4)
    np.testing.assert_array_equal(parts.sinusoidal, tc.sinusoidal_encoding(n, 384, 100.0))
    norms = parts.norms()
    np.testing.assert_allclose(norms["‖sinusoidal PE‖"], np.sqrt(192.0))  # ||PE(p)||^2 = d/2
    np.testing.assert_allclose(lp.learned_positions(model, 5), parts.pos[:5])
    with pytest.raises(tc.InputError, match=r"^the model has 512 positions; asked for 513$"):
        lp.learned_positions(model, 513)


def test_numbers_in_formulas_use_powers_of_ten_not_e_notation():
    """LaTeX typeset "1.131e+04" as "1.131e + 04"."""
    assert ls.tex(11308.7) == r"1.131 \times 10^{4}" and ls.tex(11310.0) == "11310"
    assert ls.tex(0.000012345) == r"1.234 \times 10^{-5}" or ls.tex(0.000012345) == r"1.235 \times 10^{-5}"
    assert ls.tex(12.5) == "12.5" and ls.tex(3.0) == "3" and ls.tex(-np.inf) == r"-\infty"


def test_one_latex_number_format_for_every_page():
    assert ls.tex(1e-5) == "10^{-5}" and ls.tex(1e-6) == "10^{-6}"  # an epsilon, as the block lesson writes it
    assert ls.tex(2.5e-12) == r"2.5 \times 10^{-12}"
