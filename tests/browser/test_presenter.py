"""Presenter mode on a 1280 x 720 projector: large type, one view at a time, no toolbar; a slim bar with every page,
the slides and the way out (mouse, Tab and Enter, Esc, Shift+P); keys that step through heads and layers and show
the head they step to; a deck of saved views presented with a clicker (Page Up / Page Down), keys pressed during a
slide change adding up; exported and opened again."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from .helpers import (
    CHART,
    IMAGE,
    add_this_view,
    assert_no_error,
    click,
    open_slides,
    press_button,
    screenshot,
    settle,
    wait_for_count,
    wait_for_text,
    wait_for_url,
)

pytestmark = pytest.mark.browser

PAGE_NAMES = (
    "Home",
    "Step by step",
    "Positional",
    "Block",
    "Enc-dec",
    "Vision",
    "Distance",
    "Heads",
    "Train",
)  # and Text
BAR = ".st-key-tformer-bar"
# The text of the focused element when it is in the bar (its last line: a link's icon comes first), else "".
FOCUSED_IN_BAR = f"""() => {{
  const e = document.activeElement;
  return e && e.closest('{BAR}') ? e.innerText.trim().split('\\n').pop().trim() : '';
}}"""


@pytest.fixture
def projector(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 720}, accept_downloads=True)
    page = context.new_page()
    yield page
    context.close()


def focus_page(page) -> None:
    """Put the keyboard on the page itself (not a text box): a click on the page's title."""
    page.locator('[data-testid="stMain"] h1').first.click()


def press(page, key: str) -> None:
    """A key as a clicker or a keyboard sends it, with the page (not a text box) focused, once the page has
    answered the key before."""
    settle(page)
    focus_page(page)
    page.keyboard.press(key)


def press_in_time(page, keys: list[str], apart_ms: int) -> None:
    """Keys pressed `apart_ms` apart whatever the page is doing (a lecturer at a clicker): the spacing is the input
    being tested, so it is kept by the clock, not by waiting for the page."""
    for i, key in enumerate(keys):
        if i:
            page.wait_for_timeout(apart_ms)
        page.keyboard.press(key)


def sidebar_width(page) -> float:
    box = page.locator('[data-testid="stSidebar"]').bounding_box()
    return 0.0 if box is None else max(box["width"] + min(box["x"], 0), 0.0)


def chart_picture(page) -> bytes:
    return page.locator(CHART).first.screenshot()


def test_presenter_mode_opens_on_the_head_view_and_a_key_shows_the_next_head(server_url, projector, screenshots):
    page = projector
    page.goto(f"{server_url}/text?present=1")
    settle(page)
    # The lecture's question answered on the first screen: the head linking "it" to "animal", alone, whole.
    heading = page.get_by_role("heading", name="Head view · layer 3, head 1")
    expect(heading).to_be_visible()
    assert float(heading.evaluate("e => getComputedStyle(e).fontSize")[:-2]) >= 1.5 * 22  # 1.5 x Streamlit's h3
    wait_for_count(page, CHART, 1)
    assert page.locator(CHART).count() == 1  # one view at a time
    box = page.locator(CHART).first.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= 720, box  # the whole view on the first screen
    caption = page.get_by_text("Line opacity = weight", exact=False)
    assert caption.evaluate("e => getComputedStyle(e).fontSize") == "20px"  # 1.5 x Streamlit's 14 px captions
    expect(page.locator('[data-testid="stToolbarActions"]')).to_be_hidden()
    expect(page.locator('[data-testid="stAppDeployButton"]')).to_have_count(0)
    assert sidebar_width(page) < 100  # collapsed
    assert "present=1" in page.url  # a link made now opens in presenter mode too
    page.screenshot(path=str(screenshots / "presenter-text-1280x720.png"))  # what the projector shows
    before = chart_picture(page)
    press(page, "ArrowRight")
    wait_for_url(page, "layer=3", "head=2")
    expect(page.get_by_role("heading", name="Head view · layer 3, head 2")).to_be_visible()
    settle(page)
    # The picture shows the head stepped to (in colour over the others), not the same twelve heads.
    page.wait_for_function(f"() => document.querySelector('{CHART} canvas, {CHART} svg')")
    assert chart_picture(page) != before
    screenshot(page, screenshots / "presenter-text-1280.png", width=1280)
    assert_no_error(page)


@pytest.mark.parametrize(
    "path, pictures, idea",
    [("mae", 4, "The encoder sees only a quarter of the patches"), ("detr", 2, "Each object query ends as one box")],
)
def test_the_mae_and_detr_views_are_whole_on_a_projectors_first_screen(
    server_url, projector, screenshots, path, pictures, idea
):
    """The bundled models offline: the settings folded away, the key idea in one line, then the pictures."""
    page = projector
    page.goto(f"{server_url}/{path}?present=1")
    settle(page)
    wait_for_count(page, IMAGE, pictures)
    expect(page.get_by_text(idea, exact=False)).to_be_visible()
    for i in range(pictures):
        box = page.locator(IMAGE).nth(i).bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= 720, box
    page.screenshot(path=str(screenshots / f"presenter-{path}-1280x720.png"))
    assert_no_error(page)


def test_keys_step_through_heads_and_layers(server_url, projector):
    page = projector
    page.goto(f"{server_url}/text?present=1&view=heatmap&layer=0&head=0")
    settle(page)
    press(page, "ArrowRight")
    wait_for_url(page, "layer=0", "head=1")
    press(page, "ArrowDown")
    wait_for_url(page, "layer=1", "head=1")
    press(page, "PageDown")  # what a presentation clicker sends (no deck is being presented)
    wait_for_url(page, "layer=1", "head=2")
    press(page, "ArrowLeft")
    wait_for_url(page, "layer=1", "head=1")
    press(page, "ArrowLeft")
    wait_for_url(page, "layer=1", "head=0")
    press(page, "ArrowLeft")  # before head 0: the last head of the layer before
    wait_for_url(page, "layer=0", "head=11")
    wait_for_text(page, "Heatmap · layer 0, head 11")
    assert_no_error(page)


def test_presenter_mode_is_left_and_every_page_reached_by_mouse_and_by_keyboard(server_url, projector):
    page = projector
    page.goto(f"{server_url}/text?present=1")
    settle(page)
    bar = page.locator(BAR)
    for name in PAGE_NAMES:
        expect(bar.get_by_role("link", name=name, exact=True)).to_be_visible()
    expect(bar.get_by_role("button", name="Leave")).to_be_visible()
    # By keyboard: Tab from the top of the page reaches every page's link and the way out.
    page.locator("body").focus()
    reached = []  # what each Tab focuses: the bar's links and buttons by their text, anything else as ""
    for _ in range(60):
        page.keyboard.press("Tab")
        reached.append(page.evaluate(FOCUSED_IN_BAR))
        if "Leave" in reached:
            break
    assert all(name in reached for name in PAGE_NAMES) and "Leave" in reached, reached
    page.locator("body").focus()
    for _ in range(60):  # Tab to the link, then Enter
        page.keyboard.press("Tab")
        if page.evaluate(FOCUSED_IN_BAR) == "Step by step":
            break
    page.keyboard.press("Enter")
    wait_for_url(page, "/step-by-step", "present=1")
    settle(page)
    # By mouse: another page, presenter mode kept.
    click(page.locator(BAR).get_by_role("link", name="Block", exact=True))
    wait_for_url(page, "/block", "present=1")
    settle(page)
    # Esc leaves presenter mode: the sidebar comes back, the bar goes, links no longer carry it.
    press(page, "Escape")
    expect(page.locator(BAR)).to_have_count(0)
    page.wait_for_function("() => !location.search.includes('present=1')")
    page.wait_for_function("() => document.querySelector('[data-testid=\"stSidebar\"]').getBoundingClientRect().x >= 0")
    expect(page.get_by_role("switch", name="Presenter mode")).not_to_be_checked()
    # Shift+P turns it on again, and off; so does the bar's button.
    press(page, "Shift+P")
    wait_for_url(page, "present=1")
    expect(page.locator(BAR)).to_be_visible()
    press_button(page.locator(BAR).get_by_role("button", name="Leave"))
    expect(page.locator(BAR)).to_have_count(0)
    press(page, "Shift+P")
    expect(page.locator(BAR)).to_be_visible()
    press(page, "Shift+P")
    expect(page.locator(BAR)).to_have_count(0)
    assert_no_error(page)


def make_deck(page, server_url: str) -> None:
    """Three slides: Text attention on layer 2, head 3; Attention, step by step; Inside a block."""
    page.goto(f"{server_url}/text?layer=2&head=3")
    settle(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    for n, going_to in ((1, "Attention, step by step"), (2, "Inside a block"), (3, None)):
        add_this_view(page, n)
        if going_to:
            click(sidebar.get_by_role("link", name=going_to))
            settle(page)


def on_slide(page, n: int) -> None:
    """The deck shows slide n of 3, its page with the view its link holds, and stays there."""
    path, extra = {1: ("/text", ("layer=2", "head=3")), 2: ("/step-by-step", ()), 3: ("/block", ())}[n]
    wait_for_text(page, f"Slide {n} of 3")
    wait_for_url(page, path, *extra)
    settle(page)
    assert f"Slide {n}/3" in page.locator(BAR).inner_text()
    wait_for_url(page, path, *extra)


def test_the_clicker_steps_a_deck_in_presenter_mode_and_fast_keys_add_up(server_url, projector):
    page = projector
    make_deck(page, server_url)
    press(page, "Shift+P")  # presenter mode: the deck is in the bar
    press_button(page.locator(BAR).get_by_role("button", name="Present the slides (3)"))
    on_slide(page, 1)
    press(page, "PageDown")
    on_slide(page, 2)
    press(page, "PageUp")
    on_slide(page, 1)
    # Keys pressed while a slide is still coming: the deck ends where they say.
    focus_page(page)
    press_in_time(page, ["PageDown", "PageUp"], 400)
    on_slide(page, 1)
    focus_page(page)
    press_in_time(page, ["PageDown", "PageDown", "PageUp", "PageUp"], 250)
    on_slide(page, 1)
    focus_page(page)
    press_in_time(page, ["PageDown", "PageDown", "PageDown"], 250)  # one past the last: the last
    on_slide(page, 3)
    press_button(page.locator(BAR).get_by_role("button", name="◀"))  # the bar's buttons, by mouse
    on_slide(page, 2)
    assert_no_error(page)


def test_a_deck_of_views_is_presented_with_the_clicker_exported_and_opened_again(server_url, projector, tmp_path):
    page = projector
    page.goto(f"{server_url}/text?head=3")
    settle(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    add_this_view(page, 1)
    click(sidebar.get_by_role("link", name="Positional encoding"))
    page.wait_for_url("**/positional**")
    settle(page)
    add_this_view(page, 2)
    press_button(sidebar.get_by_role("button", name="Present from slide 1"))
    wait_for_url(page, "/text", "head=3")
    wait_for_text(page, "Slide 1 of 2")
    press(page, "PageDown")  # the clicker moves the deck while it is presented, presenter mode or not
    page.wait_for_url("**/positional**")
    wait_for_text(page, "Slide 2 of 2")
    settle(page)
    with page.expect_download() as info:
        click(sidebar.get_by_role("button", name="Export the deck"))  # on_click="ignore": sends nothing
    path = tmp_path / "deck.json"
    info.value.save_as(path)
    deck = json.loads(path.read_text())
    assert [s["page"] for s in deck["slides"]] == ["text", "positional"] and "head=3" in deck["slides"][0]["query"]
    # Another browser (a lecturer's laptop) opens the file: the same two slides.
    other = page.context.browser.new_page(viewport={"width": 1280, "height": 720})
    other.goto(server_url)
    settle(other)
    side = other.locator('[data-testid="stSidebar"]')
    open_slides(other)
    side.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    wait_for_text(other, "Slides (2)")
    assert_no_error(other)
    other.close()
