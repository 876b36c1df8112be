"""What users type, upload or put in a link is shown as text, never as markup: Streamlit renders Markdown (links,
images, bold), some HTML and LaTeX in messages, captions and labels.

Found in the live app: a model id in a shared link (`?model=...`) rendered as Markdown inside the error, so a
link could show an image from any server (the browser fetched it) and a "log in again" link to any site.
Each route below sends Markdown, HTML and LaTeX through one input and checks the page's DOM: the text is
there literally, no link, image, bold or formula was made of it, and the browser fetched nothing outside.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlparse

import pytest

from .helpers import assert_no_error, choose, click, main_area, settle, type_into, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser

EVIL = "evil.example"
PAYLOAD = (
    f"**bold** [log in again](http://{EVIL}/login) ![x](http://{EVIL}/pixel.png) "
    f'<img src="http://{EVIL}/h.png"> <b>html</b> $x^2$'
)


def watch_requests(page) -> list[str]:
    """Requests the browser makes to the outside site (the app's own addresses may carry the payload)."""
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if urlparse(r.url).hostname == EVIL else None)
    return outside


def assert_shown_as_text(page, *literals: str) -> None:
    body = page.inner_text("body").replace("\u200b", "")  # addresses carry a zero-width space (escape())
    for literal in literals:
        assert literal in body, f"{literal!r} is not shown as text"
    main = page.locator('[data-testid="stMain"], [data-testid="stSidebar"]')
    # (The app's own page links carry the current query string, the payload included: only links and
    # images that lead to the outside site count.)
    outside = f'a[href^="http://{EVIL}"], a[href^="https://{EVIL}"], a[href^="//{EVIL}"], a[href^="javascript:"]'
    assert main.locator(outside).count() == 0, "a link was made"
    assert main.locator(f'img[src*="//{EVIL}"]').count() == 0, "an image was made"
    assert page.locator("b", has_text=re.compile(r"^html$")).count() == 0, "HTML was rendered"
    assert page.locator("strong", has_text=re.compile(r"^bold$")).count() == 0, "Markdown bold was rendered"
    assert page.locator(".katex", has_text=re.compile("x2")).count() == 0, "LaTeX was rendered"


def test_a_model_id_from_a_link_and_typed_in_the_box_is_text(server_url, page):
    outside = watch_requests(page)
    page.goto(f"{server_url}/text?model={quote(PAYLOAD)}")
    settle(page)
    wait_for_text(page, "Could not load")
    assert_shown_as_text(page, "**bold**", "<b>html</b>", "$x^2$", f"[log in again](http://{EVIL}/login)")
    page.goto(f"{server_url}/text")
    settle(page)
    choose(page, "Model", "Another hub id or local folder…")
    settle(page)
    type_into(page, "Hub id or folder", PAYLOAD)
    wait_for_text(page, "Could not load")
    assert_shown_as_text(page, "**bold**", "<b>html</b>", "$x^2$")
    assert outside == []
    assert_no_error(page)


def test_a_link_parameter_and_an_uploaded_file_name_are_text(server_url, page, tmp_path):
    outside = watch_requests(page)
    short = f"**bold** <b>html</b> $x^2$ [a](http://{EVIL}/)"  # a note quotes 60 characters of a value
    page.goto(f"{server_url}/vision?model=vit-tiny&sample={quote(short)}")
    settle(page)
    wait_for_text(page, "From the link:")
    assert_shown_as_text(page, short)
    click(main_area(page).get_by_text("Upload", exact=True))
    wait_for_url(page, "from=upload")
    settle(page)
    name = "**bold** <b>html<b> $x^2$ [log in again](javascript:alert(1)).svg"  # no "/" in a file name
    svg = tmp_path / name
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"></svg>')
    main_area(page).locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(svg))
    wait_for_text(page, "this is an SVG drawing")
    settle(page)
    assert_shown_as_text(page, name)
    assert outside == []
    assert_no_error(page)


def test_sentences_on_the_translation_and_distance_pages_are_text(server_url, page):
    outside = watch_requests(page)
    page.goto(f"{server_url}/seq2seq")
    settle(page)
    type_into(page, "Source sentence", PAYLOAD)
    wait_for_text(page, "Not in this model's vocabulary")
    settle(page)
    assert_shown_as_text(page, "**bold**", "<b>html</b>", "$x^2$")
    page.goto(f"{server_url}/distance")
    settle(page)
    type_into(page, "Sentences, one per line", f"{PAYLOAD}\n{'x' * 3}")
    wait_for_text(page, "2 sentence(s)")
    settle(page)
    assert outside == []
    assert_no_error(page)
