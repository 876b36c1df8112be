"""The Vision page's "Why this weight" expander through AppTest, on the bundled vit-tiny: folded it computes nothing;
open, its key is the strongest, its check and tables are the core's split of a pass over the same picture computed
here, a new key, head or query splits the page's cached trace (no pass), and "remove this source" runs the picture
again (two passes: the split's and the edited one) with the numbers of the core's own removal."""

import io

import numpy as np
import pytest
from PIL import Image

import tformer_core as tc
from tests.app.pages import messages, no_exception, run, shown, table, widget
from tests.app.passes import PassCounter
from tformer_app import models, results
from tformer_app.vision_explain import WHY
from tformer_core.score_sources import SOURCES_KEPT, Cell, remove_source, score_sources
from tformer_views import samples
from tformer_views import why_sources as ws

SAMPLE = "shapes: circle"  # vit-tiny's default picture
OPEN = "vit.why_open"


@pytest.fixture(scope="module")
def vit_tiny():
    """vit-tiny loaded here, apart from the app's shared copy, and the picture's input as its preprocessing makes it
    from the sample file (not from the page's result)."""
    model = tc.load_model("vit-tiny", device="cpu")
    with Image.open(io.BytesIO(samples.samples()[SAMPLE])) as picture:
        pixels = model.preprocessing(picture.convert("RGB"))
    return model, pixels


def _split_shown(at, s) -> None:
    """The panel's check and its two tables are `s`'s."""
    check = next(m for m in messages(at, "caption") if "is the sum of" in m)
    terms = f"{len(s.query_sources)} × {len(s.key_sources)} terms"
    assert f"the score {s.score:.4f} is the sum of {terms} = {s.total:.4f}" in check
    for side in ws.SIDES:
        expected, got = ws.ranked_sources(s, side), table(at, f"{side} side")
        assert list(got["source"]) == list(expected["source"])
        np.testing.assert_allclose(got["adds"], expected["adds"], atol=1e-5)


def test_the_why_expander_splits_the_strongest_key_from_the_cached_trace(vit_tiny):
    model, pixels = vit_tiny
    at = run("vision", timeout=120, model="vit-tiny", sample=SAMPLE, layer="2", head="1")
    no_exception(at)
    assert any(e.label == WHY for e in at.expander)
    assert not any("is the sum of" in m for m in messages(at, "caption"))  # folded: nothing split
    at.session_state[OPEN] = True
    at.run()
    no_exception(at)
    full = model.trace(pixels, keep=SOURCES_KEPT)
    row = full.block_tensor("weights", 2)[1, 0].double().numpy()  # the class token's row, layer 2, head 1
    strongest = int(np.argmax(row))
    assert widget(at, "vit.why_key").value == strongest
    s = score_sources(model, full, Cell("encoder", 2, 1, 0, strongest))
    assert s.weight == pytest.approx(row[strongest], abs=1e-6)
    said = next(shown(m) for m in messages(at, "markdown") if "gives" in m and "a weight of" in m)
    assert f"**[CLS]** gives **{full.tokens[strongest]}** a weight of **{s.weight:.4f}**" in said
    _split_shown(at, s)

    app_model = models.cached_model("vit-tiny")
    with PassCounter(app_model) as counter:
        widget(at, "vit.why_key").set_value(27).run()  # patch r3c2 of the 8 x 8 grid (token 27 after [CLS])
        no_exception(at)
        _split_shown(at, score_sources(model, full, Cell("encoder", 2, 1, 0, 27)))
        at.session_state["vit.query"] = 9  # the picker's patch 9: token 10
        at.run()
        no_exception(at)
        _split_shown(at, score_sources(model, full, Cell("encoder", 2, 1, 10, 27)))
        assert counter.count == 0
    assert full.tokens[27] == "r3c2" and at.query_params["why_key"] == "27"

    s = score_sources(model, full, Cell("encoder", 2, 1, 10, 27))
    chosen = next(w for w in at.selectbox if w.label == "Source to remove").value  # the panel's choice, kept
    with PassCounter(app_model) as counter:
        next(b for b in at.button if b.label == "Remove this source").click().run()
        no_exception(at)
        assert counter.count == 2  # the split's pass and the pass without the source, over the same picture
    removed = remove_source(model, s, chosen, pixels)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Weight in this pass"] == f"{removed.weight:.4f}"
    assert metrics["Linear prediction"] == f"{removed.linear_weight:.4f}"
    assert metrics["Real pass without it"] == f"{removed.real_weight:.4f}"
    assert removed.real_weight != pytest.approx(removed.weight, abs=1e-4)  # the source did change the pass


def test_a_tensor_in_a_requests_inputs_is_keyed_by_its_contents(vit_tiny):
    """The remove button's request carries the picture's pixels: equal contents share one cached result (a
    tensor hashes by its identity), one changed pixel or dtype does not."""
    _, pixels = vit_tiny
    cell = Cell("encoder", 0, 0, 0, 1)
    key = results.score_sources("vit-tiny", (pixels,), (), cell)
    same = results.score_sources("vit-tiny", (pixels.clone(),), (), cell)
    nudged = pixels.clone()
    nudged[0, 0, 0] += 1e-3
    assert results.key_of(key.args) == results.key_of(same.args)
    assert hash(results.key_of(key.args)) == hash(results.key_of(same.args))
    assert results.key_of(key.args) != results.key_of(results.score_sources("vit-tiny", (nudged,), (), cell).args)
    assert results.key_of((pixels,)) != results.key_of((pixels.double(),))


def test_on_the_mean_of_the_heads_the_expander_offers_a_head_and_splits_it(vit_tiny):
    """The page opens on the mean of the heads, which has no score: the expander then asks for a head (head 0 first)
    and splits that head's strongest key, as the core does."""
    model, pixels = vit_tiny
    at = run("vision", timeout=120, model="vit-tiny", sample=SAMPLE, layer="1")
    no_exception(at)
    at.session_state[OPEN] = True
    at.run()
    no_exception(at)
    assert widget(at, "vit.why_head").value == 0
    full = model.trace(pixels, keep=SOURCES_KEPT)
    row = full.block_tensor("weights", 1)[0, 0].double().numpy()  # the class token's row, layer 1, head 0
    _split_shown(at, score_sources(model, full, Cell("encoder", 1, 0, 0, int(np.argmax(row)))))
    widget(at, "vit.why_head").set_value(2).run()
    no_exception(at)
    row = full.block_tensor("weights", 1)[2, 0].double().numpy()
    _split_shown(at, score_sources(model, full, Cell("encoder", 1, 2, 0, int(np.argmax(row)))))
