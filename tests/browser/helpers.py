"""Driving the app in Chromium on a busy machine: every wait is for a condition, never for a fixed time.

`settle` waits until Streamlit has finished the current run, so the next click lands on the page the
user would see. An assertion about what a run produced waits for exactly that (`wait_for_text`,
`wait_for_url`, `wait_for_count`): a run can finish before the browser has drawn every element it sent.
"""

from __future__ import annotations

import re
import time

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

CHART = '[data-testid="stVegaLiteChart"]'
IMAGE = '[data-testid="stImage"] img'
TIMEOUT_S = 90.0  # generous: two CPU cores shared with a model and a browser
# Streamlit's own record of the script's state on the app's root: "running" from the first message of a run (its
# status widget shows only after a while), "rerunRequested" while a click waits for the run it interrupts.
# The app's key handler (tformer_app.presenter.KEYS_JS) measures the page's main column once a run is over and
# sends it when it changed, which starts another run: until it has, the page is not settled.
RUNNING_JS = """() => ['running', 'rerunRequested'].includes(
  document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state'))
  || !window.__tformerKeys || !window.__tformerKeys.data || window.__tformerKeys.measuring"""


# What the page sent the server, and when a run last began: a widget's change (a click, a typed value, the width
# measured) goes out as a message, and the server's run starts a moment later, a moment in which the page still
# says "not running". `settle` counts such a message as a run under way until a run has begun after it; a message
# that starts no run counts until UNANSWERED_MS have passed (what the page's old one-second quiet window covered).
# Installed in every page the tests' browser opens, before its first message (an init script: the `browser`
# fixture, tests/browser/conftest.py). A page opened otherwise gets it at its first `settle`, which cannot know what
# the page sent before: it counts as having just sent a message (`WATCH_SENDS_LATE_JS`), so that first settle waits
# as the old quiet window did.
UNANSWERED_MS = 1000
WATCH_SENDS_JS = """(() => {
  if (window.__tformerSent) return;
  const seen = window.__tformerSent = { sent: 0, ran: 0 };
  const send = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) { seen.sent = Date.now(); return send.call(this, data); };
  new MutationObserver(() => {
    const state = document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state');
    if (state === 'running' || state === 'rerunRequested') seen.ran = Date.now();
  }).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-test-script-state'] });
})()"""
WATCH_SENDS_LATE_JS = f"""() => {{
  const late = !window.__tformerSent;
  {WATCH_SENDS_JS};
  if (late) window.__tformerSent.sent = Date.now();
}}"""
# The test browser's pages without CSS animations and transitions (an init script, tests/browser/conftest.py).
# Streamlit animates while a run is under way (the status widget's icon, skeletons, spinners), and a headless
# Chromium paints every frame of it in software: 10-19 % of Chromium's CPU for the same page loads (measured on 2
# cores: Home, /text and /block loaded 3 times each, 60.9 and 53.7 CPU-s with animations, 49.2 and 49.6 without).
# Nothing the tests assert moves: every wait is for a condition, and a transition that ends at once has ended.
# The benchmarks' own browsers keep them: they time what the user sees.
NO_MOTION_JS = """(() => {
  const still = () => {
    const style = document.createElement('style');
    style.textContent = '*, *::before, *::after { animation: none !important; transition: none !important; }';
    (document.head || document.documentElement).appendChild(style);
  };
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', still);
  else still();
})()"""
# Anything under way, read in one go: a run (`RUNNING_JS`), Streamlit's status widget, stale elements, a message
# sent and not yet answered by a run.
BUSY_JS = f"""() => ({RUNNING_JS})() || !!document.querySelector('[data-testid="stStatusWidget"]')
  || !!document.querySelector('[data-stale="true"]')
  || (window.__tformerSent && window.__tformerSent.sent >= window.__tformerSent.ran
      && Date.now() - window.__tformerSent.sent < {UNANSWERED_MS})"""
# How long nothing may be under way for the page to count as settled. Every run the page starts shows in BUSY_JS
# from the message that asks for it to its end, so this only has to outlast the moments between one condition's
# end and the next one's start (a run's end and the width measure it schedules, 150 ms later, which shows as
# `measuring` from the start): a few polls, not the second it was before the messages were watched.
QUIET_S = 0.3


def settle(page, timeout: float = TIMEOUT_S) -> None:
    """Wait until Streamlit has drawn the page and finished the current run.

    A page counts as drawn once it has its title (h1); it is finished when no run is in progress
    (the app's script state, no status widget, no stale elements), no width is waiting to be sent
    (`RUNNING_JS`) and no message the page sent is waiting for its run (`WATCH_SENDS_JS`), for QUIET_S.
    """
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=timeout * 1000)
    page.evaluate(WATCH_SENDS_LATE_JS)  # a page opened without the init script
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        if page.evaluate(BUSY_JS):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            return
        page.wait_for_timeout(100)  # polling interval of the condition above
    raise AssertionError("the page kept running")


def wait_for_count(page, selector: str, at_least: int, timeout: float = TIMEOUT_S) -> None:
    """Wait until the page holds at least `at_least` elements matching `selector`; a timeout says where the page
    stood (`page_state`)."""
    try:
        page.wait_for_function(
            "([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[selector, at_least], timeout=timeout * 1000
        )
    except PlaywrightTimeout as error:
        found = page.locator(selector).count()
        raise PlaywrightTimeout(
            f"{at_least} of {selector!r} did not show in {timeout:.0f} s ({found} there)\n{page_state(page)}"
        ) from error


def wait_for_text(page, text: str, timeout: float = TIMEOUT_S) -> None:
    """Wait until the page's visible text contains `text`; a timeout says where the page stood (`page_state`)."""
    try:
        page.wait_for_function("t => document.body.innerText.includes(t)", arg=text, timeout=timeout * 1000)
    except PlaywrightTimeout as error:
        raise PlaywrightTimeout(f"{text!r} did not show in {timeout:.0f} s\n{page_state(page)}") from error


# What a page shows and does at a moment, read in one go: a wait that failed says whether the page was still
# running (a run that never ended), idle with its last run's result (a click lost, or a run that drew something
# else), or disconnected.
STATE_JS = f"""() => ({{
  script: document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state'),
  busy: ({BUSY_JS})(),
  status: document.querySelector('[data-testid="stStatusWidget"]')?.innerText || '',
  stale: document.querySelectorAll('[data-stale="true"]').length,
  sent: window.__tformerSent ? Date.now() - window.__tformerSent.sent : null,
  ran: window.__tformerSent ? Date.now() - window.__tformerSent.ran : null,
  expanders: [...document.querySelectorAll('[data-testid="stSidebar"] details')].map(
    d => (d.querySelector('summary')?.innerText || '').trim() + (d.open ? ' (open)' : ' (closed)')),
  sidebar: (document.querySelector('[data-testid="stSidebarUserContent"]')
    || document.querySelector('[data-testid="stSidebar"]'))?.innerText || '(no sidebar)',
  main: document.querySelector('[data-testid="stMain"]')?.innerText || '(no main area)',
}})"""


def page_state(page, chars: int = 1500) -> str:
    """The page's address, Streamlit's script state, what is under way (ms since the last message sent and the
    last run seen), the sidebar's expanders and text, and the start of the main area's text."""
    try:
        state = page.evaluate(STATE_JS)
    except Exception as error:  # a closed or crashed page
        return f"the page could not be read ({type(error).__name__}: {error})"
    return (
        f"address: {page.url}\nscript: {state['script']} · busy: {state['busy']} · status widget: "
        f"{state['status']!r} · stale elements: {state['stale']} · ms since a message was sent: {state['sent']}, "
        f"since a run was seen: {state['ran']}\nsidebar's expanders: {state['expanders']}\n"
        f"sidebar: {state['sidebar'][:chars]}\nmain: {state['main'][:chars]}"
    )


def wait_for_url(page, *parts: str, timeout: float = TIMEOUT_S) -> None:
    """Wait until the address contains every one of `parts` (URL-encoded as the app writes them); a timeout says
    where the page stood (`page_state`)."""
    pattern = "".join(f"(?=.*{re.escape(p)})" for p in parts)
    try:
        expect(page).to_have_url(re.compile(pattern), timeout=timeout * 1000)
    except AssertionError as error:
        raise AssertionError(f"the address never held {parts} in {timeout:.0f} s\n{page_state(page)}") from error


def wait_for_step_at_least(page, step: int, timeout: float = TIMEOUT_S) -> int:
    """Wait until the encoder-decoder page shows "Step k of" with k >= step; returns k."""
    page.wait_for_function(
        "n => { const m = document.body.innerText.match(/Step (\\d+) of/); return m && Number(m[1]) >= n; }",
        arg=step,
        timeout=timeout * 1000,
    )
    return int(re.search(r"Step (\d+) of", page.inner_text("body")).group(1))


def describe(pages: dict[str, object], words: tuple[str, ...] = ()) -> str:
    """Each page's address and its lines that hold one of `words` (and its first heading): printed when a test of
    several browsers fails, so that CI's output says where each one stood."""
    told = []
    for name, page in pages.items():
        try:
            text = page.inner_text("body")  # type: ignore[attr-defined]
            heading = page.locator('[data-testid="stMain"] h1').first.inner_text(timeout=2000)  # type: ignore[attr-defined]
        except Exception as error:  # a closed or crashed page: say so, and go on with the others
            told.append(f"{name}: unreadable ({type(error).__name__})")
            continue
        lines = [line.strip() for line in text.splitlines() if any(w in line for w in words)]
        told.append(f"{name}: {page.url}\n  {heading}\n  " + "\n  ".join(dict.fromkeys(lines)))  # type: ignore[attr-defined]
    return "\n".join(told)


def assert_no_error(page) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()
    body = page.inner_text("body")
    assert "Traceback" not in body
    assert "Page not found" not in body


def main_area(page):
    """The page body without the sidebar: the sidebar has widgets of its own (a deck's "Upload" among them)."""
    return page.get_by_test_id("stMainBlockContainer")


def centre(locator) -> None:
    """Scroll the element to the middle of the window: at the top edge, Streamlit's sticky header covers it."""
    locator.evaluate("e => e.scrollIntoView({block: 'center', inline: 'nearest'})")


def click(locator) -> None:
    centre(locator)
    locator.click()


SENT_SINCE_JS = "t => !!window.__tformerSent && window.__tformerSent.sent >= t"


def press_button(button, attempts: int = 3, sent_within_s: float = 10.0) -> None:
    """Click one of the app's buttons (st.button; not a download button that ignores its click), and make sure
    the page sent the click to the server.

    A Streamlit button's click always goes out as a message (`WATCH_SENDS_JS` notes it). In a full run a click
    sent nothing: the lecturer's "Start a class session" was clicked (Playwright found the button visible, stable
    and on top), then the page sat idle for 90 s with the button still there and no message sent since before
    the click. Why the click reached no button is not known (a redraw of the sidebar between Playwright's check and
    its pointer is one candidate). A click that sent nothing changed nothing on the server, so it is made again,
    and said; one that sent a message is never repeated (a second "Ask" would be a second question). Playwright's
    click returns once the page has handled the pointer, and the button sends from that handler: the wait below
    only covers a page slow to run it."""
    page = button.page
    page.evaluate(WATCH_SENDS_LATE_JS)  # a page opened without the init script: from here on its messages count
    for attempt in range(attempts):
        before = page.evaluate("Date.now()")
        click(button)
        try:
            page.wait_for_function(SENT_SINCE_JS, arg=before, timeout=sent_within_s * 1000)
            return
        except PlaywrightTimeout:
            print(f"press: a click on {button} sent nothing in {sent_within_s:.0f} s (try {attempt + 1})", flush=True)
    raise AssertionError(f"{attempts} clicks on {button} sent nothing to the server\n{page_state(page)}")


def open_sidebar_panel(page, title: str, attempts: int = 3) -> None:
    """Open the sidebar's expander whose title holds `title` ("Class session", "Slides (") unless it is open, and
    wait until it is. A click on its title toggles it: clicked only while closed, since a second click (a test's
    guess from what was visible while a run redrew the sidebar) closes it again, and a button inside it is then
    never reached."""
    panel = page.get_by_test_id("stSidebar").locator("details").filter(has=page.locator("summary", has_text=title))
    for _ in range(attempts):
        if panel.evaluate("d => d.open"):
            return
        click(panel.locator("summary"))
        try:
            page.wait_for_function("d => d.open", arg=panel.element_handle(), timeout=10_000)
            return
        except PlaywrightTimeout:
            continue  # the click landed while a run redrew the sidebar: look again
    raise AssertionError(f"the sidebar's {title!r} panel did not open\n{page_state(page)}")


def start_class_session(lecturer) -> str:
    """On the lecturer's settled page: open the sidebar's Class session panel, start a session and wait for its
    count of students; returns the join code."""
    open_sidebar_panel(lecturer, "Class session")
    settle(lecturer)  # the panel's button is pressed on a page at rest, not during a run the opening started
    press_button(lecturer.get_by_role("button", name="Start a class session"))
    wait_for_text(lecturer, "0 students")
    return re.search(r"Join code ([A-Z2-9]{6})", lecturer.inner_text("body")).group(1)


def open_slides(page):
    """Open the sidebar (collapsed in presenter mode) and its Slides panel; returns the panel's "Add this view"
    button, once drawn."""
    sidebar = page.get_by_test_id("stSidebar")
    box = sidebar.bounding_box()
    if box is None or box["x"] + box["width"] <= 0:
        click(page.get_by_test_id("stExpandSidebarButton"))
    open_sidebar_panel(page, "Slides (")
    add = sidebar.get_by_role("button", name="Add this view")
    add.wait_for(state="visible")  # an open panel can still be drawing its button
    return add


def add_this_view(page, slides: int) -> None:
    """Press the Slides panel's "Add this view" (`open_slides`): waits until the deck has `slides` slides."""
    press_button(open_slides(page))
    wait_for_text(page, f"Slides ({slides})")


def choose(page, label: str, option: str | int, attempts: int = 5, kind: str = "stSelectbox") -> str:
    """Pick `option` (its text, or its place in the list from 0) in the selectbox (kind "stMultiSelect": the
    multiselect) labelled `label`; returns the option's text.

    The list opens on a click that lands on the box; a click during a scroll or a redraw can miss, so
    the click is repeated until the option is there to be picked.
    """
    box = page.locator(f'[data-testid="{kind}"]').filter(has=page.get_by_text(label, exact=True)).first
    if isinstance(option, int):
        wanted = page.get_by_role("option").nth(option)
    else:
        wanted = page.get_by_role("option", name=option, exact=True)
    for _ in range(attempts):
        centre(box)
        box.click()
        try:
            wanted.wait_for(state="visible", timeout=5000)
            break
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    text = wanted.inner_text()
    wanted.click()
    return text


def type_into(page, label: str, text: str, role: str = "textbox") -> None:
    """Replace the text of the input labelled `label` and submit it (Enter / Ctrl+Enter).

    role: "textbox" (text inputs and areas) or "spinbutton" (number inputs).
    """
    box = page.get_by_role(role, name=label, exact=True)
    centre(box)
    box.fill(text)
    box.press("Control+Enter" if box.evaluate("e => e.tagName") == "TEXTAREA" else "Enter")


def screenshot(page, path, width: int = 1400) -> None:
    """The whole page: Streamlit scrolls inside its main block, so the window is made as tall as it."""
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": width, "height": min(max(int(height), 1000), 16000)})
    # Charts redraw for the new size on the next animation frames.
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))")
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": 1000})
