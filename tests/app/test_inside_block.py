"""The "Inside a block" page and the Vision page's "Patch embedding by hand" panel through AppTest: the
numbers they show against the models' own traces, the recomposition against the next layer's input
(MiniLM, the translator's encoder and decoder, vit-tiny and the real DeiT-Tiny), the lecture's examples,
bad input and tampered links. Tables are found by the label in their corner (index name)."""

from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.app import pages
from tests.app.pages import charts, messages, no_exception, table, widget
from tests.app.passes import PassCounter
from tests.core.hf_helpers import DEIT
from tformer_app import derived_views, models, results
from tformer_core.trace import to_numpy
from tformer_views.lessons.attention import fmt

SENTENCE = "The cat sat on the mat."
needs_deit = pytest.mark.skipif(
    not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)"
)


def run(**params: str) -> AppTest:
    return pages.run("inside_block", timeout=120, **params)


def latex(at: AppTest) -> str:
    return "\n".join(e.value for e in at.latex)


def largest_difference(at: AppTest) -> float:
    (metric,) = at.metric
    return float(metric.value)


def test_minilm_token_through_a_post_norm_block_with_the_model_numbers():
    at = run()
    no_exception(at)
    assert not at.error
    trace = models.cached_model("minilm").trace(SENTENCE)
    token = 1  # [CLS] the cat ...: the default is the first word
    x, attn = trace["encoder.0.resid_pre"][token], trace["encoder.0.attn.out"][token]
    np.testing.assert_allclose(table(at, "block input").loc["x"], x[:6], atol=1e-6)
    residual = table(at, "residual 1")
    np.testing.assert_allclose(residual.loc["self-attention output"], attn[:6], atol=1e-5)  # recomputed in float64
    np.testing.assert_allclose(residual.loc["x + self-attention output"], (x + attn)[:6], atol=1e-5)
    norm = table(at, "LayerNorm 1")
    np.testing.assert_allclose(norm.loc["the model's y"], trace["encoder.0.ln_attn"][token, :6], atol=1e-7)
    np.testing.assert_allclose(norm.loc["y = γ ⊙ x̂ + β"], trace["encoder.0.ln_attn"][token, :6], atol=1e-5)
    total = np.asarray(x, dtype=np.float64) + attn
    assert rf"\mu = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} x_i = {fmt(total.mean())}" in latex(at)
    assert rf"\sigma^2 = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} (x_i-\mu)^2 = {fmt(total.var())}" in latex(at)
    hidden = table(at, "hidden layer")
    np.testing.assert_allclose(hidden.loc["GELU(·)"], trace["encoder.0.mlp.hidden"][token, :6], atol=1e-5)
    mlp = models.cached_model("minilm").encoder.blocks[0].mlp
    pre = trace["encoder.0.ln_attn"][token] @ to_numpy(mlp.W_in.weight).T + to_numpy(mlp.W_in.bias)
    assert any(f"**{int((pre > 0).sum())} of 1536** hidden units" in m for m in messages(at, "markdown"))
    assert any("d_model = **384**, d_ff = **1536** (4 × d_model" in m for m in messages(at, "markdown"))
    check = table(at, "check")
    np.testing.assert_allclose(check.loc["the model's"], trace["encoder.1.resid_pre"][token, :6], atol=1e-7)
    assert np.abs(check.loc["difference"]).max() <= 1e-5 and largest_difference(at) <= 1e-5
    assert {"This model's encoder block: post-norm", "For comparison: pre-norm"} <= set(charts(at))
    assert dict(at.query_params) == {
        "model": "minilm",
        "text": SENTENCE,
        "layer": "0",
        "token": "1",
        "dims": "6",
        "lnorm": "layernorm",
        "eps": "1e-05",
        "lnd": "4",
        "lnrow": "0",
    }


def test_switching_layer_token_and_dims_runs_no_model_and_the_last_layer_checks_its_output():
    at = run()
    no_exception(at)
    with PassCounter(models.cached_model("minilm")) as counter:
        widget(at, "block.layer").set_value(5)
        widget(at, "block.token").set_value(2)
        widget(at, "block.dims").set_value(3)
        at.run()
        assert counter.count == 0
    no_exception(at)
    assert "Token 2 (cat) through encoder layer 5" in [h.value for h in at.header]
    assert any("(this is the last layer)" in m and "encoder.5.resid_post" in m for m in messages(at, "markdown"))
    assert table(at, "check").shape == (3, 3) and largest_difference(at) <= 1e-5
    stream = charts(at)["‖v‖ per encoder layer: token 2 (cat) and the mean"][0]
    assert set(stream["quantity"]) == {"residual stream in (x)", "self-attention adds", "FFN adds", "block output"}
    trace = models.cached_model("minilm").trace(SENTENCE)
    chosen = stream[(stream["quantity"] == "FFN adds") & (stream["scope"] == "token 2: cat")].sort_values("layer")
    expected = [np.linalg.norm(trace[f"encoder.{layer}.mlp.out"][2]) for layer in range(6)]
    np.testing.assert_allclose(chosen["norm"], expected, rtol=1e-5)
    assert at.query_params["layer"] == "5" and at.query_params["token"] == "2"


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_translator_recomposes_both_stacks_and_the_decoder_shows_cross_attention(stack):
    at = run(model="translator", stack=stack, layer="1", token="2")
    no_exception(at)
    assert not at.error
    translation = results.result(
        results.block_translation("translator", "the big dog chases a small cat near the river")
    )
    assert any(" ".join(translation.decoder_tokens) in m for m in messages(at, "markdown"))
    assert largest_difference(at) <= 1e-5
    subheaders = [h.value for h in at.subheader]
    if stack == "decoder":
        assert subheaders[:3] == [
            "1. The self-attention, Add & Norm",
            "2. The cross-attention, Add & Norm",
            "3. The feed-forward network, Add & Norm",
        ]
        assert any("K and V from **the encoder's output**" in m for m in messages(at, "markdown"))
        cross = charts(at)[f"cross-attention weights of {translation.decoder_tokens[2]}"][0]
        assert list(cross["col_token"].cat.categories.str.replace("\u200b", "")) == list(translation.trace.tokens)
        np.testing.assert_allclose(cross.groupby("row")["value"].sum(), 1.0, atol=1e-9)
        masked = charts(at)[f"self-attention weights of {translation.decoder_tokens[2]}"][0]
        assert sorted(set(masked["col"])) == [0, 1, 2]  # causal: the keys after token 2 are left out
        np.testing.assert_allclose(masked.groupby("row")["value"].sum(), 1.0, atol=1e-9)
        hidden = len(translation.decoder_tokens) - 3
        assert f"The {hidden} masked keys (weight 0) are left out of the picture." in messages(at, "caption")
        assert "Masked multi-head self-attention" in str(charts(at)["This model's decoder block: post-norm"])
    else:
        assert subheaders[:2] == ["1. The self-attention, Add & Norm", "2. The feed-forward network, Add & Norm"]
    assert any("128 → **256** hidden units" in m for m in messages(at, "markdown"))


def test_vit_tiny_is_drawn_pre_norm_and_recomposes():
    at = run(model="vit-tiny", layer="3", token="5")
    no_exception(at)
    assert not at.error
    assert "Token 5 (r0c4) through encoder layer 3" in [h.value for h in at.header]
    assert [h.value for h in at.subheader][:2] == [
        "1. LayerNorm, the self-attention, Add",
        "2. LayerNorm, the feed-forward network, Add",
    ]
    assert {"This model's encoder block: pre-norm", "For comparison: post-norm"} <= set(charts(at))
    assert largest_difference(at) <= 1e-5


@needs_deit
def test_real_deit_recomposes_within_float32_rounding(monkeypatch):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(DEIT.parent))
    at = run(model=f"{DEIT.parent.name}/{DEIT.name}", layer="6", token="0")
    no_exception(at)
    assert not at.error
    assert largest_difference(at) <= 1e-5
    assert any("d_model = **192**, d_ff = **768**" in m for m in messages(at, "markdown"))
    assert any("197 keys: too many to draw" in m for m in messages(at, "caption"))
    strongest = table(at, "strongest keys")
    assert strongest.shape == (3, 5)
    weights = strongest.map(lambda cell: float(cell.rsplit("(", 1)[1].rstrip(")"))).to_numpy()
    assert np.all(np.diff(weights, axis=1) <= 0) and np.all(weights.sum(axis=1) <= 1.0 + 1e-3)


# ---- the lecture's LayerNorm example ----------------------------------------------------------------------------
def test_layer_norm_example_by_hand():
    at = run()
    summary = table(at, "per token")
    np.testing.assert_allclose(summary["μ"], [3, 5, 1])
    np.testing.assert_allclose(summary["σ²"], [4, 5, 3])
    np.testing.assert_allclose(summary["√(σ² + ε)"], np.sqrt(np.array([4, 5, 3]) + 1e-5))
    x = np.array([[1, 5, 1, 5], [2, 4, 6, 8], [0, 0, 0, 4]], dtype=float)
    x_hat = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(table(at, "x̂").to_numpy(), x_hat, atol=1e-12)
    np.testing.assert_allclose(table(at, "y").to_numpy(), x_hat * [1, 1, 2, 0.5] + [0, 0, 1, -1], atol=1e-12)
    assert r"\mu = \frac{1 + 5 + 1 + 5}{4} = 3" in latex(at)
    assert r"\sigma^2 = \frac{(1 - 3)^2 + (5 - 3)^2 + (1 - 3)^2 + (5 - 3)^2}{4} = 4" in latex(at)


def test_rms_norm_and_a_smaller_example_from_the_link():
    at = run(lnorm="rmsnorm", eps="0.5", lnd="2", lnrow="1")
    no_exception(at)
    summary = table(at, "per token")
    x = np.array([[1, 5], [2, 4], [0, 0]], dtype=float)
    np.testing.assert_allclose(summary["RMS = √(mean x² + ε)"], np.sqrt((x**2).mean(1) + 0.5))
    np.testing.assert_allclose(table(at, "y").to_numpy(), x / np.sqrt((x**2).mean(1, keepdims=True) + 0.5))
    assert r"\mathrm{RMS}(x) = \sqrt{\frac{2^2 + 4^2}{2} + 0.5} = " in latex(at)


@pytest.mark.parametrize("eps", ["0", "-1e-5"])
def test_an_eps_that_is_not_positive_is_refused_inline_and_the_rest_works(eps):
    at = run(eps=eps)
    no_exception(at)
    assert any("ε must be greater than 0" in e for e in messages(at, "error"))
    assert "per token" not in [d.value.index.name for d in at.dataframe]
    assert largest_difference(at) <= 1e-5  # the real model's part is unaffected


# ---- bad input and tampered links ---------------------------------------------------------------------------
def test_tampered_links_are_clamped_and_said():
    at = run(layer="9", token="999", dims="500", lnorm="<b>x</b>", stack="decoder")
    no_exception(at)
    notice = " ".join(messages(at, "info"))
    assert "layer=9 is not one of the choices here; using 0" in notice
    assert "token=999 is not one of the choices here; using 1" in notice
    assert "dims=500 is outside 1..16; using 16" in notice
    assert "lnorm=<b>x</b> is not one of the choices here" in notice
    assert "ignored stack (not a setting of this page)" in notice  # MiniLM has one stack
    assert table(at, "check").shape == (3, 16)


def test_an_empty_sentence_and_an_unknown_model_leave_the_rest_of_the_page_working():
    at = run(text="   ")
    no_exception(at)
    assert "Type a sentence." in messages(at, "error")
    assert "per token" in [d.value.index.name for d in at.dataframe]
    at = run(model="no-such-org/no-such-model")
    no_exception(at)
    assert any("Could not load" in e for e in messages(at, "error"))
    assert "per token" in [d.value.index.name for d in at.dataframe]


def test_user_text_is_escaped_where_it_is_shown_as_markdown():
    at = run(text="*bold* [a](http://evil.example) <b>x</b>", token="1")
    no_exception(at)
    (header,) = [h.value for h in at.header if h.value.startswith("Token 1")]
    assert header == r"Token 1 (\*) through encoder layer 0"
    weights = next(m for m in messages(at, "markdown") if m.startswith("Q from"))
    assert "The weights of *, per head" in weights


# ---- the Vision page's patch embedding by hand ------------------------------------------------------------------
def _panel(model_source: str) -> None:
    from tformer_app import derived_views, models, patch_embedding, results
    from tformer_app.page import run_page

    def draw(url):
        model = models.load_model(model_source)
        files = derived_views.sample_pictures()
        name = next((n for n in files if n.startswith("shapes:")), next(iter(files)))
        result = results.result(results.picture(model_source, files[name], name))
        patch_embedding.draw(url, result, model)

    run_page("Patch embedding", "", "vit", draw)


def panel(source: str = "vit-tiny", **params: str) -> AppTest:
    at = AppTest.from_function(_panel, default_timeout=120, args=(source,))
    for name, value in {"pe": "1", **params}.items():  # the section is opt-in
        at.query_params[name] = value
    return at.run()


def test_the_lecture_patch_embedding_example():
    at = panel()
    no_exception(at)
    assert not at.error
    expected = [[14, 10], [14, 12], [18, 17], [11, 9]]
    np.testing.assert_array_equal(table(at, "patch embeddings").to_numpy(), expected)
    np.testing.assert_array_equal(table(at, "X_p E").to_numpy(), expected)
    products = next(d.value for d in at.dataframe if "products written out" in d.value.columns)
    first = products.iloc[0]
    assert (first["patch"], first["kernel"], first["sum"]) == (0, 1, 14)
    assert (
        first["products written out"]
        == "1·1 + 2·0 + 4·0 + 2·1 + 1·0 + 0·1 + 2·1 + 1·0 + 2·1 + 2·0 + 3·0 + 4·1 + 2·1 + 1·1 + 3·0 + 0·1"
    )
    assert len(products) == 8 and list(products["sum"]) == [14, 10, 14, 12, 18, 17, 11, 9]
    assert {f"patch {i} (row {i // 2}, column {i % 2})" for i in range(4)} <= set(charts(at))
    assert any("**is** a matrix product" in m for m in messages(at, "markdown"))


def test_the_real_patch_matches_the_model_and_a_bad_patch_size_is_said_inline():
    at = panel(pe_p="3", pe_patch="27", pe_dims="5")
    no_exception(at)
    assert any("a patch size of 3 does not divide the 8 × 8 image" in e for e in messages(at, "error"))
    assert "patch embeddings" not in [d.value.index.name for d in at.dataframe]
    sums = table(at, "patch 27")  # the real model's part still works
    assert list(sums.index) == ["e1", "e2", "e3", "e4", "e5"]
    model = models.cached_model("vit-tiny")
    files = derived_views.sample_pictures()
    name = next(n for n in files if n.startswith("shapes:"))
    trace = results.result(results.picture("vit-tiny", files[name], name)).trace
    np.testing.assert_allclose(sums["the model's"], trace["encoder.embed.patch"][27, :5], atol=1e-7)
    np.testing.assert_allclose(sums["= e_k"], trace["encoder.embed.patch"][27, :5], atol=1e-5)
    weight = to_numpy(model.encoder.embed.project.weight)  # on the host, from whichever device the model is on
    np.testing.assert_allclose(sums["+ bias"], to_numpy(model.encoder.embed.project.bias)[:5])
    products = trace["encoder.embed.patches"][27] @ weight[:5].T
    np.testing.assert_allclose(sums["Σ of 48 products"], products, atol=1e-5)


def test_a_tampered_patch_number_is_clamped():
    at = panel(pe_patch="9999", pe_h="99")
    no_exception(at)
    notice = " ".join(messages(at, "info"))
    assert "pe_patch=9999 is outside 0..63; using 63" in notice and "pe_h=99 is outside 1..16; using 16" in notice
    assert "patch 63" in [d.value.index.name for d in at.dataframe]
