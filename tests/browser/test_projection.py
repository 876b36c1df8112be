"""The "Query–key space" view in a real browser: a link with views=...qk opens the Text attention page with the
Plotly chart drawn (queries and keys as points, token labels as text, the query's lines), in 2-D and in 3-D."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from .helpers import assert_no_error, click, main_area, screenshot, settle, wait_for_count, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser

PLOTLY = '[data-testid="stPlotlyChart"]'
SENTENCE = "The animal didn't cross the street because it <b>was</b> too tired."


def texts(locator) -> list[str]:
    """What SVG text elements show (innerText is for HTML)."""
    return locator.evaluate_all("elements => elements.map(e => e.textContent)")


def test_a_link_opens_the_query_key_space_in_2d_and_3d(server_url, page, screenshots):
    query = urlencode({"text": SENTENCE, "views": "head,qk", "layer": "2", "head": "5"})
    page.goto(f"{server_url}/text?{query}")
    settle(page)
    wait_for_text(page, "Query–key space · layer 2, head 5")
    wait_for_count(page, PLOTLY, 1)
    chart = page.locator(PLOTLY).first
    # Plotly has drawn its points: one group of markers per trace (3 lines, queries, keys, the chosen query).
    wait_for_count(page, f"{PLOTLY} .scatterlayer .trace", 6)
    wait_for_count(page, f"{PLOTLY} .scatterlayer .trace .points path", 2 * 23 + 1)
    # Token labels are text: MiniLM reads "<b>" as "<", "b", ">", and "<" is shown as itself (escaped for Plotly,
    # which would otherwise take "<b>..." as markup or drop it).
    labels = texts(chart.locator(".scatterlayer .textpoint text"))
    assert labels.count("<") == 2 * 2 and labels.count(">") == 2 * 2 and "tired" in labels  # queries and keys
    assert chart.locator(".scatterlayer .textpoint b").count() == 0  # no markup made of a token
    legend = texts(chart.locator(".legendtext"))
    assert legend[:2] == ["queries (23)", "keys (23)"] and legend[2] == "chosen query: it"
    wait_for_text(page, "PCA: the 23 queries and 23 keys of this head are 32-dimensional")
    assert_no_error(page)
    screenshot(page, screenshots / "qk-space-2d.png")
    # 3-D: the link follows, and Plotly draws a scene (WebGL) instead of the 2-D axes.
    click(main_area(page).get_by_text("3-D", exact=True))
    wait_for_url(page, "qk_dims=3")
    settle(page)
    wait_for_count(page, f"{PLOTLY} .gl-container", 1)
    assert_no_error(page)
    screenshot(page, screenshots / "qk-space-3d.png")
