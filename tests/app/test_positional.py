"""The "Positional encoding" page through Streamlit's AppTest: the numbers it shows, bad settings,
the real model's embeddings and the URL. Tables are found by the label in their corner (index name)."""

import math

import numpy as np
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app import pages
from tests.app.pages import messages, table


def run(**params: str) -> AppTest:
    return pages.run("positional", timeout=60, **params)


def test_defaults_show_the_sinusoidal_numbers_and_write_the_url():
    at = run()
    assert not at.exception and not at.error
    np.testing.assert_allclose(table(at, "PE").to_numpy(), tc.sinusoidal_encoding(50, 128)[:8, :8], atol=1e-12)
    formulas = table(at, "formula")
    assert formulas.shape == (6, 6)
    angle = 3 / 10000 ** (4 / 128)
    assert formulas.loc["pos 3", "dim 5 (cos, i=2)"] == f"cos(3/10000^(4/128)) = {math.cos(angle):.4f}"
    dot = table(at, "similarity").to_numpy()
    np.testing.assert_allclose(np.diag(dot), 64.0)  # ||PE(p)||^2 = d/2
    np.testing.assert_allclose(np.diagonal(dot, 1), np.diagonal(dot, 1)[0])  # depends only on the offset
    offsets = table(at, "PE(p)·PE(p+k)")  # one column per start p, and the formula: all equal
    assert list(offsets.columns) == ["p = 0", "p = 12", "p = 25", "Σ cos(ω_i k)"]
    predicted = [sum(math.cos(k / 10000 ** (2 * i / 128)) for i in range(64)) for k in range(8)]
    for column in offsets.columns:
        np.testing.assert_allclose(offsets[column], predicted, atol=1e-9)
    params = dict(at.query_params)
    assert (params["n"], params["d"], params["base"], params["sim"]) == ("50", "128", "10000.0", "dot")
    assert params["dims"] == "0,1,20,60"


def test_url_restores_the_lecture_setting_base_100():
    at = run(n="10", d="6", base="100", sim="cosine", dims="0,3,99")
    assert not at.exception and not at.error
    assert at.number_input(key="pe.base").value == 100.0 and at.number_input(key="pe.d").value == 6
    assert table(at, "formula").loc["pos 2", "dim 2 (sin, i=1)"] == "sin(2/100^(2/6)) = 0.4177"
    np.testing.assert_allclose(table(at, "PE").to_numpy(), tc.sinusoidal_encoding(10, 6, 100.0)[:8], atol=1e-12)
    cosine = table(at, "similarity").to_numpy()
    np.testing.assert_allclose(np.diag(cosine), 1.0)
    pe = tc.sinusoidal_encoding(10, 6, 100.0)
    np.testing.assert_allclose(cosine, (pe @ pe.T / 3.0)[:8, :8], atol=1e-12)
    assert at.multiselect(key="pe.dims").value == [0, 3]  # 99 does not exist at d_model 6
    params = dict(at.query_params)
    assert (params["n"], params["d"], params["base"], params["sim"], params["dims"]) == (
        "10",
        "6",
        "100.0",
        "cosine",
        "0,3",
    )


def test_bad_settings_are_rejected_inline():
    at = run(d="7")
    assert not at.exception
    assert any("d_model must be even" in e for e in messages(at, "error"))
    assert "PE" not in [d.value.index.name for d in at.dataframe]
    assert "token embedding" in [d.value.index.name for d in at.dataframe]  # the rest of the page still works
    at = run(base="1")
    assert not at.exception
    assert any("greater than 1" in e for e in messages(at, "error"))
    at = run(n="0")  # outside the widget's limits: clamped, and the user is told
    assert not at.exception
    assert at.number_input(key="pe.n").value == 1
    assert any("From the link: n=0 is outside 1..512; using 1" in w for w in messages(at, "info"))


def test_real_sentence_parts_add_up_and_come_from_minilm():
    at = run(text="Hello world", xdims="4", learned="16")
    assert not at.exception and not at.error
    model = tc.load_model("minilm", device="cpu")
    trace = model.trace("Hello world")
    tok = table(at, "token embedding")
    assert list(tok.index) == ["[CLS]", "hello", "world", "[SEP]"] and tok.shape == (4, 4)
    np.testing.assert_allclose(tok.to_numpy(), trace["encoder.embed.tok"][:, :4], atol=1e-7)
    pos = table(at, "learned position").to_numpy()
    np.testing.assert_allclose(pos, model.encoder.embed.pos.weight.detach().numpy()[:4, :4], atol=1e-7)
    total = table(at, "sum (before LayerNorm)").to_numpy()
    np.testing.assert_allclose(total, tok.to_numpy() + pos + table(at, "segment").to_numpy(), atol=1e-6)
    np.testing.assert_allclose(
        table(at, "sinusoidal PE (base 10000)").to_numpy(), tc.sinusoidal_encoding(4, 384)[:, :4], atol=1e-12
    )
    norms = table(at, "length")
    np.testing.assert_allclose(norms["‖sinusoidal PE‖"], math.sqrt(192))
    assert at.slider(key="pe.learned").value == 16
    at.text_input(key="pe.text").input("The cat").run()
    assert list(table(at, "token embedding").index) == ["[CLS]", "the", "cat", "[SEP]"]
    assert at.query_params["text"] in ("The cat", ["The cat"])
