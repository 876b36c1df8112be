"""Every page in a real browser: it loads, takes input, switches head, and shows no error.

What only a browser shows: the pages render client-side (charts, images, links), widgets respond
to typing and clicking, downloads arrive as files, and the URL carries the view.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .server import streamlit_server

pytestmark = pytest.mark.browser


def settle(page, timeout: float = 90.0) -> None:
    """Wait until Streamlit has drawn the page and finished the current run.

    A page counts as drawn once it has its title (h1); it is finished when no run is in progress
    (no status widget, no stale elements) for a full second.
    """
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        running = page.locator('[data-testid="stStatusWidget"]').count() > 0
        stale = page.locator('[data-stale="true"]').count() > 0
        if running or stale:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            return
        time.sleep(0.2)
    raise AssertionError("the page kept running")


def assert_no_error(page) -> None:
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()
    body = page.inner_text("body")
    assert "Traceback" not in body
    assert "Page not found" not in body


def screenshot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its main block, so the window is made as tall as it."""
    height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(max(int(height), 1000), 16000)})
    time.sleep(0.5)  # charts redraw for the new size
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})


def choose(page, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label`."""
    box = page.locator('[data-testid="stSelectbox"]').filter(has=page.get_by_text(label, exact=True)).first
    box.scroll_into_view_if_needed()  # a click that scrolls the page first may not open the list
    time.sleep(0.3)
    box.click()
    page.get_by_role("option", name=option, exact=True).click()


def type_into(page, label: str, text: str, role: str = "textbox") -> None:
    """Replace the text of the input labelled `label` and submit it (Enter / Ctrl+Enter).

    role: "textbox" (text inputs and areas) or "spinbutton" (number inputs).
    """
    box = page.get_by_role(role, name=label, exact=True)
    box.fill(text)
    box.press("Control+Enter" if box.evaluate("e => e.tagName") == "TEXTAREA" else "Enter")


def test_home_links_to_every_page(server_url, page, screenshots):
    page.goto(server_url)
    settle(page)
    assert_no_error(page)
    body = page.inner_text("body")
    for title in ("Attention, step by step", "Positional encoding", "Text attention"):
        assert title in body
    assert "Device: CPU" in body.replace("**", "")
    screenshot(page, screenshots / "home.png")
    page.get_by_role("link", name="Text attention").first.click()
    page.wait_for_url(re.compile(r".*/text.*"))
    settle(page)
    assert_no_error(page)


def test_a_shared_link_opened_first_on_a_fresh_server_shows_its_page_in_the_app(browser, tmp_path):
    """A lecturer starts the server and opens a link from the slides: the first session of the process."""
    with streamlit_server(tmp_path / "streamlit.log") as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/positional?n=20&d=16&base=100")
        settle(page)
        assert_no_error(page)
        body = page.inner_text("body")
        assert "Positional encoding" in body and "Device: CPU" in body.replace("**", "")  # the app's shell
        assert page.get_by_role("spinbutton", name="Positions", exact=True).input_value() == "20"
        page.close()


def test_text_page_types_a_sentence_and_switches_head(server_url, page, screenshots):
    page.goto(f"{server_url}/text")
    settle(page)
    assert_no_error(page)
    type_into(page, "Sentence", "The cat sat on the mat because it was warm.")
    settle(page)
    assert_no_error(page)
    assert "mat" in page.inner_text("body")
    choose(page, "Head", "5")
    settle(page)
    assert_no_error(page)
    assert "head=5" in page.url  # the view is in the address, ready to share
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 4
    assert page.locator('[data-testid="stImage"] img').count() >= 1  # the layers x heads overview
    screenshot(page, screenshots / "text.png")
    # Opening the shared address restores the view.
    shared = page.url
    other = page.context.new_page()
    other.goto(shared)
    settle(other)
    assert_no_error(other)
    assert "The cat sat on the mat" in other.get_by_role("textbox", name="Sentence", exact=True).input_value()
    assert "head=5" in other.url
    other.close()


def test_charts_download_as_svg_and_png(server_url, page, tmp_path):
    page.goto(f"{server_url}/step-by-step")
    settle(page)
    svg_button = page.get_by_role("button", name=re.compile("SVG")).first
    svg_button.scroll_into_view_if_needed()
    with page.expect_download() as info:
        svg_button.click()
    svg = info.value
    assert svg.suggested_filename.endswith(".svg")
    path = tmp_path / "chart.svg"
    svg.save_as(path)
    assert ET.parse(path).getroot().tag.endswith("svg")
    with page.expect_download() as info:
        page.get_by_role("button", name=re.compile("PNG")).first.click()
    png = tmp_path / "chart.png"
    info.value.save_as(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_no_error(page)


def test_step_by_step_takes_a_real_sentence_and_switches_head(server_url, page, screenshots):
    page.goto(f"{server_url}/step-by-step")
    settle(page)
    assert_no_error(page)
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 7
    screenshot(page, screenshots / "step-by-step.png")
    choose(page, "Numbers", "From a real model (minilm)")
    settle(page)
    type_into(page, "Sentence", "A dog barks.")
    settle(page)
    choose(page, "Head", "3")
    settle(page)
    assert_no_error(page)
    assert "preset=real" in page.url and "head=3" in page.url
    assert "text=A+dog+barks." in page.url
    screenshot(page, screenshots / "step-by-step-real.png")


def test_positional_page_takes_a_sentence_and_a_base(server_url, page, screenshots):
    page.goto(f"{server_url}/positional")
    settle(page)
    assert_no_error(page)
    type_into(page, "Base", "100", role="spinbutton")
    settle(page)
    type_into(page, "Sentence", "Where is the tea?")
    settle(page)
    assert_no_error(page)
    assert "base=100" in page.url
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 6
    assert "tea" in page.inner_text("body")
    screenshot(page, screenshots / "positional.png")


def test_encoder_decoder_page_steps_switches_head_and_forces_a_target(server_url, page, screenshots):
    page.goto(f"{server_url}/seq2seq")
    settle(page)
    assert_no_error(page)
    assert "varo gros ta ga fluvo ta apu mise mik na wo kasas" in page.inner_text("body")
    type_into(page, "Source sentence", "the small cat sleeps near a river")
    settle(page)
    assert_no_error(page)
    assert "mise mik ta ga fluvo na apu dormas" in page.inner_text("body")
    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
    slider.focus()
    slider.press("ArrowRight")
    slider.press("ArrowRight")
    settle(page)
    assert "step=3" in page.url and "Step 3 of" in page.inner_text("body")
    choose(page, "Head", "2")
    settle(page)
    assert_no_error(page)
    assert "head=2" in page.url and "masked self-attention, layer 1, head 2" in page.inner_text("body") or \
        page.locator('[data-testid="stVegaLiteChart"]').count() >= 6  # fmt: skip
    screenshot(page, screenshots / "seq2seq.png")
    # Play: one step per tick, in the browser, with nobody touching anything.
    page.get_by_role("button", name="▶ Play").click()
    time.sleep(4.5)
    shown = int(re.search(r"Step (\d+) of", page.inner_text("body")).group(1))
    assert shown >= 5  # from step 3, at least two ticks of 1.2 s
    page.get_by_role("button", name="⏸ Pause").click()
    settle(page)
    assert_no_error(page)
    type_into(page, "Target (optional): type a translation to see the attention for it instead of the model's own",
              "mise mik ta ga dormas")  # fmt: skip
    settle(page)
    assert_no_error(page)
    body = page.inner_text("body")
    assert "Your target (teacher forcing)" in body and "agrees with it at" in body


def test_vision_page_upload_layer_head_patch_click_and_rollout(server_url, page, screenshots, tmp_path):
    from urllib.parse import quote

    from tests.core.hf_helpers import DEIT, IMAGES

    if DEIT.is_dir():
        page.goto(f"{server_url}/vision?model={quote(str(DEIT))}")
        photo = IMAGES / "dogbird.png"
    else:  # a user's clone: the bundled vit-tiny and a generated picture
        page.goto(f"{server_url}/vision?model=vit-tiny")
        photo = tmp_path / "square.png"
        from PIL import Image, ImageDraw

        picture = Image.new("RGB", (64, 64), (30, 30, 30))
        ImageDraw.Draw(picture).rectangle((16, 16, 48, 48), fill=(250, 200, 0))
        picture.save(photo)
    settle(page)
    assert_no_error(page)
    page.get_by_text("Upload", exact=True).click()
    settle(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(photo))
    settle(page)
    assert_no_error(page)
    body = page.inner_text("body")
    assert "What the model sees: top 5" in body and "Every head of layer" in body
    choose(page, "Layer", "1")
    settle(page)
    choose(page, "Head", "0")
    settle(page)
    assert_no_error(page)
    assert "layer=1" in page.url and "head=0" in page.url
    # Click a patch on the picture: it becomes the query.
    picker = page.locator('[data-testid="stVegaLiteChart"]').first
    picker.scroll_into_view_if_needed()
    box = picker.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
    settle(page)
    assert_no_error(page)
    assert re.search(r"query=\d+", page.url) and "query: patch" in page.inner_text("body")
    page.get_by_text("max", exact=True).click()  # rollout head fusion
    settle(page)
    assert_no_error(page)
    assert "fusion=max" in page.url
    screenshot(page, screenshots / "vision.png")


def test_mad_page_over_several_pictures(server_url, page, screenshots):
    page.goto(f"{server_url}/distance")
    settle(page)
    assert_no_error(page)
    body = page.inner_text("body")
    assert "picture(s)" in body and "Text models, in tokens" in body
    page.get_by_text("Renormalise each row over the patches", exact=True).click()
    settle(page)
    assert_no_error(page)
    assert "renorm=1" in page.url
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 2
    screenshot(page, screenshots / "distance.png")
