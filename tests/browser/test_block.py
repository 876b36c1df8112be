"""The "Inside a block" page and the Vision page's "Patch embedding by hand" in a real browser: the page
draws its flow diagrams and charts, follows the layer and token choosers into the link, shows the check
against the model's next layer for MiniLM, the translator's decoder (cross-attention) and a ViT, and
answers a bad ε or an emptied cell of the LayerNorm example inline."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.core.hf_helpers import DEIT

from .helpers import (
    CHART,
    assert_no_error,
    centre,
    choose,
    screenshot,
    settle,
    type_into,
    wait_for_count,
    wait_for_text,
    wait_for_url,
)

pytestmark = pytest.mark.browser


def largest_difference(page) -> float:
    """The number in the page's check ("Largest difference over all dimensions")."""
    value = page.locator('[data-testid="stMetricValue"]').first
    expect(value).to_have_text(re.compile(r"\d"))
    return float(value.inner_text())


def test_block_page_follows_a_minilm_token_through_a_layer(server_url, page, screenshots):
    page.goto(f"{server_url}/block")
    settle(page)
    wait_for_text(page, "The check: the model's own next-layer input")
    wait_for_count(page, CHART, 7)  # two flows, attention weights, hidden units, norms, x̂, y
    assert largest_difference(page) <= 1e-5
    choose(page, "Layer", "2")
    wait_for_url(page, "layer=2")
    settle(page)
    choose(page, "Token", "2: cat")
    wait_for_url(page, "layer=2", "token=2")
    settle(page)
    wait_for_text(page, "Token 2 (cat) through encoder layer 2")
    wait_for_text(page, "of 1536 hidden units")
    assert largest_difference(page) <= 1e-5
    assert_no_error(page)
    screenshot(page, screenshots / "block-minilm.png")


def test_block_page_shows_the_translator_decoder_with_cross_attention(server_url, page, screenshots):
    page.goto(f"{server_url}/block?model=translator&stack=decoder&layer=1&token=3")
    settle(page)
    wait_for_text(page, "2. The cross-attention, Add & Norm")
    wait_for_text(page, "K and V from the encoder's output")
    wait_for_text(page, "The decoder reads the model's own translation")
    wait_for_count(page, CHART, 8)  # the cross-attention's weights besides the self-attention's
    assert largest_difference(page) <= 1e-5
    assert_no_error(page)
    screenshot(page, screenshots / "block-translator-decoder.png")


def test_block_page_shows_a_pre_norm_vit(server_url, page, screenshots):
    model = f"{DEIT.parent.name}/{DEIT.name}" if DEIT.is_dir() else "vit-tiny"
    page.goto(
        f"{server_url}/block?model={quote(model)}&layer=11&token=0"
        if DEIT.is_dir()
        else f"{server_url}/block?model=vit-tiny"
    )
    settle(page)
    wait_for_text(page, "1. LayerNorm, the self-attention, Add")
    wait_for_text(page, "This model (" + model)
    assert largest_difference(page) <= 1e-5
    assert_no_error(page)
    screenshot(page, screenshots / "block-vit.png")


def test_layer_norm_example_answers_bad_input_inline(server_url, page, screenshots):
    page.goto(f"{server_url}/block")
    settle(page)
    wait_for_text(page, "LayerNorm by hand")
    type_into(page, "ε", "0", role="spinbutton")
    wait_for_url(page, "eps=0.0")
    wait_for_text(page, "ε must be greater than 0")
    type_into(page, "ε", "0.001", role="spinbutton")
    wait_for_url(page, "eps=0.001")
    settle(page)
    wait_for_text(page, "Token, every number")  # drawn once the steps are computed
    # Empty the first number of the x table: the grid says which cell, the real model's part stays.
    grid = page.get_by_text("one row per token").locator("xpath=following::div[@data-testid='stDataFrame'][1]")
    for attempt in range(4):
        # The grid is a canvas: a click during a redraw or a scroll can land before the grid takes the keys,
        # so the edit is tried again until the page answers it.
        settle(page)
        centre(grid)
        box = grid.bounding_box()
        page.mouse.click(box["x"] + 90, box["y"] + 52)  # the first row's token cell
        page.keyboard.press("ArrowRight")
        page.keyboard.press("Delete")
        try:
            wait_for_text(page, "x, row 1, column x1: empty cell", timeout=30 if attempt < 3 else 90)
            break
        except PlaywrightTimeout:
            if attempt == 3:
                raise
            page.keyboard.press("Escape")
    settle(page)
    assert largest_difference(page) <= 1e-5
    assert_no_error(page)
    screenshot(page, screenshots / "block-layernorm-bad-cell.png")


def test_vision_page_patch_embedding_by_hand(server_url, page, screenshots):
    page.goto(f"{server_url}/vision?model=vit-tiny&pe=1")  # the section is opt-in
    settle(page)
    wait_for_text(page, "Patch embedding by hand")
    wait_for_text(page, "is a matrix product")  # the products themselves are in a table (a canvas)
    # Streamlit paints a new number box with its minimum for a moment before the value the page set: a change
    # sent in that moment would send the minimums of the other boxes too. Type once the boxes show the lecture's.
    for label, value in (("Image height", "8"), ("Image width", "8"), ("Kernels D", "2")):
        expect(page.get_by_role("spinbutton", name=label, exact=True)).to_have_value(value, timeout=60_000)
    type_into(page, "Patch size P", "3", role="spinbutton")
    wait_for_url(page, "pe_p=3")
    wait_for_text(page, "a patch size of 3 does not divide the 8 × 8 image")
    type_into(page, "Patch size P", "4", role="spinbutton")
    wait_for_url(page, "pe_p=4")
    settle(page)
    wait_for_text(page, "The same on vit-tiny: one patch of your picture")
    assert_no_error(page)
    screenshot(page, screenshots / "vision-patch-embedding.png")
