"""What a lecturer and a class see in a real browser: token boxes that follow the sentence, heads found in one
click, a thumbnail that selects its head and brings its views into sight."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from playwright.sync_api import expect

import tformer_core as tc
from tformer_views.overview import overview

from .helpers import CHART, assert_no_error, centre, press_button, settle, type_into, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser

TROPHY = "The trophy didn't fit in the suitcase because it was too big."


def box_value(page, label: str) -> str:
    """What a select box shows (its input's text), not what the server believes."""
    return page.get_by_role("combobox", name=label, exact=True).input_value()


def test_token_boxes_show_the_new_sentence_at_once(server_url, page):
    """After a new sentence the Query box read "10: it" (now "because") and the Key box "2: animal"."""
    page.goto(f"{server_url}/text?views=heatmap,why")
    settle(page)
    assert box_value(page, "Query token (the row being explained)") == "10: it"
    type_into(page, "Sentence", TROPHY)
    wait_for_url(page, "trophy")
    wait_for_text(page, "Why this weight · layer 3, head 1, query 11")
    settle(page)
    expect(page.get_by_role("combobox", name="Query token (the row being explained)", exact=True)).to_have_value(
        "11: it"
    )
    position, word = box_value(page, "Key token (the column)").split(": ", 1)
    tokens = tc.load_model("minilm", device="cpu").trace(TROPHY).tokens
    assert tokens[int(position)] == word  # the new sentence's token at that position, not "animal"
    assert_no_error(page)


def test_the_heads_linking_it_to_animal_are_one_click_away(server_url, page):
    page.goto(f"{server_url}/text")
    settle(page)
    wait_for_text(page, "Strongest heads for it → animal")
    assert "layer=3" in page.url and "head=1" in page.url  # the strongest, chosen as the page opens
    press_button(page.get_by_role("button", name="layer 5, head 11: 0.673"))  # the runner-up, one click away
    wait_for_url(page, "layer=5", "head=11")
    wait_for_text(page, "Heatmap · layer 5, head 11")
    settle(page)
    assert_no_error(page)


def test_a_thumbnail_selects_its_head_and_brings_its_views_into_sight(server_url, page):
    page.goto(f"{server_url}/text?views=head,heatmap,overview")
    settle(page)
    wait_for_text(page, "Click a thumbnail to select that head")
    chart = page.locator(CHART).nth(2)  # head view, heatmap, then the overview's thumbnails
    centre(chart)
    settle(page)
    box = chart.bounding_box()
    # Aim at the middle of thumbnail (layer 4, head 7), where the overview draws it (Vega pads charts by 5 px).
    sentence = "The animal didn't cross the street because it was too tired."
    picture = overview(tc.load_model("minilm", device="cpu").trace(sentence))
    left, top, right, bottom = picture.box(4, 7)
    width = Image.open(io.BytesIO(picture.png)).width
    scale = (box["width"] - 10) / width
    page.mouse.click(box["x"] + 5 + scale * (left + right) / 2, box["y"] + 5 + scale * (top + bottom) / 2)
    wait_for_url(page, "layer=4", "head=7")
    wait_for_text(page, "Head view · layer 4")
    heading = page.get_by_role("heading", name="Head view · layer 4")
    expect(heading).to_be_in_viewport(timeout=10_000)  # scrolled up to the chosen head's views
    assert_no_error(page)
