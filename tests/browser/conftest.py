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
from tformer_app.presenter import ROOM_COOKIES

from .helpers import NO_MOTION_JS, TIMEOUT_S, WATCH_SENDS_JS, settle
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


_server_logs: list[Path] = []  # the log of the server the browser tests use, once it started
_log_start = pytest.StashKey[int]()
SERVER_LOG_TAIL = 12_000  # characters of the server's log shown with a failed test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Note where the server's log stood when the test body began: a failure shows what the server said since."""
    if _server_logs:
        item.stash[_log_start] = _server_logs[0].stat().st_size
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed browser test carries the server's log written while it ran (what CI prints with the failure): a
    page that did not come is explained there (a model switched, a session replayed, a warning with its cause)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or not _server_logs or _log_start not in item.stash:
        return
    with open(_server_logs[0], errors="replace") as log:
        log.seek(item.stash[_log_start])
        said = log.read()
    report.sections.append(("the server's log during this test", said[-SERVER_LOG_TAIL:] or "(nothing)"))


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
    log = tmp_path_factory.mktemp("server") / "streamlit.log"
    with streamlit_server(log, **extra) as url:
        _server_logs.append(log)
        yield url
        _server_logs.remove(log)


@pytest.fixture(scope="session")
def browser():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (apt install chromium) to run browser tests")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # Playwright's `expect` waits 5 s by default: too short for a rerun on a busy CI machine (ci71 failed a
    # presenter test with the bar drawn just after 5 s), so its waits are the suite's, as every helper's are.
    playwright_api.expect.set_options(timeout=TIMEOUT_S * 1000)
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        _watching_sends(chromium)
        yield chromium
        chromium.close()


def _watching_sends(browser) -> None:
    """Every context and page opened in `browser` notes its messages to the server from its first one, for
    helpers.settle (WATCH_SENDS_JS), and draws without animations (NO_MOTION_JS): the tests open their own contexts
    (a projector, phones, a class)."""
    new_context, new_page = browser.new_context, browser.new_page

    def prepared(opened):
        for script in (WATCH_SENDS_JS, NO_MOTION_JS):
            opened.add_init_script(script)
        return opened

    def watched_context(*args, **kwargs):
        return prepared(new_context(*args, **kwargs))

    def watched_page(*args, **kwargs):
        return prepared(new_page(*args, **kwargs))

    browser.new_context, browser.new_page = watched_context, watched_page


PAGE_VIEWPORT = {"width": 1400, "height": 1000}
ROOM_COOKIE = ROOM_COOKIES[False]  # the width measured outside presenter mode


@pytest.fixture(scope="session")
def returning_cookies(browser, server_url) -> list[dict]:
    """The width cookie a browser of `PAGE_VIEWPORT` keeps after its first visit (ROOM_COOKIE: the main column's
    width, measured by presenter.KEYS_JS), from one first visit to Home.

    A first visit runs every page twice: once at a guessed width, once more when the browser has measured the
    column, and Chromium draws every chart twice. A returning browser (a student's second page load in a lecture)
    sends the cookie, and its first run is at the right width: 14 % less Chromium CPU and 20 % less time to a
    settled page for /text, /block and Home (3 loads each, 45.7 against 39.4 CPU-s). The `page` fixture's tests
    are about what a page does, so they run as a returning browser; the first visit and its measure stay tested by
    every test that opens a context of its own (test_layout's viewports, test_first_screen, the class tests)."""
    context = browser.new_context(viewport=PAGE_VIEWPORT)
    try:
        page = context.new_page()
        page.goto(server_url)
        settle(page)
        page.wait_for_function("n => document.cookie.includes(n + '=')", arg=ROOM_COOKIE, timeout=TIMEOUT_S * 1000)
        return [c for c in context.cookies() if c["name"] == ROOM_COOKIE]
    finally:
        context.close()


@pytest.fixture
def page(browser, returning_cookies):
    """A page in a browser context of its own, at PAGE_VIEWPORT, as a browser that has opened the app before."""
    context = browser.new_context(viewport=PAGE_VIEWPORT, accept_downloads=True)
    context.add_cookies(returning_cookies)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("TFORMER_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path
