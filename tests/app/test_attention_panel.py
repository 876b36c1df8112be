"""The attention views (tformer_app.attention_panel) on models that are not plain multi-head attention, through the
Text attention page and AppTest, offline:

- a tiny random Llama with grouped-query attention (6 query heads, 2 key/value heads), saved as a local folder:
  "Q, K, V", "Why this weight" and "Query–key space" say which key/value head a query head reads, and read the K
  and V of that head;
- a tiny random ELECTRA, an architecture the core does not implement, run by transformers' own code: the views
  that need Q, K, V say why they are absent, the views of the weights work.
"""

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tests.app.pages import charts, messages, models_from, no_exception, run
from tests.core.test_fallback import _electra, _save
from tformer_views.why import why_this_weight

SENTENCE = "The cat sat on the mat because it was warm."
CORPUS = [SENTENCE, "The dog ran under the rug.", "It was too warm to sit."] * 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """TFORMER_MODEL_DIRS -> a folder with tiny-llama-gqa/ and tiny-electra/ in the Hugging Face layout."""
    root = tmp_path_factory.mktemp("models")
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = T.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    torch.manual_seed(0)
    llama = T.LlamaForCausalLM(
        T.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    llama.save_pretrained(root / "tiny-llama-gqa")
    tokenizer.save_pretrained(root / "tiny-llama-gqa")
    _save(_electra(), root / "tiny-electra")
    with models_from(root):
        yield root


def _param(at, name: str) -> str:
    value = at.query_params[name]
    return value[0] if isinstance(value, list) else value


def _matrix(frame) -> np.ndarray:
    """A heatmap's cells back as a matrix (rows and columns in the chart's order)."""
    return frame.pivot(index="row", columns="col", values="value").to_numpy()


# ---- grouped-query attention -------------------------------------------------------------------------------------
def test_grouped_query_views_name_the_shared_key_value_head_and_read_its_keys(model_dir):
    folder = str(model_dir / "tiny-llama-gqa")
    at = run("text_attention", model=folder, text=SENTENCE, views="qkv,why,qk", layer="1", head="4")
    no_exception(at)
    trace = tc.load_model(folder, device="cpu").trace(SENTENCE)
    assert trace.n_heads == 6 and trace.n_kv_heads == 2 and trace["decoder.1.attn.k"].shape[0] == 2
    said = "query head 4 reads key/value head 1, shared by query heads 3, 4, 5"
    infos = messages(at, "info")
    assert any(said in m and "K and V below are key/value head 1's" in m for m in infos)  # Q, K, V
    assert any(said in m and "k_j and values v_j below are key/value head 1's" in m for m in infos)  # why
    (caption,) = [c for c in messages(at, "caption") if c.startswith("PCA:")]
    assert said in caption  # query–key space
    # The K and V drawn are key/value head 1's, Q query head 4's own.
    drawn = charts(at)
    assert {"Q (layer 1, head 4)", "K (layer 1, key/value head 1)", "V (layer 1, key/value head 1)"} <= set(drawn)
    n = len(trace.tokens)
    k = _matrix(drawn["K (layer 1, key/value head 1)"][0])
    assert k.shape == (n, 8)  # d_head = 48 / 6
    np.testing.assert_allclose(k, trace["decoder.1.attn.k"][1], atol=1e-5)
    np.testing.assert_allclose(
        _matrix(drawn["V (layer 1, key/value head 1)"][0]), trace["decoder.1.attn.v"][1], atol=1e-5
    )
    np.testing.assert_allclose(_matrix(drawn["Q (layer 1, head 4)"][0]), trace["decoder.1.attn.q"][4], atol=1e-5)
    # Why this weight: q of head 4 against key/value head 1's keys reproduces the model's weights and z.
    query = int(_param(at, "query"))
    why = why_this_weight(trace, 1, 4, query)
    np.testing.assert_allclose(why.k, trace["decoder.1.attn.k"][1], atol=0)
    np.testing.assert_allclose(why.dots, trace["decoder.1.attn.k"][1] @ trace["decoder.1.attn.q"][4, query], rtol=1e-5)
    err_w, err_z = why.max_errors()
    assert err_w < 1e-5 and err_z < 1e-5
    table = next(d.value for d in at.dataframe if "q·k" in d.value.columns)
    np.testing.assert_allclose(table["q·k"].to_numpy(), why.dots, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(table["weight"].to_numpy(), trace.attention(1, 4)[query], atol=1e-5)


def test_a_head_with_its_own_keys_says_nothing_of_sharing():
    at = run("text_attention", views="qkv,why", layer="0", head="4")  # MiniLM: 12 heads, 12 key/value heads
    no_exception(at)
    assert not any("key/value head" in m for m in messages(at, "info"))
    assert "K (layer 0, head 4)" in charts(at)


# ---- a model transformers runs: weights only ------------------------------------------------------------------------
def test_a_model_run_by_transformers_says_why_q_k_v_are_absent_and_shows_its_weights(model_dir):
    folder = str(model_dir / "tiny-electra")
    views = "head,heatmap,search,overview,qkv,why,qk,distance"
    at = run("text_attention", model=folder, text="the cat sat on the mat", views=views, matrix="scores", head="2")
    no_exception(at)
    assert not messages(at, "error")
    absent = [m for m in messages(at, "info") if "cannot be shown for this model" in m]
    assert [m.split(" cannot")[0] for m in absent] == ["**Q, K, V**", "**Why this weight**", "**Query–key space**"]
    for m in absent:
        assert "ElectraForMaskedLM is not one of the architectures tformer implements" in m
        assert "transformers' own code" in m and "not the queries, keys and values" in m
    assert not at.get("plotly_chart")
    assert not any(t.startswith(("Q (", "K (", "V (")) for t in charts(at))
    # The views of the weights: head view, heatmap (weights only: a link's "scores" is dropped), search,
    # overview and distances.
    trace = tc.load_model(folder, device="cpu").trace("the cat sat on the mat")
    assert trace.meta["path"] == "transformers"
    drawn = charts(at)
    heatmap = drawn["layer 0, head 2: weights (softmax)"][0]
    np.testing.assert_allclose(_matrix(heatmap), trace.attention(0, 2), atol=1e-5)
    assert any("matrix=scores is not one of the choices" in m for m in messages(at, "info"))
    assert any("hands out its attention weights only" in c for c in messages(at, "caption"))
    assert at.radio(key="text.matrix").options == ["weights (softmax)"]
    subheaders = [s.value for s in at.subheader]
    for title in (
        "Head view · layer 0",
        "Which heads link two tokens?",
        "All layers × heads",
        "How far each head looks",
    ):
        assert title in subheaders
    assert any(t.startswith("layer 0: queries (left)") for t in drawn)  # the head view's chart
    assert "mean attention distance per head" in drawn
