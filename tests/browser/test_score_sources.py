"""Why this weight, from its sources, in a real browser: a click on a heatmap cell makes it the cell explained, and
its sources table follows (at a projector's 1280 x 720)."""

from __future__ import annotations

import time

import pytest

from .helpers import CHART, assert_no_error, settle, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser


def test_a_click_on_a_heatmap_cell_explains_that_cell_by_its_sources(server_url, page):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{server_url}/text?views=heatmap,why&layer=3&head=1&query=10&key=2")
    settle(page)
    wait_for_text(page, "Query side (through q of it)")
    wait_for_text(page, "Key side (through k of animal)")
    # The heatmap is SVG: Vega names each cell by its fields; "it" (row) against "street" (column).
    cell = page.locator(CHART).first.locator('path[aria-label*="query: it;"][aria-label*="key: street;"]').first
    cell.scroll_into_view_if_needed()
    box = cell.bounding_box()
    assert box is not None
    start = time.monotonic()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_for_url(page, "key=8")
    wait_for_text(page, "Key side (through k of street)")
    settle(page)
    print(f"click to settled at 1280x720: {time.monotonic() - start - 1.0:.2f} s (settle's quiet second left out)")
    assert "query=10" in page.url
    assert_no_error(page)
