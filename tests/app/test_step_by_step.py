"""The "Attention, step by step" page through Streamlit's AppTest: the numbers it shows, its masks,
heads, presets, bad input and the URL. Tables are found by the label in their corner (index name)."""

import math
from collections import Counter

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.app import pages
from tests.app.pages import messages, table
from tformer_app import models
from tformer_core.trace import to_numpy
from tformer_views.lessons import attention as ls

SQRT3 = math.sqrt(3.0)
HAND_Q = [[1, 0, 2], [2, 2, 2], [2, 1, 3]]
HAND_SCORES = np.array([[2, 4, 4], [4, 16, 12], [4, 12, 10]], dtype=float)


def run(**params: str) -> AppTest:
    return pages.run("step_by_step", timeout=60, **params)


def names(at: AppTest) -> list:
    return [d.value.index.name for d in at.dataframe]


def softmax_rows(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_default_example_shows_the_hand_worked_numbers_and_writes_the_url():
    at = run()
    assert not at.exception and not at.error
    np.testing.assert_array_equal(table(at, "Q").to_numpy(), HAND_Q)
    np.testing.assert_array_equal(table(at, "QKᵀ").to_numpy(), HAND_SCORES)
    np.testing.assert_allclose(table(at, "scaled").to_numpy(), HAND_SCORES / SQRT3)
    weights = table(at, "weights").to_numpy()
    np.testing.assert_allclose(weights, softmax_rows(HAND_SCORES / SQRT3))
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    np.testing.assert_allclose(table(at, "Z").to_numpy(), weights @ np.array([[1, 2, 3], [2, 8, 0], [2, 6, 3]]))
    assert list(table(at, "weights").index) == ["I", "love", "tea"]
    # The query row, written out: q(I) = [1, 0, 2] against k(tea) = [2, 3, 1].
    walk = table(at, "key")
    assert any("Keys for q(I):" in c for c in messages(at, "caption"))
    assert walk.loc["tea", "q·k written out"] == "1·2 + 0·3 + 2·1"
    np.testing.assert_allclose(walk["weight"], weights[0])
    assert any("1/√3" in c for c in messages(at, "caption"))
    params = dict(at.query_params)
    assert (
        params["preset"] == "example" and params["heads"] == "1" and params["causal"] == "0" and params["query"] == "0"
    )
    assert len(at.get("vega_lite_chart")) == 7  # Q, K, V, scores, scaled, weights, Z
    # CSV of the same seven matrices and of the query row; every chart also saves as SVG and PNG.
    labels = Counter(button.proto.label for button in at.get("download_button"))
    assert labels == {"Download CSV": 8, "SVG": 7, "PNG": 7}


def test_causal_mask_zeroes_the_weights_above_the_diagonal():
    at = run()
    before = table(at, "weights").to_numpy()
    at.checkbox(key="step.causal").check().run()
    assert not at.exception
    scaled = table(at, "scaled").to_numpy()
    weights = table(at, "weights").to_numpy()
    upper = np.triu_indices(3, 1)
    assert np.all(np.isneginf(scaled[upper]))
    np.testing.assert_array_equal(weights[upper], 0.0)
    np.testing.assert_allclose(weights[0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(weights[1, :2], softmax_rows(HAND_SCORES[1:2, :2] / SQRT3)[0])
    assert not np.allclose(weights, before)
    assert at.query_params["causal"] == ["1"] or at.query_params["causal"] == "1"


def test_padding_hides_a_key_from_every_query():
    at = run()
    at.multiselect(key="step.pad").select(1).run()
    assert not at.exception
    weights = table(at, "weights").to_numpy()
    np.testing.assert_array_equal(weights[:, 1], 0.0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    assert np.all(np.isneginf(table(at, "scaled").to_numpy()[:, 1]))
    assert dict(at.query_params)["pad"] in ("1", ["1"])


def test_url_restores_heads_query_and_mask_and_two_heads_match_numpy():
    at = run(heads="2", causal="1", query="2", qhead="1")
    assert not at.exception and not at.error
    assert at.number_input(key="step.heads").value == 2
    assert at.checkbox(key="step.causal").value is True
    assert at.selectbox(key="step.query").value == 2 and at.selectbox(key="step.qhead").value == 1
    # An independent two-head computation with the page's preset numbers.
    ex = ls.default_example(2)
    Q, K, V = ex.X @ ex.W_q, ex.X @ ex.W_k, ex.X @ ex.W_v
    causal = np.tril(np.ones((3, 3), dtype=bool))
    heads = []
    for j in range(2):
        s = Q[:, 3 * j : 3 * j + 3] @ K[:, 3 * j : 3 * j + 3].T / SQRT3
        w = softmax_rows(np.where(causal, s, -np.inf))
        np.testing.assert_allclose(table(at, f"weights · head {j}").to_numpy(), w)  # heads from 0, as everywhere
        heads.append(w @ V[:, 3 * j : 3 * j + 3])
    np.testing.assert_allclose(table(at, "concat").to_numpy(), np.hstack(heads))
    np.testing.assert_allclose(table(at, "output").to_numpy(), np.hstack(heads) @ ex.W_o)
    # The query row follows the URL: token 2 ("tea") in head 1 (the second).
    np.testing.assert_allclose(table(at, "key")["weight"], table(at, "weights · head 1").to_numpy()[2])
    params = dict(at.query_params)
    assert (params["heads"], params["causal"], params["query"], params["qhead"]) == ("2", "1", "2", "1")


def test_random_preset_from_the_url():
    at = run(preset="random", seed="7", n="5", d="3", dk="2")
    assert not at.exception and not at.error
    ex = ls.random_example(7, 5, 3, 2)
    rng = np.random.default_rng(7)  # the documented recipe, independently
    X = np.round(rng.normal(size=(5, 3)), 2)
    W_q = np.round(rng.normal(size=(3, 2)) / math.sqrt(3), 2)
    np.testing.assert_array_equal(ex.X, X)
    np.testing.assert_allclose(table(at, "Q").to_numpy(), X @ W_q)
    assert list(table(at, "Q").index) == ["t1", "t2", "t3", "t4", "t5"]
    assert table(at, "weights").shape == (5, 5)


def test_real_model_preset_shows_a_labelled_slice_of_minilm():
    at = run(preset="real", layer="1", head="2", dims="4", hdims="3")
    assert not at.exception and not at.error
    # The page's own model, on the device the page runs it on (a GPU's float32 differs from the CPU's at 1e-6).
    model = models.cached_model("minilm")
    trace = model.trace("The cat sat.")
    attn = model.encoder.blocks[1].attn
    cols = slice(2 * 32, 2 * 32 + 3)
    W_q = to_numpy(attn.W_q.weight).astype(np.float64)[cols, :4].T
    b_q = to_numpy(attn.W_q.bias).astype(np.float64)[cols]
    X = trace["encoder.1.resid_pre"][:, :4].astype(np.float64)
    np.testing.assert_allclose(table(at, "Q").to_numpy(), X @ W_q + b_q, atol=1e-9)
    assert list(table(at, "Q").index) == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert any("A slice" in c and "first 4 of 384" in c for c in messages(at, "caption"))
    assert any("XW^Q + b^Q" in l.value for l in at.latex)


def test_bad_cells_give_inline_errors_and_the_rest_still_renders():
    at = run(mode="text")
    assert not at.exception and not at.error
    at.text_area(key="step.paste.X").set_value("1 0 abc 0\n0 2 0 2\n1 1 1 1").run()
    assert not at.exception
    assert list(messages(at, "error")) == ["X, row 1, column 3: 'abc' is not a number"]
    assert "Q" not in names(at)
    # X fixed, W^V broken: Q, K and the weights still show, V and Z do not.
    at.text_area(key="step.paste.X").set_value("1 0 1 0\n0 2 0 2\n1 1 1 1")
    at.text_area(key="step.paste.W_v").set_value("0 2 0\n0 3\n1 0 3\n1 1 0").run()
    assert not at.exception
    assert list(messages(at, "error")) == ["W^V: row 2 has 2 numbers but row 1 has 3"]
    np.testing.assert_array_equal(table(at, "Q").to_numpy(), HAND_Q)
    assert "weights" in names(at) and "V" not in names(at) and "Z" not in names(at)


@pytest.mark.parametrize(
    "area,text,message",
    [
        ("tokens", "I love", "2 token names for 3 rows of X"),
        ("W_q", "", "W^Q is empty"),  # d_k = 0
        ("W_k", "0 0\n1 1\n0 1\n1 1", "W^K is 4 × 2 but W^Q is 4 × 3"),
        ("X", "nan 0 1 0\n0 2 0 2\n1 1 1 1", "X, row 1, column 1: empty cell (NaN)"),
    ],
)
def test_bad_shapes_and_empty_inputs_are_named(area, text, message):
    at = run(mode="text")
    at.text_input(key="step.paste.tokens").input(text).run() if area == "tokens" else at.text_area(
        key=f"step.paste.{area}"
    ).set_value(text).run()
    assert not at.exception
    assert any(message in e for e in messages(at, "error")), list(messages(at, "error"))


def test_token_names_are_shown_as_typed_never_as_markdown():
    at = pages.run("step_by_step", mode="text")
    at.text_input(key="step.paste.tokens").input("**bold** [link](javascript:alert(1)) <b>x</b>").run()
    assert not at.exception
    at.selectbox(key="step.query").set_value(1).run()
    sent = [m.value for m in at.markdown]  # the Markdown source the page sends
    assert any(r"q(\[link\]\(javascript\:alert\(1\)\))" in m for m in sent), sent
    assert not any("[link](" in m for m in sent)
    at.selectbox(key="step.query").set_value(0).run()
    assert any(r"z(\*\*bold\*\*)" in m.value for m in at.markdown)


def test_edited_cells_travel_in_the_link():
    """The page says the link keeps the view; edited tables were not in it."""
    at = run(mode="text")
    assert not any(k.startswith("e_") for k in at.query_params)  # the preset's own numbers: nothing to carry
    at.text_area(key="step.paste.X").input("1 0 1 0\n0 2 0 2.5\n1 1 1 1").run()
    at.text_input(key="step.paste.tokens").input("I love coffee").run()
    assert not at.exception
    params = {k: (v if isinstance(v, str) else v[0]) for k, v in at.query_params.items()}
    assert params["e_X"] == "1,0,1,0;0,2,0,2.5;1,1,1,1" and params["e_tokens"] == "I love coffee"
    assert "e_W_q" not in params  # unchanged tables stay out of the link
    # A colleague opens the link: the same edited numbers, in tables (the default mode) or as text.
    for mode in ("tables", "text"):
        shared = run(**{**params, "mode": mode})
        assert not shared.exception
        q = table(shared, "Q").to_numpy()
        np.testing.assert_allclose(
            q, np.array([[1, 0, 1, 0], [0, 2, 0, 2.5], [1, 1, 1, 1]]) @ ls.default_example(1).W_q
        )
        assert list(table(shared, "Q").index) == ["I", "love", "coffee"]


def test_edits_too_long_for_a_link_are_left_out_with_a_note():
    at = run(mode="text")
    big = "\n".join(" ".join(f"{0.123456 * (r + c):.6f}" for c in range(3)) for r in range(16))
    at.text_area(key="step.paste.X").input(big).run()
    at.text_input(key="step.paste.tokens").input(" ".join(f"t{i}" for i in range(16))).run()
    assert not at.exception
    assert "e_tokens" in at.query_params
    # 48 numbers fit; make them longer than a link may carry by raising d_model through W^Q's rows.
    wide = "\n".join(" ".join(f"{1.234567 * (r + c):.6f}" for c in range(400)) for r in range(16))
    at.text_area(key="step.paste.X").input(wide).run()
    assert not at.exception
    assert "e_X" not in at.query_params
    assert any("Not in the link (too long to share in an address): your edits of X" in m for m in messages(at, "info"))


def test_a_link_with_edits_that_do_not_fit_gets_messages_not_a_traceback():
    at = run(e_X="1,2;3,4", e_W_q="x,y")  # X of the wrong width, W^Q not numbers
    assert not at.exception
    assert any("could not be read" in w for w in messages(at, "warning"))
    assert any("X" in e for e in messages(at, "error"))  # the shape mismatch, named


def test_q_k_v_given_directly_show_the_lectures_pytorch_demo_and_pytorchs_own_result():
    at = run(preset="sdpa")
    assert not at.exception and not at.error
    np.testing.assert_array_equal(table(at, "V").to_numpy(), table(at, "K").to_numpy())  # value = key
    expected = [[1.0, 0.8318, 0.7227, 0.4455]] * 3 + [[1.0, 0.7227, 0.8318, 0.5545]]
    np.testing.assert_allclose(table(at, "Z").to_numpy(), expected, atol=5e-5)
    np.testing.assert_allclose(table(at, "PyTorch Z").to_numpy(), table(at, "Z").to_numpy(), atol=1e-12)
    assert any("F.scaled_dot_product_attention(query, key, value)" in c.value for c in at.code)
    assert any("Largest difference from Z above" in c for c in messages(at, "caption"))
    # An edit of V travels in the link as V (there is no X to edit), and changes Z.
    text = run(preset="sdpa", mode="text")
    text.text_area(key="step.paste.V").input("1 0\n0 1\n1 1\n0 0").run()
    assert not text.exception and not text.error
    params = {k: (v if isinstance(v, str) else v[0]) for k, v in text.query_params.items()}
    assert params["e_V"] == "1,0;0,1;1,1;0,0" and "e_X" not in params
    weights = table(text, "weights").to_numpy()
    np.testing.assert_allclose(table(text, "Z").to_numpy(), weights @ np.array([[1, 0], [0, 1], [1, 1], [0, 0]]))
    shared = run(**params)
    np.testing.assert_allclose(table(shared, "Z").to_numpy(), table(text, "Z").to_numpy())


def test_given_q_k_v_with_two_heads_and_a_shape_that_does_not_split():
    at = run(preset="sdpa", heads="2", pad="3")
    assert not at.exception and not at.error
    for head in (0, 1):
        w = table(at, f"weights · head {head}").to_numpy()
        np.testing.assert_array_equal(w[:, 3], 0.0)
        np.testing.assert_allclose(w.sum(axis=1), 1.0)
        np.testing.assert_allclose(table(at, f"PyTorch Z · head {head}").to_numpy(), table(at, f"Z · head {head}"))
    at = run(preset="sdpa", heads="3")
    assert not at.exception
    assert "Q has 4 columns, which do not split into 3 equal heads" in messages(at, "error")


def test_tayo_ay_masaya_uses_the_lectures_embeddings():
    at = run(preset="tayo")
    assert not at.exception and not at.error
    X = np.array([[0.1, -2, 0.4, -1], [0.3, 1, -1, 2], [0.1, 0, 1, -1]])
    np.testing.assert_allclose(table(at, "Q").to_numpy(), X @ ls.EXAMPLE_W_Q)
    np.testing.assert_allclose(table(at, "K").to_numpy(), X @ ls.EXAMPLE_W_K)
    assert list(table(at, "weights").index) == ["tayo", "ay", "masaya"]
    scaled = (X @ ls.EXAMPLE_W_Q) @ (X @ ls.EXAMPLE_W_K).T / SQRT3
    np.testing.assert_allclose(table(at, "weights").to_numpy(), softmax_rows(scaled))


def test_the_padding_mask_is_shown_in_pytorchs_conventions():
    at = run(pad="2")
    assert not at.exception
    conventions = table(at, "convention")
    assert list(conventions.columns) == ["I", "love", "tea"]
    rows = [list(r) for r in conventions.to_numpy()]
    assert rows == [["False", "False", "True"], ["0", "0", "-inf"], ["True", "True", "False"], ["1", "1", "0"]]
    assert any("attn_mask = ~key_padding_mask" in c for c in messages(at, "caption"))
