"""A real Streamlit server and a real headless Chromium for the browser tests.

The browser is Debian's chromium (/usr/bin/chromium, or $TFORMER_CHROMIUM), driven by
Playwright; `.ci/run` installs it with apt. Without it, these tests skip and say why.
Screenshots go to $TFORMER_SCREENSHOTS when set (to look at the pages), else to a temp folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.core.hf_helpers import DEIT, IMAGES

from .helpers import WATCH_SENDS_JS
from .server import streamlit_server

HERE = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("TFORMER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/browser is a browser test, whether or not its file says so: `-m "not browser"` (the
    fast tier) must leave out all of them, as each needs the server and Chromium."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def server_url(tmp_path_factory, smollm2_if_installed):
    """One server for the browser tests (sessions of its own for each page), its decks in a folder of its own;
    smollm2 converted before it starts (tests/conftest.py), rather than in its background as the first pages load."""
    extra = {"TFORMER_DECK_DIR": str(tmp_path_factory.mktemp("decks"))}
    if DEIT.is_dir():  # CI has ../shared: the real DeiT-Tiny and the photos are offered by the vision pages
        extra |= {"TFORMER_MODEL_DIRS": str(DEIT.parent), "TFORMER_IMAGE_DIRS": str(IMAGES)}
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log", **extra) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt install chromium) to run browser tests")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        _watching_sends(chromium)
        yield chromium
        chromium.close()


def _watching_sends(browser) -> None:
    """Every context and page opened in `browser` notes its messages to the server from its first one, for
    helpers.settle (WATCH_SENDS_JS): the tests open their own contexts (a projector, phones, a class)."""
    new_context, new_page = browser.new_context, browser.new_page

    def watched_context(*args, **kwargs):
        context = new_context(*args, **kwargs)
        context.add_init_script(WATCH_SENDS_JS)
        return context

    def watched_page(*args, **kwargs):
        page = new_page(*args, **kwargs)
        page.add_init_script(WATCH_SENDS_JS)
        return page

    browser.new_context, browser.new_page = watched_context, watched_page


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("TFORMER_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
