"""Every page in a real browser: it loads, takes input, switches head, and shows no error.

What only a browser shows: the pages render client-side (charts, images, links), widgets respond
to typing and clicking, downloads arrive as files, and the URL carries the view.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from playwright.sync_api import expect

from .helpers import (
    CHART,
    assert_no_error,
    centre,
    choose,
    click,
    main_area,
    press_button,
    screenshot,
    settle,
    type_into,
    wait_for_count,
    wait_for_step_at_least,
    wait_for_text,
    wait_for_url,
)
from .server import streamlit_server

pytestmark = pytest.mark.browser


def test_home_links_to_every_page(server_url, page, screenshots):
    page.goto(server_url)
    settle(page)
    for title in ("Attention, step by step", "Positional encoding", "Text attention", "Mean attention distance"):
        wait_for_text(page, title)
    wait_for_text(page, "Device: CPU")
    expect(page.get_by_test_id("stAppDeployButton")).to_have_count(0)  # a class's server: no "Deploy" offer
    expect(page.get_by_test_id("stMainMenu")).to_have_count(1)  # the viewer's menu (settings, print) stays
    assert_no_error(page)
    screenshot(page, screenshots / "home.png")
    click(page.get_by_role("link", name="Text attention").first)
    page.wait_for_url(re.compile(r".*/text.*"))
    settle(page)
    wait_for_text(page, "Sentence")
    assert_no_error(page)


def test_a_shared_link_opened_first_on_a_fresh_server_shows_its_page_in_the_app(browser, tmp_path):
    """A lecturer starts the server and opens a link from the slides: the first session of the process."""
    with streamlit_server(tmp_path / "streamlit.log") as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/positional?n=20&d=16&base=100")
        settle(page)
        wait_for_text(page, "Device: CPU")  # the app's shell (sidebar) around the page
        expect(page.get_by_role("spinbutton", name="Positions", exact=True)).to_have_value("20")
        expect(page.locator("h1").first).to_contain_text("Positional encoding")
        assert_no_error(page)
        page.close()


def test_text_page_types_a_sentence_and_switches_head(server_url, page, screenshots):
    page.goto(f"{server_url}/text")
    settle(page)
    assert_no_error(page)
    type_into(page, "Sentence", "The cat sat on the mat because it was warm.")
    wait_for_url(page, "text=The+cat+sat+on+the+mat")
    settle(page)
    wait_for_text(page, "13 tokens")  # [CLS] the cat sat on the mat because it was warm . [SEP]
    choose(page, "Head", "5")
    wait_for_url(page, "head=5")  # the view is in the address, ready to share
    settle(page)
    wait_for_text(page, "Heatmap · layer 3, head 5")  # the page opened on the lecture's layer
    wait_for_count(page, CHART, 2)  # the views a lecture opens with: head view and heatmap
    assert_no_error(page)
    screenshot(page, screenshots / "text.png")
    # Opening the shared address in a second tab restores the view.
    shared = page.url
    other = page.context.new_page()
    other.goto(shared)
    settle(other)
    expect(other.get_by_role("textbox", name="Sentence", exact=True)).to_have_value(
        re.compile("The cat sat on the mat")
    )
    wait_for_text(other, "Heatmap · layer 3, head 5")
    assert "head=5" in other.url
    assert_no_error(other)
    other.close()


def test_charts_download_as_svg_and_png(server_url, page, tmp_path):
    page.goto(f"{server_url}/step-by-step")
    settle(page)
    wait_for_count(page, CHART, 1)
    # Our export buttons (Streamlit's own chart toolbar has a "Save as PNG" button of its own over each chart).
    svg_button = page.locator('[data-testid="stDownloadButton"]').filter(has_text="SVG").first
    with page.expect_download() as info:
        click(svg_button)
    svg = info.value
    assert svg.suggested_filename.endswith(".svg")
    path = tmp_path / "chart.svg"
    svg.save_as(path)
    assert ET.parse(path).getroot().tag.endswith("svg")
    # The PNG button beside the same chart.
    png_button = page.locator('[data-testid="stDownloadButton"]').filter(has_text="PNG").first
    with page.expect_download() as info:
        click(png_button)
    assert info.value.suggested_filename == svg.suggested_filename.replace(".svg", ".png")
    png = tmp_path / "chart.png"
    info.value.save_as(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_no_error(page)


def test_step_by_step_q_k_v_given_directly_match_pytorch(server_url, page, screenshots):
    """The lecture's F.scaled_dot_product_attention demo: Q, K, V typed in, PyTorch's own Z beside ours."""
    page.goto(f"{server_url}/step-by-step")
    settle(page)
    choose(page, "Numbers", "Q, K, V given: PyTorch's scaled_dot_product_attention demo")
    wait_for_url(page, "preset=sdpa")
    settle(page)
    wait_for_text(page, "F.scaled_dot_product_attention(query, key, value)")
    wait_for_text(page, "Largest difference from Z above")
    wait_for_count(page, CHART, 7)  # Q, K, V, QK^T, scaled, weights, Z
    # Pad the last key: the PyTorch conventions table opens with it.
    choose(page, "Padding tokens (hidden as keys)", "3: t3", kind="stMultiSelect")
    wait_for_url(page, "preset=sdpa", "pad=3")
    settle(page)
    wait_for_text(page, "attn_mask = ~key_padding_mask")
    page.keyboard.press("Escape")  # close the padding list before the screenshot
    assert_no_error(page)
    screenshot(page, screenshots / "step-by-step-sdpa.png")


def test_step_by_step_takes_a_real_sentence_and_switches_head(server_url, page, screenshots):
    page.goto(f"{server_url}/step-by-step")
    settle(page)
    wait_for_count(page, CHART, 7)  # Q, K, V, QK^T, scaled, weights, Z
    assert_no_error(page)
    screenshot(page, screenshots / "step-by-step.png")
    choose(page, "Numbers", "From a real model (minilm)")
    wait_for_url(page, "preset=real")
    settle(page)
    type_into(page, "Sentence", "A dog barks.")
    wait_for_url(page, "text=A+dog+barks.")
    settle(page)
    choose(page, "Head", "3")
    wait_for_url(page, "preset=real", "head=3", "text=A+dog+barks.")
    settle(page)
    wait_for_text(page, "Layer 0, head 3.")  # the note under the real model's numbers
    expect(page.get_by_role("textbox", name="Sentence", exact=True)).to_have_value("A dog barks.")
    wait_for_count(page, CHART, 7)
    assert_no_error(page)
    screenshot(page, screenshots / "step-by-step-real.png")


def test_positional_page_takes_a_sentence_and_a_base(server_url, page, screenshots):
    page.goto(f"{server_url}/positional")
    settle(page)
    type_into(page, "Base", "100", role="spinbutton")
    wait_for_url(page, "base=100")
    settle(page)
    type_into(page, "Sentence", "Where is the tea?")
    wait_for_url(page, "text=Where+is+the+tea")
    settle(page)
    wait_for_text(page, "ω_i = 1/100^(2i/d)")
    expect(page.get_by_role("textbox", name="Sentence", exact=True)).to_have_value("Where is the tea?")
    wait_for_text(page, "First 5 of 384 dimensions.")  # the sentence's embeddings are drawn
    wait_for_count(page, CHART, 6)
    assert_no_error(page)
    screenshot(page, screenshots / "positional.png")


def test_encoder_decoder_page_steps_switches_head_and_forces_a_target(server_url, page, screenshots):
    page.goto(f"{server_url}/seq2seq")
    settle(page)
    wait_for_text(page, "varo gros ta ga fluvo ta apu mise mik na wo kasas")
    type_into(page, "Source sentence", "the small cat sleeps near a river")
    wait_for_text(page, "mise mik ta ga fluvo na apu dormas")
    settle(page)
    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
    slider.focus()
    slider.press("ArrowRight")
    slider.press("ArrowRight")
    wait_for_url(page, "step=3")
    wait_for_text(page, "Step 3 of")
    settle(page)
    choose(page, "Head", "2")
    wait_for_url(page, "head=2")
    settle(page)
    wait_for_text(page, "Q, K and V · cross-attention, layer 1, head 2")
    wait_for_count(page, CHART, 6)
    assert_no_error(page)
    screenshot(page, screenshots / "seq2seq.png")
    # Play: one step per tick, in the browser, with nobody touching anything (from step 3, two ticks).
    press_button(page.get_by_role("button", name="▶ Play"))
    assert wait_for_step_at_least(page, 5) >= 5
    press_button(page.get_by_role("button", name="⏸ Pause"))
    settle(page)
    assert_no_error(page)
    type_into(
        page,
        "Target (optional): type a translation to see the attention for it instead of the model's own",
        "mise mik ta ga dormas",
    )
    wait_for_text(page, "Your target (teacher forcing)")
    wait_for_text(page, "agrees with it at")
    settle(page)
    assert_no_error(page)


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
    click(main_area(page).get_by_text("Upload", exact=True))
    wait_for_url(page, "from=upload")
    settle(page)
    main_area(page).locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(photo))
    wait_for_text(page, "What the model sees: top 5")
    wait_for_text(page, "Every head of layer")
    settle(page)
    choose(page, "Layer", "1")
    wait_for_url(page, "layer=1")
    settle(page)
    choose(page, "Head", "0")
    wait_for_url(page, "layer=1", "head=0")
    settle(page)
    assert_no_error(page)
    # Click a patch on the picture: it becomes the query.
    # The first chart after the heading: the patch embedding above it has a patch picker of its own.
    picker = page.locator(
        "xpath=//h2[contains(., 'Attention over the picture')]/following::*[@data-testid='stVegaLiteChart'][1]"
    )
    picker.evaluate("e => e.scrollIntoView({block: 'center'})")
    box = picker.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
    expect(page).to_have_url(re.compile(r"query=\d+"))
    wait_for_text(page, "query: patch")
    settle(page)
    click(page.get_by_text("max", exact=True))  # rollout head fusion
    wait_for_url(page, "fusion=max")
    settle(page)
    assert_no_error(page)
    _another_class_redraws_its_relevancy_alone(page, screenshots)
    screenshot(page, screenshots / "vision.png")


# The three pictures under the class explanations' heading.
EXPLAINED = (
    "xpath=//h3[contains(., 'Which patches explain a class')]/following::*[@data-testid='stImage'][position()<=3]"
)


def _another_class_redraws_its_relevancy_alone(page, screenshots) -> None:
    """Raw attention, rollout and relevancy side by side, one size, one row, each named under it; the top 5's
    second class: the relevancy drawn again for it, the other two as they were (they do not depend on the class)."""
    pictures = page.locator(f"{EXPLAINED}//img")
    captions = page.locator(f"{EXPLAINED}//*[@data-testid='stImageCaption']")
    wait_for_count(page, '[data-testid="stImage"] img', 3)
    boxes = [pictures.nth(i).bounding_box() for i in range(3)]
    assert max(b["width"] for b in boxes) - min(b["width"] for b in boxes) < 1.5 > abs(boxes[0]["y"] - boxes[2]["y"])
    assert boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"]
    names = [captions.nth(i).inner_text() for i in range(3)]
    assert names[0].startswith("Raw attention") and names[1].startswith("Rollout"), names
    first = [pictures.nth(i).get_attribute("src") for i in range(3)]
    label = choose(page, "Class to explain (the model's top 5)", 1).split(". ", 1)[1]
    wait_for_url(page, "explain=1")
    page.wait_for_function(
        "([sel, src]) => { const e = document.evaluate(sel, document, null, 7, null);"
        " return e.snapshotLength === 3 && e.snapshotItem(2).querySelector('img')?.src !== src; }",
        arg=[EXPLAINED.removeprefix("xpath="), first[2]],
        timeout=90_000,
    )
    wait_for_text(page, f"Relevancy for {label}")
    settle(page)
    assert [pictures.nth(i).get_attribute("src") for i in range(2)] == first[:2]
    centre(page.get_by_role("heading", name="Which patches explain a class? Attention, rollout and relevancy"))
    page.screenshot(path=str(screenshots / "vision-explain-second-class.png"))
    assert_no_error(page)


def test_mad_page_over_several_pictures(server_url, page, screenshots):
    page.goto(f"{server_url}/distance")
    settle(page)
    wait_for_text(page, "picture(s)")
    wait_for_text(page, "Text models, in tokens")
    click(page.get_by_text("Renormalise each row over the patches", exact=True))
    wait_for_url(page, "renorm=1")
    settle(page)
    wait_for_count(page, CHART, 2)
    assert_no_error(page)
    screenshot(page, screenshots / "distance.png")
