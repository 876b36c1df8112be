"""tformer_views.lessons.worked_example: what "Attention, step by step" does with its inputs (labels, the
edits a link carries, shapes, formulas), without Streamlit."""

import math

import numpy as np
import pytest

from tformer_views.lessons import attention as ls
from tformer_views.lessons import worked_example as we
from tformer_views.lessons.tables import Inputs


def _inputs(ex: ls.Example, **values: np.ndarray | None) -> Inputs:
    """The example's own tables as the page parses them, with `values` in place of some."""
    inputs = Inputs()
    inputs.tokens = list(ex.tokens)
    for name in ex.editable[1:]:
        inputs.values[name] = we.as_table(ex, name)
    inputs.values.update(values)
    return inputs


def test_column_labels_number_components_from_1_and_heads_from_0():
    assert we.col_labels("q", 3, 1) == ["q1", "q2", "q3"]
    assert we.col_labels("k", 4, 2) == ["h0·k1", "h0·k2", "h1·k1", "h1·k2"]
    assert we.col_labels("v", 5, 2) == ["v1", "v2", "v3", "v4", "v5"]  # does not split: said elsewhere


def test_example_matrices_label_rows_and_columns_for_each_preset():
    m = we.example_matrices(ls.default_example(2), 2)
    assert list(m) == ["W_q", "W_k", "W_v", "b_q", "b_k", "b_v", "W_o"]
    values, rows, cols = m["W_k"]
    assert values.shape == (4, 6) and rows == ["x1", "x2", "x3", "x4"] and cols[3] == "h1·k1"
    assert m["b_v"][0].shape == (1, 6) and m["b_v"][1] == ["b^V"]
    assert m["W_o"][1] == we.col_labels("v", 6, 2) and m["W_o"][2] == ["o1", "o2", "o3", "o4"]
    given = we.example_matrices(ls.sdpa_example(), 1)
    assert list(given) == ["Q", "K", "V", "W_o"] and given["K"][1] == ["t0", "t1", "t2", "t3"]


def test_a_links_edits_replace_the_presets_numbers_and_name_new_rows():
    ex = ls.default_example()
    texts = {"X": "1,0,1,0;0,2,0,2;1,1,1,1;3,3,3,3", "b_q": "1,2,3", "Q": "9", "tokens": "a b c"}
    edits, problems = we.read_link_edits(ex, texts)
    assert problems == [] and set(edits) == {"X", "b_q", "tokens"}  # Q is not a table of this preset
    edited, digest = we.with_edits(ex, edits)
    assert edited.tokens == ("a", "b", "c", "t3")  # a fourth row of X gets a name
    np.testing.assert_array_equal(edited.X[3], [3, 3, 3, 3])
    np.testing.assert_array_equal(edited.b_q, [1, 2, 3])  # one row of the link: the bias vector
    assert edited.has_bias and len(digest) == 8
    assert we.with_edits(ex, edits)[1] == digest  # the same edits, the same signature
    assert we.with_edits(ex, {**edits, "b_q": np.array([[1.0, 2, 4]])})[1] != digest


def test_fewer_rows_in_a_link_drop_the_extra_tokens_and_bad_text_is_named():
    ex = ls.default_example()
    edits, problems = we.read_link_edits(ex, {"X": "1,2,3,4", "W_q": "x,y"})
    assert list(edits) == ["X"] and len(problems) == 1 and "W_q" in problems[0] and "'x'" in problems[0]
    assert we.with_edits(ex, edits)[0].tokens == ("I",)


def test_the_link_keeps_only_what_differs_from_the_preset():
    ex = ls.default_example()
    assert set(we.link_texts(ex, list(ex.tokens), _inputs(ex).values).values()) == {""}
    X = ex.X.copy()
    X[1, 3] = 2.5
    texts = we.link_texts(ex, ["I", "love", "coffee"], _inputs(ex, X=X).values)
    assert texts["X"] == "1,0,1,0;0,2,0,2.5;1,1,1,1" and texts["tokens"] == "I love coffee"
    assert texts["W_q"] == texts["Q"] == ""
    wider = we.link_texts(ex, list(ex.tokens), _inputs(ex, b_k=np.array([[0.0, 0, 0, 0]])).values)
    assert wider["b_k"] == "0,0,0,0"  # a shape that differs is an edit even when the numbers are 0


def test_validate_names_both_shapes_and_drops_what_they_concern():
    ex = ls.default_example()
    inputs = _inputs(ex, W_q=np.ones((3, 3)), b_k=np.ones((1, 2)))
    we.validate(inputs, 1)
    assert inputs.errors["W_q"] == "W^Q is 3 × 3 but X is 3 × 4: W^Q needs d_model = 4 rows"
    assert "b^K must be one row of 3 numbers" in inputs.errors["b_k"]
    assert inputs.values["W_q"] is None and inputs.values["W_k"] is None  # a bad bias takes its W with it
    assert inputs.values["W_v"] is not None and inputs.values["X"] is not None
    given = _inputs(ls.sdpa_example())
    given.tokens = []
    we.validate(given, 1, given_qkv=True)
    assert given.errors["tokens"].startswith("there are no tokens")
    assert all(given.values[name] is None for name in ("Q", "K", "V"))


def test_what_stops_the_steps_and_what_runs_on_the_valid_inputs():
    ex = ls.default_example()
    assert we.not_runnable(ex, _inputs(ex, X=None)).startswith("X and the token names are needed")
    tokens_bad = _inputs(ex)
    tokens_bad.errors["tokens"] = "shown above"
    assert we.not_runnable(ex, tokens_bad) == ""
    assert we.not_runnable(ex, _inputs(ex)) is None
    steps, available = we.run_inputs(ex, _inputs(ex, W_k=None), None, 1)
    assert available == {"Q", "V"}  # no K: no scores, no Z
    np.testing.assert_array_equal(steps.Q, [[1, 0, 2], [2, 2, 2], [2, 1, 3]])
    assert we.run_inputs(ex, _inputs(ex, W_q=None, W_k=None, W_v=None), None, 1) == (None, set())
    sdpa = ls.sdpa_example()
    assert we.not_runnable(sdpa, _inputs(sdpa, Q=None, K=None, V=None)).startswith("Q, K and V")


def test_formulas_show_the_biases_the_mask_and_given_q_k_v():
    ex = ls.default_example()
    plain = we.example_formulas(ex, _inputs(ex), masked=False)
    assert plain["Q"] == "Q = XW^Q" and plain["scaled"] == r"A = \frac{S}{\sqrt{d_k}}"
    biased = we.example_formulas(ex, _inputs(ex, b_v=np.array([[0.0, 1, 0]])), masked=True)
    assert biased["V"] == "V = XW^V + b^V" and biased["Q"] == "Q = XW^Q" and r"-\infty" in biased["scaled"]
    given = we.example_formulas(ls.sdpa_example(), _inputs(ls.sdpa_example()), masked=False)
    assert given["K"] == r"K \text{ (given)}"
    head = we.head_formulas(plain, 1, 2)
    assert head["scores"] == r"S = Q_2K_2^\top,\quad S_{ij} = q_i \cdot k_j" and head["z"].startswith("Z_2 = ")
    assert we.head_formulas(plain, 0, 1) == plain
    assert we.block_formula("V", 1, 3) == r"V_2 = \text{columns 4..6 of } V"
    assert "XW^Q_j" in we.heads_formula(plain, 3) and "XW" not in we.heads_formula(given, 2)


def test_missing_parts_say_whether_they_overflowed_or_lack_an_input():
    assert we.missing("Z", {"scores", "V"}, "V is needed").startswith("Z overflowed")
    assert we.missing("Z", {"scores"}, "V is needed") == "V is needed"


def test_one_row_written_out_with_its_numbers():
    ex = ls.default_example()
    walk = ls.row_walkthrough(ls.run_example(ex), ex.tokens, query=0)
    softmax, z = we.row_formulas(walk)
    total = math.exp(2 / math.sqrt(3)) + 2 * math.exp(4 / math.sqrt(3))  # scores [2, 4, 4] / sqrt(3)
    assert softmax == rf"\sum_j e^{{a_j}} = {total:.4g},\qquad \alpha_{{0j}} = \frac{{e^{{a_j}}}}{{{total:.4g}}}"
    assert z.startswith(r"z_{0} = 0.1361\,v_{0} + 0.4319\,v_{1} + 0.4319\,v_{2} = [")
    keys, numeric, contributions = we.row_tables(walk)
    assert list(keys.index) == ["I", "love", "tea"] and "q·k written out" not in numeric and "weight" in numeric
    assert contributions.index.name == "weighted V rows" and contributions.index[-1] == "z(I)"


@pytest.mark.parametrize("padding", [[], [1]])
def test_the_padding_mask_in_each_convention(padding):
    frame = we.mask_conventions_frame(["a", "b", "a"], padding)
    assert list(frame.columns) == ["a", "b", "a\u200b"]  # a repeated token: a column of its own
    hidden = bool(padding)
    assert list(frame.iloc[0]) == ["False", str(hidden), "False"]  # key_padding_mask: True = padding
    assert list(frame.iloc[1]) == ["0", "-inf" if hidden else "0", "0"]
    assert list(frame.iloc[2]) == ["True", str(not hidden), "True"]  # sdpa's bool: True = may attend
    assert list(frame.iloc[3]) == ["1", "0" if hidden else "1", "1"]


def test_pytorchs_z_one_table_per_head():
    frames = we.sdpa_frames(np.arange(12.0).reshape(2, 3, 2), 2, ["x", "y", "z"])
    assert [f.index.name for f in frames] == ["PyTorch Z · head 0", "PyTorch Z · head 1"]
    assert list(frames[1].columns) == ["z1", "z2"] and frames[1].iloc[2, 1] == 11.0
    assert we.sdpa_frames(np.zeros((3, 2)), 1, ["x", "y", "z"])[0].index.name == "PyTorch Z"


def test_a_sentence_too_long_for_the_example_is_said():
    assert we.too_many_tokens(ls.MAX_TOKENS) is None
    assert we.too_many_tokens(ls.MAX_TOKENS + 1).startswith(f"The sentence has {ls.MAX_TOKENS + 1} tokens")


def test_the_real_model_preset_slices_each_head_by_its_own_width():
    """Qwen3 and Gemma set head_dim apart from d_model / n_heads: here 8 per head, where 16 / 4 would say 4."""
    import torch

    import tformer_core as tc

    torch.manual_seed(0)
    config = tc.LlamaConfig(vocab_size=40, max_positions=32, n_layers=3, d_model=16, n_heads=4, n_kv_heads=2, d_head=8)
    model = tc.Llama(config)
    sizes = we.model_sizes(model)
    assert sizes == we.ModelSizes(n_layers=3, n_heads=4, d_model=16, d_head=8)
    trace = model.trace([3, 14, 15, 9])
    ex = ls.real_model_example(model, trace, 2, 3, sizes.d_model, sizes.d_head)  # the whole head: 8 columns
    attn = model.weights().block(2).attn
    np.testing.assert_array_equal(ex.W_q, attn.W_Q[3].double().numpy())
    np.testing.assert_array_equal(ex.W_k, attn.W_K[1].double().numpy())  # query head 3 reads key/value head 1
    assert ex.W_o.shape == (8, 16) and "Full size" in ex.note
