"""A deck kept on the server for the lecturer's browser, in Chromium on a 1280 x 720 projector in presenter mode: two
slides added, the page reloaded (the deck is back, the bar offers it, it is presented), the server restarted on the
same deck folder (back again, by the browser's cookie), and its link opened in another browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from .helpers import add_this_view, assert_no_error, click, press_button, settle, wait_for_text, wait_for_url
from .server import streamlit_server

pytestmark = pytest.mark.browser

BAR = ".st-key-tformer-bar"
SIDEBAR = '[data-testid="stSidebar"]'
PROJECTOR = {"width": 1280, "height": 720}


def deck_in_the_sidebar(page, n: int) -> None:
    """The sidebar's panel says the deck has n slides (drawn, whether the sidebar is open or not)."""
    expect(page.locator(SIDEBAR).get_by_text(f"Slides ({n})", exact=True)).to_have_count(1)


def present_from_the_bar(page) -> None:
    """The bar offers the deck of two; presented, its first slide opens, and the clicker reaches the second."""
    press_button(page.locator(BAR).get_by_role("button", name="Present the slides (2)"))
    wait_for_text(page, "Slide 1/2")  # the bar's
    wait_for_url(page, "/text", "head=3")
    settle(page)
    page.locator('[data-testid="stMain"] h1').first.click()  # the keyboard on the page, as a clicker's
    page.keyboard.press("PageDown")
    wait_for_text(page, "Slide 2/2")
    wait_for_url(page, "/positional")
    settle(page)


def test_a_deck_is_back_after_a_reload_and_a_restart_and_opens_by_its_link(browser, tmp_path):
    folder = str(tmp_path / "decks")
    context = browser.new_context(viewport=PROJECTOR)
    page = context.new_page()
    try:
        with streamlit_server(tmp_path / "first.log", TFORMER_DECK_DIR=folder) as url:
            page.goto(f"{url}/text?present=1&head=3")
            settle(page)
            add_this_view(page, 1)
            settle(page)
            click(page.locator(BAR).get_by_role("link", name="Positional", exact=True))
            wait_for_url(page, "/positional", "present=1")
            settle(page)
            add_this_view(page, 2)
            settle(page)
            page.wait_for_function("() => document.cookie.includes('tformer_deck=')")  # the page wrote it
            link = page.locator(SIDEBAR).get_by_test_id("stCode").first.inner_text()
            token = re.search(r"\?deck=([A-Za-z0-9_-]{32})", link).group(1)
            page.reload()  # a new session of the same browser: the deck comes back by the cookie
            settle(page)
            deck_in_the_sidebar(page, 2)
            present_from_the_bar(page)
            assert_no_error(page)
        with streamlit_server(tmp_path / "second.log", TFORMER_DECK_DIR=folder) as url:  # a restarted server
            page.goto(f"{url}/?present=1")  # (a cookie is the host's, whatever the port)
            settle(page)
            deck_in_the_sidebar(page, 2)
            present_from_the_bar(page)
            projector = browser.new_context(viewport=PROJECTOR).new_page()  # another browser, without the cookie
            projector.goto(f"{url}/text?present=1&head=3&deck={token}")
            settle(projector)
            deck_in_the_sidebar(projector, 2)
            expect(projector.locator(BAR).get_by_role("button", name="Present the slides (2)")).to_be_visible()
            assert "deck=" not in projector.url  # the token left the address bar
            projector.wait_for_function("() => document.cookie.includes('tformer_deck=')")  # it keeps the deck now
            assert_no_error(projector)
            projector.context.close()
    finally:
        context.close()
