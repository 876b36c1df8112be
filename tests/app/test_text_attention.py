"""The Text attention page, driven through Streamlit's AppTest: real models, real numbers, no network.

MiniLM (bundled) is the default model; a tiny random GPT-2 (with its own byte-level BPE tokenizer)
and a tiny random BERT with a masked-word head are saved into a temporary model folder and loaded
as local folders, as a user's own checkpoints would be.
"""

import re

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as T
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

import tformer_core as tc
from tests.app.pages import charts, messages, models_from, no_exception, run, widget
from tests.app.passes import PassCounter
from tformer_app import models
from tformer_core.checkpoints.sources import minilm_folder
from tformer_views import text as tv

SENTENCE = "The animal didn't cross the street because it was too tired."
CORPUS = [SENTENCE, "The cat sat on the mat.", "Attention is all you need.", "It was too tired to cross."] * 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """TFORMER_MODEL_DIRS -> a folder with tiny-gpt2/ and tiny-bert-mlm/ in the Hugging Face layout."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)

    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    gpt_tok = T.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    gpt = T.GPT2LMHeadModel(
        T.GPT2Config(
            vocab_size=len(gpt_tok), n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        )
    )
    gpt.save_pretrained(root / "tiny-gpt2")
    gpt_tok.save_pretrained(root / "tiny-gpt2")

    bert_tok = T.AutoTokenizer.from_pretrained(str(minilm_folder()))
    bert = T.BertForMaskedLM(
        T.BertConfig(
            vocab_size=len(bert_tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=64,
        )
    )
    bert.save_pretrained(root / "tiny-bert-mlm")
    bert_tok.save_pretrained(root / "tiny-bert-mlm")

    with models_from(root):
        yield root


def page(**params) -> AppTest:
    return run("text_attention", **params)


def texts(at, kind) -> list[str]:
    return messages(at, kind)


def chart_titles(at) -> list[str]:
    return list(charts(at))


def images(at) -> list[str]:
    return [url for element in at.get("image") for url in element.value]


def overview_pictures(at) -> list[str]:
    """The layers x heads overview: a PNG inside its clickable chart (one thumbnail per head)."""
    urls = []
    for element in at.get("vega_lite_chart"):
        for dataset in element.proto.datasets:
            frame = dataframe_util.convert_arrow_bytes_to_pandas_df(dataset.data.data)
            urls += [u for u in frame.get("url", []) if str(u).startswith("data:image/png")]
    return urls


@pytest.fixture(scope="module")
def default_page():
    at = page()
    no_exception(at)
    return at


@pytest.fixture(scope="module")
def every_view():
    at = page(views="head,heatmap,overview,qkv,why,distance", layer="0", head="0")
    no_exception(at)
    return at


def test_the_page_opens_with_the_head_view_and_the_heatmap(default_page, minilm):
    """What a lecture starts with, on the head that answers its question: the head where "it" gives "animal" the
    largest weight of all 6 x 12; the other views are one choice away, and in the link when chosen."""
    trace = minilm.trace(SENTENCE)
    it, animal = trace.tokens.index("it"), trace.tokens.index("animal")
    weights = np.stack([trace.attention(layer)[:, it, animal] for layer in range(trace.n_layers)])  # [layers, heads]
    layer, head = np.unravel_index(np.argmax(weights), weights.shape)
    assert (layer, head) == (3, 1) and weights[3, 1] == pytest.approx(0.677, abs=1e-3)
    assert (widget(default_page, "text.layer").value, widget(default_page, "text.head").value) == (3, 1)
    titles = chart_titles(default_page)
    assert "layer 3: queries (left) → keys (right)" in titles and "layer 3, head 1: weights (softmax)" in titles
    assert not {"Q (layer 3, head 1)", "mean attention distance per head"} & set(titles)
    assert widget(default_page, "text.views").value == ["head", "heatmap", "search"]


@pytest.fixture(scope="module")
def minilm():
    return tc.load_model("minilm", device="cpu")


HEATMAP = "layer 0, head 0: weights (softmax)"


def heatmap_cells(at, title=HEATMAP) -> pd.DataFrame:
    return charts(at)[title][0]


def test_every_view_of_minilm(every_view, minilm):
    at = every_view
    assert at.title[0].value == "Text attention"
    summary = "encoder (bidirectional) · 6 layers × 12 heads · d_head = 32 · 16 tokens"
    assert any(summary in c for c in texts(at, "caption"))
    titles = chart_titles(at)
    assert "layer 0: queries (left) → keys (right)" in titles  # head view
    assert HEATMAP in titles
    assert {"Q (layer 0, head 0)", "K (layer 0, head 0)", "V (layer 0, head 0)"} <= set(titles)
    assert "mean attention distance per head" in titles
    assert len(overview_pictures(at)) == 1 and not images(at)  # the layers x heads overview, one PNG, clickable
    assert any("no masked-word head" in c for c in texts(at, "caption"))
    trace = minilm.trace(SENTENCE)
    # The heatmap carries the head's real weights, one cell per token pair.
    cells = heatmap_cells(at)
    np.testing.assert_allclose(cells["value"].to_numpy(), trace.attention(0, 0).ravel(), atol=1e-5)
    # The head view draws every weight >= 0.01 of the 12 heads of layer 0.
    frames = charts(at)["layer 0: queries (left) → keys (right)"]  # the lines, the query and the key columns
    lines = next(f for f in frames if "weight" in f.columns)
    keys = next(f for f in frames if {"key", "token"} <= set(f.columns)).set_index("y")["key"]
    w = trace.attention(0)
    assert len(lines) == int((w >= 0.01).sum())
    key_positions = keys.loc[lines["y_key"]].to_numpy()  # a line's key, looked up as the browser does
    np.testing.assert_allclose(lines["weight"], w[lines["head"], lines["query"], key_positions], atol=1e-5)
    # The query defaults to "it"; the why-this-weight table holds that row of the weights.
    query = widget(at, "text.query")
    assert trace.tokens[query.value] == "it"
    table = next(d.value for d in at.dataframe if "weight" in d.value.columns)
    np.testing.assert_allclose(table["weight"].to_numpy(), trace.attention(0, 0)[query.value], atol=1e-5)
    assert table["weight"].sum() == pytest.approx(1.0, abs=1e-9)
    # Attention distance: one dot per head and layer, equal to the core's metric.
    dots = charts(at)["mean attention distance per head"][0]
    expected = tc.mean_token_distance(trace.all_attention())  # [layers, heads]
    np.testing.assert_allclose(dots.sort_values(["layer", "head"])["distance"], expected.ravel(), rtol=1e-5)
    assert at.query_params["model"] == "minilm" and at.query_params["layer"] == "0"


def test_switching_layer_head_and_views_runs_no_model(minilm):
    at = page()
    no_exception(at)
    with PassCounter(models.cached_model("minilm")) as counter:
        widget(at, "text.layer").set_value(3)
        widget(at, "text.head").set_value(5)
        at.run()
        no_exception(at)
        assert "layer 3, head 5: weights (softmax)" in chart_titles(at)
        np.testing.assert_allclose(
            heatmap_cells(at, "layer 3, head 5: weights (softmax)")["value"],
            minilm.trace(SENTENCE).attention(3, 5).ravel(),
            atol=1e-5,
        )
        widget(at, "text.hide").check()
        widget(at, "text.matrix").set_value("scaled")
        widget(at, "text.query").set_value(2)
        at.run()
        no_exception(at)
        assert "layer 3, head 5: softmax input QKᵀ/√d_k" in chart_titles(at)
        widget(at, "text.views").set_value(["why", "distance"])
        at.run()
        no_exception(at)
        assert counter.count == 0  # only the cached trace was read
        assert (at.query_params["layer"], at.query_params["head"], at.query_params["hide"]) == ("3", "5", "1")
        assert at.query_params["views"] == "why,distance"
        assert not images(at) and chart_titles(at) == ["mean attention distance per head"]
        # A new sentence is one new forward pass.
        widget(at, "text.text").input("Birds fly south in winter.").run()
        no_exception(at)
        assert counter.count == 1


def test_hiding_special_tokens_drops_them_from_the_views():
    at = page(views="heatmap,head", hide="1", layer="0", head="0")
    no_exception(at)
    cells = heatmap_cells(at)
    tokens = set(cells["row_token"]) | set(cells["col_token"])
    assert "[CLS]" not in tokens and "[SEP]" not in tokens and "animal" in tokens
    np.testing.assert_allclose(cells.groupby("row")["value"].sum(), 1.0, atol=1e-6)  # rows renormalised
    columns = [f for f in charts(at)["layer 0: queries (left) → keys (right)"] if "token" in f.columns]
    assert len(columns) == 2 and not ({"[CLS]", "[SEP]"} & (set(columns[0]["token"]) | set(columns[1]["token"])))
    assert any("went to the hidden special tokens" in c for c in texts(at, "caption"))


def test_url_restores_the_view():
    at = page(
        model="minilm",
        text="Birds fly south.",
        layer="4",
        head="7",
        views="heatmap,why",
        query="2",
        key="1",
        matrix="scores",
        heads="1,3",
    )
    no_exception(at)
    assert widget(at, "text.text").value == "Birds fly south."
    assert (widget(at, "text.layer").value, widget(at, "text.head").value) == (4, 7)
    assert widget(at, "text.views").value == ["heatmap", "why"]
    assert (widget(at, "text.query").value, widget(at, "text.key").value) == (2, 1)
    assert "layer 4, head 7: scores QKᵀ" in chart_titles(at)
    assert at.query_params["heads"] == "1,3" and at.query_params["text"] == "Birds fly south."


def test_a_url_with_impossible_values_falls_back_to_defaults():
    at = page(layer="99", head="x", query="500", views="nonsense,heatmap", heads="3,40", start="7")
    no_exception(at)
    assert (widget(at, "text.layer").value, widget(at, "text.head").value) == (3, 1)  # the lecture's head
    assert widget(at, "text.views").value == ["heatmap"]
    assert at.query_params["heads"] == "3" and at.query_params["query"] == "10"  # "it"


def test_a_sentence_pair_is_read_with_two_segments(minilm):
    at = page(pair="It was too tired.", views="heatmap", layer="0", head="0")
    no_exception(at)
    cells = heatmap_cells(at)
    tokens = [t.rstrip("\u200b") for t in cells.loc[cells["row"] == 0, "col_token"]]
    assert tokens.count("[SEP]") == 2 and tokens[-2:] == [".", "[SEP]"]
    expected = minilm.trace(SENTENCE, pair="It was too tired.").attention(0, 0)
    np.testing.assert_allclose(cells["value"], expected.ravel(), atol=1e-5)


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_sentence_says_so(text):
    at = page(text=text)
    no_exception(at)
    assert any("empty" in e for e in texts(at, "error"))
    assert not charts(at)


def test_ten_thousand_words_are_truncated_with_a_note():
    at = page(text=" ".join(["word"] * 10_000), views="heatmap,overview")
    no_exception(at)
    notes = list(messages(at, "info"))
    expected = ("10,002 tokens", "at most 512", "last 9,490 tokens were dropped")
    assert any(all(e in note for e in expected) for note in notes), notes
    assert widget(at, "text.start").value == 0  # the detail views show a window of the 512 tokens
    assert len(heatmap_cells(at)) == 64 * 64
    assert len(overview_pictures(at)) == 1


def test_an_unknown_model_id_fails_with_a_message():
    at = page(model="not-a-real/model-xyz")
    no_exception(at)
    assert widget(at, "text.model_choice").value == "__other__"
    assert widget(at, "text.model_other").value == "not-a-real/model-xyz"
    assert any("Could not load" in e and "not-a-real/model-xyz" in e for e in texts(at, "error"))
    assert not charts(at)
    widget(at, "text.model_choice").set_value("minilm").run()  # the session keeps working
    no_exception(at)
    assert not texts(at, "error") and "layer 3, head 1: weights (softmax)" in chart_titles(at)


def test_an_encoder_decoder_model_points_to_its_page():
    at = page(model="translator")
    no_exception(at)
    assert any("encoder-decoder" in w for w in messages(at, "warning"))
    assert not charts(at)


def test_a_local_gpt2_shows_the_causal_mask_and_next_token_top5(model_dir):
    folder = str(model_dir / "tiny-gpt2")
    at = page(model=folder, views="heatmap,overview", layer="0", head="0")
    no_exception(at)
    # Local folders are offered in the list by their name under the model folder, never by their path.
    assert widget(at, "text.model_choice").value == f"{model_dir.name}/tiny-gpt2"
    assert at.query_params["model"] in (f"{model_dir.name}/tiny-gpt2", [f"{model_dir.name}/tiny-gpt2"])
    assert any("Causal mask" in c for c in texts(at, "caption"))
    assert any("Grey cells are masked" in c for c in texts(at, "caption"))
    cells = heatmap_cells(at)
    assert (cells["value"].isna() == (cells["col"] > cells["row"])).all()  # masked = above the diagonal
    assert (cells.loc[cells["value"].isna(), "text"] == "0").all()  # a masked weight: grey, and 0
    model = tc.load_model(folder, device="cpu")
    trace = model.trace(SENTENCE)
    top = next(d.value for d in at.dataframe if list(d.value.columns) == ["token", "probability"])
    assert len(top) == 5
    np.testing.assert_allclose(top["probability"].to_numpy(), [p for _, p in trace.predictions(5)], rtol=1e-4)
    assert any("Next token, top 5" in h for h in texts(at, "subheader"))


def test_a_local_bert_with_a_masked_word_head_guesses_the_mask(model_dir):
    folder = str(model_dir / "tiny-bert-mlm")
    at = page(model=folder, text="The cat [MASK] on the mat.", views="why")
    no_exception(at)
    assert any("Masked word, top 5" in h for h in texts(at, "subheader"))
    top = next(d.value for d in at.dataframe if list(d.value.columns) == ["token", "probability"])
    trace = tc.load_model(folder, device="cpu").trace("The cat [MASK] on the mat.")
    assert list(top["token"]) == [t for t, _ in tv.top_predictions(trace, 5, 3)]
    np.testing.assert_allclose(top["probability"], [p for _, p in trace.predictions(5, 3)], rtol=1e-4)


def test_user_tokens_are_escaped_in_markdown():
    at = page(text="<b>x</b> is *bold*", views="why")
    no_exception(at)
    widget(at, "text.query").set_value(1).run()  # the token "<"
    no_exception(at)
    shown = [e.value for e in at.markdown] + [e.value for e in at.caption]  # the Markdown source, as sent
    assert any(r"Query \<" in s for s in shown)
    assert not any(re.search(r"(?<!\\)<", s) for s in shown)


def test_why_this_weight_follows_the_strongest_key_until_one_is_chosen():
    """It kept an old key when the head changed (layer 3 head 1 explained it → it 0.064, not it → animal 0.677)."""
    at = page(views="why")
    widget(at, "text.layer").set_value(3)
    widget(at, "text.head").set_value(1)
    at.run()
    no_exception(at)
    key = widget(at, "text.key")
    assert key.value == 2 and key.options[2] == "2: animal"
    assert any("= 0.6768" in f.value for f in at.latex)
    widget(at, "text.head").set_value(4).run()  # another head: its own strongest key
    trace = tc.load_model("minilm", device="cpu").trace(SENTENCE)
    assert widget(at, "text.key").value == int(np.argmax(trace.attention(3, 4)[10]))
    widget(at, "text.key").set_value(5).run()  # chosen by the user: kept when the head changes
    widget(at, "text.head").set_value(1).run()
    assert widget(at, "text.key").value == 5


def test_a_new_sentence_gives_its_own_token_choices_at_once():
    """The Query and Key boxes showed the old sentence's words ("10: it", "2: animal") until the next click."""
    at = page(views="why")
    at.text_area(key="text.text").input("The trophy didn't fit in the suitcase because it was too big.").run()
    no_exception(at)
    query, key = widget(at, "text.query"), widget(at, "text.key")
    tokens = tc.load_model("minilm", device="cpu").trace(
        "The trophy didn't fit in the suitcase because it was too big."
    )
    assert query.options == [f"{i}: {t}" for i, t in enumerate(tokens.tokens)]
    assert query.options[query.value] == "11: it"  # the query follows "it" to its new place
    assert key.options[key.value].split(": ")[1] in tokens.tokens
    assert any("query 11" in h.value for h in at.subheader)


def test_the_heads_that_link_it_to_animal_are_one_look_away(default_page):
    """Finding the head that links "it" to "animal" took a teacher 9 to 30 clicks."""
    at = default_page
    ranked = [b.label for b in at.button if b.label.startswith("layer ")]
    assert ranked[0] == "layer 3, head 1: 0.677" and len(ranked) == 5
    assert any("Strongest heads for it → animal" in m for m in messages(at, "markdown"))
    trace = tc.load_model("minilm", device="cpu").trace(SENTENCE)
    grid = charts(at)["click a head to select it"][0].sort_values(["layer", "head"])
    expected = np.stack([trace.attention(layer)[:, 10, 2] for layer in range(6)])  # it → animal, every head
    np.testing.assert_allclose(grid["value"].to_numpy(), expected.ravel(), atol=1e-6)


def test_one_click_on_a_ranked_head_or_a_heatmap_cell_selects():
    at = page()
    next(b for b in at.button if b.label == "layer 3, head 1: 0.677").click().run()
    no_exception(at)
    assert (widget(at, "text.layer").value, widget(at, "text.head").value) == (3, 1)
    assert "Heatmap · layer 3, head 1" in texts(at, "subheader")
    assert next(b for b in at.button if b.label == "layer 3, head 1: 0.677").proto.type == "primary"  # shown as chosen


def test_the_page_says_what_the_tokenizer_changed_in_the_text():
    at = page(text="Con mèo ngồi 🐱 trên thảm", views="heatmap", layer="0", head="0")
    no_exception(at)
    [line] = [c for c in texts(at, "caption") if c.startswith("The tokenizer changed your text")]
    assert "lowercases it, strips accents (mèo → meo) and has no token for 🐱, written [UNK]" in line
    assert not [c for c in texts(page(views="heatmap"), "caption") if "tokenizer changed" in c]  # lowercasing alone


WIDE = "The animal didn't cross the street because it was too wide."


def _cells(at, title) -> np.ndarray:
    frame = charts(at)[title][0].sort_values(["row", "col"])
    return frame["value"].to_numpy().reshape(frame["row"].max() + 1, frame["col"].max() + 1)


def test_a_second_sentence_is_compared_head_for_head_and_cell_by_cell(minilm, default_page):
    assert not any("sentence:" in title for title in chart_titles(default_page))  # folded and empty: nothing drawn
    at = page(compare=WIDE, views="heatmap", layer="2", head="5")
    no_exception(at)
    first, second = minilm.trace(SENTENCE).attention(2, 5), minilm.trace(WIDE).attention(2, 5)
    np.testing.assert_allclose(_cells(at, "First sentence: layer 2, head 5"), first, atol=1e-6)
    np.testing.assert_allclose(_cells(at, "Second sentence: layer 2, head 5"), second, atol=1e-6)
    np.testing.assert_allclose(_cells(at, "Second − first: layer 2, head 5"), second - first, atol=1e-6)
    assert np.abs(second - first).max() > 0.01  # the sentences differ in one word, and the head sees it
    labels = charts(at)["Second − first: layer 2, head 5"][0]["row_token"].unique()
    assert "tired→wide" in [str(t).rstrip("\u200b") for t in labels]
    assert at.query_params["compare"] == WIDE
    widget(at, "text.head").set_value(0).run()  # another head: both sentences follow, from the cache
    no_exception(at)
    np.testing.assert_allclose(
        _cells(at, "Second sentence: layer 2, head 0"), minilm.trace(WIDE).attention(2, 0), atol=1e-6
    )
    widget(at, "text.compare").set_value("It was too wide.").run()  # fewer tokens: both shown, no difference
    no_exception(at)
    assert {"First sentence: layer 2, head 0", "Second sentence: layer 2, head 0"} <= set(chart_titles(at))
    assert not any(title.startswith("Second − first") for title in chart_titles(at))
    assert any("do not line up" in m for m in texts(at, "info"))
