"""Presenter mode on a 1280 x 720 projector: large type, one view at a time, no toolbar; keys that step through
heads and layers (a clicker's Page Up / Page Down too); a deck of saved views presented with the clicker,
exported and opened again."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from .helpers import CHART, assert_no_error, click, screenshot, settle, wait_for_count, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser


@pytest.fixture
def projector(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 720}, accept_downloads=True)
    page = context.new_page()
    yield page
    context.close()


def open_slides(page) -> None:
    """Open the sidebar's Slides panel unless it is open (it stays as the user left it, page to page)."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    add = sidebar.get_by_role("button", name="Add this view")
    if not add.is_visible():
        click(sidebar.get_by_text("Slides (", exact=False))
    add.wait_for(state="visible")


def press(page, key: str) -> None:
    """A key as a clicker or a keyboard sends it, with the page (not a text box) focused, once the page has
    answered the key before."""
    settle(page)
    page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"]').first.click()  # not a text box
    page.keyboard.press(key)


def test_presenter_mode_has_large_type_one_view_and_no_toolbar(server_url, projector, screenshots):
    page = projector
    page.goto(f"{server_url}/text?present=1")
    settle(page)
    wait_for_text(page, "Head view · layer 0")  # the first of the page's views, alone
    caption = page.locator('[data-testid="stMain"] [data-testid="stCaptionContainer"] p').first
    assert caption.evaluate("e => getComputedStyle(e).fontSize") == "20px"  # 1.5 x Streamlit's 14 px captions
    heading = page.get_by_role("heading", name="Head view · layer 0")
    assert float(heading.evaluate("e => getComputedStyle(e).fontSize")[:-2]) >= 1.5 * 22  # 1.5 x Streamlit's h3
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.count() == 0 or sidebar.bounding_box() is None or sidebar.bounding_box()["width"] < 100  # collapsed
    expect(page.locator('[data-testid="stToolbar"]')).to_be_hidden()
    expect(page.get_by_role("switch", name="Presenter mode")).to_be_checked()
    wait_for_count(page, CHART, 1)
    assert page.locator(CHART).count() == 1  # one view at a time
    assert "present=1" in page.url  # a link made now opens in presenter mode too
    page.get_by_role("heading", name="Head view · layer 0").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "presenter-text-1280x720.png"))  # what the projector shows
    screenshot(page, screenshots / "presenter-text-1280.png", width=1280)
    assert_no_error(page)


def test_keys_step_through_heads_and_layers(server_url, projector):
    page = projector
    page.goto(f"{server_url}/text?present=1&view=heatmap")
    settle(page)
    press(page, "ArrowRight")
    wait_for_url(page, "layer=0", "head=1")
    press(page, "ArrowDown")
    wait_for_url(page, "layer=1", "head=1")
    press(page, "PageDown")  # what a presentation clicker sends
    wait_for_url(page, "layer=1", "head=2")
    # One key at a time, each waited for: a key pressed while the page is still answering the one before
    # may be merged with it (Streamlit keeps the last click of a button per rerun).
    press(page, "ArrowLeft")
    wait_for_url(page, "layer=1", "head=1")
    press(page, "ArrowLeft")
    wait_for_url(page, "layer=1", "head=0")
    press(page, "ArrowLeft")  # before head 0: the last head of the layer before
    wait_for_url(page, "layer=0", "head=11")
    wait_for_text(page, "Heatmap · layer 0, head 11")
    assert_no_error(page)


def test_a_deck_of_views_is_presented_with_the_clicker_exported_and_opened_again(server_url, projector, tmp_path):
    page = projector
    page.goto(f"{server_url}/text?head=3")
    settle(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    open_slides(page)
    click(sidebar.get_by_role("button", name="Add this view"))
    wait_for_text(page, "Slides (1)")
    click(sidebar.get_by_role("link", name="Positional encoding"))
    page.wait_for_url("**/positional**")
    settle(page)
    open_slides(page)
    click(sidebar.get_by_role("button", name="Add this view"))
    wait_for_text(page, "Slides (2)")
    click(sidebar.get_by_role("button", name="Present from slide 1"))
    wait_for_url(page, "/text", "head=3")
    wait_for_text(page, "Slide 1 of 2")
    settle(page)
    press(page, "PageDown")  # the clicker moves the deck while it is presented
    page.wait_for_url("**/positional**")
    wait_for_text(page, "Slide 2 of 2")
    settle(page)
    with page.expect_download() as info:
        click(sidebar.get_by_role("button", name="Export the deck"))
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
