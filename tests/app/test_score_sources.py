"""Why this weight, from its sources (tformer_app.score_sources_panel) on Text attention and the Encoder-decoder page,
through AppTest: the tables are the core's numbers, and the remove button runs the real pass the core runs."""

import numpy as np
import pytest

import tformer_core as tc
from tests.app.pages import messages, no_exception, run, table
from tests.app.passes import PassCounter
from tformer_app import models
from tformer_core.score_sources import SOURCES_KEPT, Cell, remove_source, score_sources
from tformer_views import why_sources as ws

SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="module")
def minilm():
    return tc.load_model("minilm", device="cpu")


def test_the_lecture_cell_is_split_and_a_source_removed(minilm):
    """MiniLM's lecture head (layer 3, head 1), "it" (10) -> "animal" (2): the page's tables are the core's."""
    at = run("text_attention", text=SENTENCE, views="why", layer="3", head="1", query="10", key="2")
    no_exception(at)
    s = score_sources(minilm, minilm.trace(SENTENCE, keep=SOURCES_KEPT), Cell("encoder", 3, 1, 10, 2))
    query_side, key_side, pairs = table(at, "query side"), table(at, "key side"), table(at, "pairs")
    expected = ws.ranked_sources(s, "query")
    assert list(query_side["source"]) == list(expected["source"])
    np.testing.assert_allclose(query_side["adds"], expected["adds"], atol=1e-5)
    assert list(key_side["source"]) == list(ws.ranked_sources(s, "key")["source"])
    assert len(pairs) == 10 and abs(pairs["share"]).sum() <= 1.0
    check = next(m for m in messages(at, "caption") if "is the sum of" in m)
    assert f"the score {s.score:.4f} is the sum of {len(s.query_sources)} × {len(s.key_sources)} terms" in check
    top = str(query_side["source"].iloc[0])
    box = next(w for w in at.selectbox if w.label == "Source to remove")
    assert box.value == top  # the largest query-side source first
    next(b for b in at.button if b.label == "Remove this source").click().run()
    no_exception(at)
    removed = remove_source(minilm, s, top, SENTENCE)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Weight in this pass"] == f"{removed.weight:.4f}"
    assert shown["Linear prediction"] == f"{removed.linear_weight:.4f}"
    assert shown["Real pass without it"] == f"{removed.real_weight:.4f}"


def test_a_masked_cell_says_so_instead_of_a_table():
    at = run(
        "text_attention", model="smollm2", text="The cat sat on the mat", views="why", layer="0", query="1", key="4"
    )
    no_exception(at)
    assert any("is masked: its softmax input is -inf" in m for m in messages(at, "caption"))


def test_cross_attention_on_the_encoder_decoder_page_has_its_sources():
    at = run("encoder_decoder", model="translator", text="the cat sees the dog")
    no_exception(at)
    assert not any("Query side (through q of" in m for m in messages(at, "caption"))  # a toggle: stepping runs no pass
    with PassCounter(models.cached_model("translator")) as counter:  # split from the translation's cached trace
        next(t for t in at.toggle if t.label.startswith("Where the score comes from")).set_value(True).run()
        no_exception(at)
        assert counter.count == 0
    captions = messages(at, "caption")
    assert any("Query side (through q of" in m for m in captions)
    key_sides = [d.value for d in at.dataframe if d.value.index.name == "key side"]
    assert any(str(source).startswith("enc.") for frame in key_sides for source in frame["source"])


def test_the_why_here_lesson_page_walks_its_steps():
    at = run("why_here")
    no_exception(at)
    titles = [h.value for h in at.subheader]
    assert titles == [
        "1. The head",
        "2. The score",
        "3. Split into sources",
        "4. The query side",
        "5. The key side",
        "6. The pairs",
        "7. Remove the largest",
    ]
    assert any("gives “animal”" in m and "of its attention" in m for m in messages(at, "markdown"))
    assert len(table(at, "query side")) == 8 and len(table(at, "key side")) == 8
