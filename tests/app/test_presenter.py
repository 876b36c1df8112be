"""Presenter mode's sizes, as the pages send them: the numbers a class reads grow with the presenter's type.

The lesson's matrices on "Attention, step by step" become HTML tables (a data grid draws its cells on a canvas
at its own size, whatever the page's type) and its heatmaps grow 1.5 times, cells and printed numbers alike;
the Text attention heatmap's numbers grow with its cells, as far as the room the browser reports allows; a
chart already drawn at the presenter's size (the head view) is not enlarged twice.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.app.pages import PAGES, no_exception
from tformer_app import downloads, presenter
from tformer_app.presenter import PRESENT, ROOM
from tformer_views.flow import AROUND_PLOT_PX, MIN_LEVEL_PX

# The main column's width on a 1280-px projector: with the sidebar, and in presenter mode (no sidebar).
ROOMS = {False: 820, True: 1190}


def run(page: str, present: bool, **params: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=120)
    for name, value in params.items():
        at.query_params[name] = value
    at.session_state[PRESENT] = present
    at.session_state[ROOM] = ROOMS[present]  # as the browser reports it
    at.run()
    no_exception(at)
    return at


def specs(at) -> dict[str, dict]:
    """Every chart's Vega-Lite spec as sent, by title."""
    out = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title", "")
        out[title.get("text", "") if isinstance(title, dict) else str(title)] = spec
    return out


def number_size(spec: dict) -> int:
    """The font size of the numbers printed in a heatmap's cells."""
    return next(layer["mark"]["fontSize"] for layer in spec["layer"] if layer["mark"].get("type") == "text")


@pytest.fixture(scope="module")
def step_pages():
    return run("step_by_step", False), run("step_by_step", True)


def test_the_lessons_tables_and_heatmaps_grow_with_the_presenters_type(step_pages):
    usual, presenting = step_pages
    # The seven matrices (Q, K, V, QKᵀ, scaled, weights, Z) with their numbers: a grid, then an HTML table.
    names = ["Q", "K", "V", "QKᵀ", "scaled", "weights", "Z"]
    grids = {d.value.index.name: d.value for d in usual.dataframe}
    tables = {t.value.index.name: t.value for t in presenting.table}
    assert (
        set(names) <= set(grids)
        and set(names) <= set(tables)
        and not set(names) & {d.value.index.name for d in presenting.dataframe}
    )
    for name in names:
        np.testing.assert_allclose(tables[name].to_numpy(dtype=float), grids[name].to_numpy(dtype=float))
    before, after = specs(usual), specs(presenting)
    for name in names:
        assert (after[name]["width"], after[name]["height"]) == (
            round(1.5 * before[name]["width"]),
            round(1.5 * before[name]["height"]),
        )
        assert number_size(after[name]) == round(1.5 * number_size(before[name])) >= 18


def test_the_attention_heatmap_grows_once_and_its_numbers_with_it():
    usual = specs(run("text_attention", False, views="heatmap,head", layer="0", head="0"))
    presenting = specs(run("text_attention", True, view="heatmap", layer="0", head="0"))
    title = "layer 0, head 0: weights (softmax)"
    usual_cell, presenting_cell = usual[title]["height"] / 16, presenting[title]["height"] / 16  # 16 tokens
    assert presenting_cell >= 1.4 * usual_cell and presenting[title]["width"] <= ROOMS[True]  # larger, and it fits
    assert number_size(presenting[title]) >= 18 and number_size(presenting[title]) >= 1.35 * number_size(usual[title])
    head_view = run("text_attention", True, layer="0", head="0")
    spec = specs(head_view)[""]  # presenter mode's head view: the heading above names it
    labels = [layer["mark"]["fontSize"] for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert labels == [18, 18] and spec["usermeta"] == {"scale": 1.5}  # 12 px x 1.5, once


def test_a_slide_saved_with_every_view_opens_one_view_at_a_time_and_keeps_the_others_settings():
    """A deck's slide saved from the page (every default view: the heatmap's matrix, the pair search's key token
    in its link) presented in presenter mode (one view): no "ignored ... (not a setting of this page)" line on the
    projector; those settings stay in the link and apply when their view is shown."""
    from tests.app.pages import messages

    at = run("text_attention", True, layer="2", head="3", matrix="scores", pair_key="2", qk_dims="3", view="head")
    assert not [m for m in messages(at, "info") if "link" in m], messages(at, "info")
    assert at.query_params["matrix"] == "scores" and at.query_params["pair_key"] == "2"
    at.pills(key="text.view").set_value("heatmap").run()
    no_exception(at)
    assert at.radio(key="text.matrix").value == "scores"  # the slide's matrix, once its view is shown
    assert at.query_params["matrix"] == "scores" and at.query_params["pair_key"] == "2"
    # Out of presenter mode a link's one view ("view", presenter mode's) is no error either.
    at = run("text_attention", False, layer="2", head="3", view="heatmap")
    assert not [m for m in messages(at, "info") if "link" in m], messages(at, "info")


def test_smollm2s_flow_graph_fits_the_projectors_screen(smollm2_folder):
    """At 1280 x 720 the graph of SmolLM2's 61 levels was 1,060 px tall, enlarged once more by presenter mode."""
    for present in (False, True):
        at = run("text_attention", present, flow="1", arch="decoder", text="The capital of France is")
        spec = next(v for title, v in specs(at).items() if "Routes to the prediction at" in title)
        if not present:
            assert spec["height"] == 10 * 63 and "usermeta" not in spec  # on a page: 10 px a level
            continue
        screen = round((ROOMS[True] + presenter.SCREEN_PAD_PX) * 9 / 16)  # 719: the room's 16:9 screen
        assert spec["usermeta"] == {"scale": presenter.FONT_SCALE}  # sized for the screen, not enlarged again
        assert 61 * MIN_LEVEL_PX <= spec["height"] <= screen - AROUND_PLOT_PX


def test_short_tables_are_drawn_at_the_presenters_type_and_long_ones_stay_grids():
    """A data grid draws its cells on a canvas at its own 14 px: on a projector the sources of a score were the
    smallest type on the screen. In presenter mode a table of up to PRESENTED_ROWS rows is an HTML table."""
    usual, presenting = run("why_here", False), run("why_here", True)
    grids = {d.value.index.name: d.value for d in usual.dataframe}
    assert len(usual.table) == 0 and {"query side", "key side"} <= set(grids)
    tables = {t.value.index.name: t.value for t in presenting.table}
    assert {"query side", "key side"} <= set(tables) and not {"query side", "key side"} & {
        d.value.index.name for d in presenting.dataframe
    }
    for side in ("query side", "key side"):
        shown, grid = tables[side], grids[side]
        assert list(shown.columns) == list(grid.columns) and len(shown) == len(grid) <= downloads.PRESENTED_ROWS
        np.testing.assert_array_equal(shown["adds"], grid["adds"])  # the numbers themselves; only their format differs
    # The row of "it" against all of a long text's keys: more rows than a projector shows, so a grid that scrolls.
    long_text = " ".join(["the animal was tired"] * 12)
    at = run("text_attention", True, view="why", text=long_text)
    assert any(len(d.value) > downloads.PRESENTED_ROWS for d in at.dataframe)
    assert all(len(t.value) <= downloads.PRESENTED_ROWS for t in at.table)
