"""Home on a 1280 x 720 projector, as the app opens: the lecturer's three steps (present, a deck, a class session) and
the three pages to start with, each with its picture, lie on the first screen, nothing scrolled."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tformer_app import home

from .helpers import IMAGE, assert_no_error, main_area, screenshot, settle, wait_for_text

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 720
# Every picture drawn, and at least twice as many pixels across as CSS pixels (sharp on a 2x screen).
PICTURES_DRAWN_JS = """
(n) => {
  const images = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stImage"] img')];
  return images.length >= n && images.every(i => i.complete && i.naturalWidth >= 2 * i.clientWidth - 1);
}
"""


def test_the_lecturers_steps_and_the_pages_to_start_with_are_on_the_first_screen(server_url, browser, screenshots):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    try:
        page.goto(server_url)
        wait_for_text(page, "Start a class session")
        settle(page)
        page.wait_for_function(PICTURES_DRAWN_JS, arg=len(home.PICTURES))
        assert_no_error(page)
        main = main_area(page)
        on_screen = {
            "present": main.locator("p", has_text="Shift+P"),
            "deck": main.locator("p", has_text="Add this view"),
            "class session": main.locator("p", has_text="Start a class session"),
        }
        for start in home.START:  # the first link of that name: the guide's come below, in a tab
            on_screen[start.title] = main.get_by_role("link", name=start.title, exact=True)
        for name, picture in home.PICTURES.items():
            on_screen[f"picture {name}"] = main.get_by_alt_text(picture.alt, exact=True)
        for name, where in on_screen.items():
            expect(where.first).to_be_visible()
            box = where.first.bounding_box()
            assert box is not None and 0 <= box["y"] <= box["y"] + box["height"] <= HEIGHT, f"{name} is at {box}"
        assert main.locator(IMAGE).count() == len(home.PICTURES)
        page.screenshot(path=str(screenshots / "home-first-screen-1280x720.png"))
        screenshot(page, screenshots / "home-1280.png", width=WIDTH)
    finally:
        context.close()
