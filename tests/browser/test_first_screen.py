"""A lecture on a 1280 x 720 projector in presenter mode: what a key changes is on the first screen, the settings
folded away do not swallow the keys (an uploaded picture survives the arrows), and the bar reaches every page
without scrolling."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.core.hf_helpers import DEIT, IMAGES

from .helpers import CHART, add_this_view, assert_no_error, click, press_button, settle, wait_for_text, wait_for_url

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1280, 720
BAR_PAGES = ".st-key-tformer-bar-pages"
TOP = ".st-key-tformer-top"
# The bar's labels (tformer_app.presenter.SHORT_TITLES), as a lecturer reads them.
BAR_LABELS = (
    "Home",
    "Before",
    "Step by step",
    "Positional",
    "Block",
    "Text",
    "Enc-dec",
    "Vision",
    "Distance",
    "Shift",
    "MAE",
    "DETR",
    "Heads",
    "Train",
)


@pytest.fixture
def projector(browser):
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    yield page
    context.close()


def vision_model() -> str:
    """The real DeiT-Tiny where ../shared has it (CI), else the bundled vit-tiny (a user's clone)."""
    return "models%2Fdeit-tiny-patch16-224" if DEIT.is_dir() else "vit-tiny"


def press(page, key: str) -> None:
    """A key with the page (its title) focused, as a clicker sends it."""
    settle(page)
    page.locator('[data-testid="stMain"] h1').first.click()
    page.keyboard.press(key)


def on_first_screen(locator) -> None:
    """The whole element inside the 1280 x 720 window, the page not scrolled."""
    locator.wait_for(state="visible")
    box = locator.bounding_box()
    assert box is not None
    assert box["y"] >= 0 and box["y"] + box["height"] <= HEIGHT, box
    assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, box
    assert locator.page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollTop") == 0


def test_text_attention_key_shows_the_next_head_on_the_first_screen(server_url, projector):
    page = projector
    page.goto(f"{server_url}/text?present=1")
    settle(page)
    idea = page.locator(TOP)
    expect(idea).to_contain_text("it → animal")  # the lecture's key idea, one line below the title
    on_first_screen(idea)
    assert idea.bounding_box()["height"] < 60  # one line
    press(page, "ArrowRight")
    wait_for_url(page, "layer=3", "head=2")
    settle(page)
    on_first_screen(page.get_by_role("heading", name="Head view · layer 3, head 2"))
    on_first_screen(page.locator(CHART).first)
    expect(idea).to_contain_text("Layer 3, head 2")
    assert_no_error(page)


def test_vision_keys_step_the_attention_over_the_picture_on_the_first_screen(server_url, projector):
    page = projector
    page.goto(f"{server_url}/vision?present=1&model={vision_model()}")
    settle(page)
    on_first_screen(page.locator(CHART).first)  # the picture with the attention over it
    top = page.locator(TOP)
    text = top.inner_text()
    layer = int(text.split("Layer ")[1].split(",")[0])
    press(page, "ArrowLeft")
    wait_for_url(page, f"layer={layer - 1}")
    settle(page)
    expect(top).to_contain_text(f"Layer {layer - 1}, mean of the heads")
    on_first_screen(top)
    on_first_screen(page.locator(CHART).first)
    press(page, "ArrowDown")
    wait_for_url(page, "head=0")
    settle(page)
    expect(top).to_contain_text(f"Layer {layer - 1}, head 0")
    on_first_screen(page.locator(CHART).first)
    assert_no_error(page)


def test_encoder_decoder_keys_step_the_decoding_on_the_first_screen(server_url, projector):
    page = projector
    page.goto(f"{server_url}/seq2seq?present=1")
    settle(page)
    wait_for_text(page, "Step 1 of")
    press(page, "ArrowRight")
    wait_for_url(page, "step=2")
    wait_for_text(page, "Step 2 of")
    settle(page)
    on_first_screen(page.get_by_text("Step 2 of", exact=False).first)
    # The step's two heatmaps (masked self-attention, cross-attention of the newest position), whole.
    on_first_screen(page.locator(CHART).nth(0))
    on_first_screen(page.locator(CHART).nth(1))
    assert_no_error(page)


def test_does_this_head_matter_keys_step_the_head_beside_the_grid_on_the_first_screen(server_url, projector):
    page = projector
    page.goto(f"{server_url}/heads?present=1")
    settle(page, timeout=300)  # a fresh server studies SmolLM2's 270 heads first
    metric = page.locator('[data-testid="stMetric"]').first
    label = metric.locator('[data-testid="stMetricLabel"]').inner_text()
    press(page, "ArrowRight")  # the next head: its ablation runs (one pass)
    expect(metric.locator('[data-testid="stMetricLabel"]')).not_to_have_text(label, timeout=120_000)
    settle(page)
    on_first_screen(metric)  # the chosen head's effect, beside the grid
    on_first_screen(page.locator(CHART).first)  # the layers x heads grid, the chosen head outlined
    assert_no_error(page)


@pytest.mark.skipif(not IMAGES.is_dir(), reason="needs the photos in ../shared/images")
def test_an_uploaded_picture_survives_the_arrow_keys(server_url, projector):
    page = projector
    page.goto(f"{server_url}/vision?present=1&model={vision_model()}")
    settle(page)
    click(page.get_by_role("button", name="Settings"))
    settings = page.locator('[data-testid="stPopoverBody"]')
    click(settings.get_by_text("Upload", exact=True))
    settle(page)
    settings.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(IMAGES / "plane.png"))
    wait_for_url(page, "from=upload")
    settle(page)
    # The lecturer's focus is still on the picture's radio (a click on it, as after choosing "Upload").
    click(settings.get_by_text("Upload", exact=True))
    radio = settings.get_by_role("radio", name="Upload")
    expect(radio).to_be_checked()
    page.wait_for_function("() => document.activeElement && document.activeElement.type === 'radio'")
    for key, part in (("ArrowLeft", "layer="), ("ArrowRight", "layer="), ("ArrowUp", "head="), ("ArrowDown", "head=")):
        before = page.url
        page.keyboard.press(key)  # the radio focused: the key steps the view, not the picture's source
        page.wait_for_function("u => location.href !== u", arg=before)
        settle(page)
        assert "from=upload" in page.url and part in page.url, (key, page.url)
        expect(radio).to_be_checked()
        page.wait_for_function("() => document.body.innerText.includes('plane')")
    assert_no_error(page)


def bar_fits(page) -> None:
    """Every page's label in the bar, inside the window, the strip not scrolled or scrollable."""
    strip = page.locator(BAR_PAGES)
    sizes = strip.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert sizes[0] <= sizes[1] + 1, sizes
    for label in BAR_LABELS:
        # A link, or the page on screen's label: either, waited for together (a count taken once chose the wrong
        # one while a late run of the page redrew the bar: a fresh-clone run looked for "Home" as the page on screen).
        link = strip.get_by_role("link", name=label, exact=True)
        item = link.or_(strip.locator(".st-key-tformer-bar-here").get_by_text(label, exact=True))
        expect(item).to_be_visible()
        box = item.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (label, box)


@pytest.mark.parametrize("path", ["heads", "train", "detr"])
def test_the_bar_reaches_every_page_and_shows_the_one_on_screen(server_url, projector, path):
    page = projector
    page.goto(f"{server_url}/{path}?present=1")
    settle(page)
    bar_fits(page)
    here = page.locator(".st-key-tformer-bar-here")
    expect(here).to_be_visible()
    label = {"heads": "Heads", "train": "Train", "detr": "DETR"}[path]
    expect(here).to_have_text(label)
    # It stays at the top of the window as the page scrolls (a page longer than the window).
    main = '[data-testid="stMain"]'
    if page.evaluate(f"() => document.querySelector('{main}').scrollHeight") < 2 * HEIGHT:
        return
    page.mouse.move(WIDTH / 2, HEIGHT / 2)
    page.mouse.wheel(0, 2000)
    page.wait_for_function("() => document.querySelector('[data-testid=\"stMain\"]').scrollTop > 0")
    expect(page.locator(".st-key-tformer-bar")).to_be_in_viewport()
    assert page.locator(".st-key-tformer-bar").bounding_box()["y"] < 5


def test_the_bar_fits_while_a_deck_is_presented(server_url, projector):
    page = projector
    page.goto(f"{server_url}/positional?present=1")
    settle(page)
    add_this_view(page, 1)
    sidebar = page.locator('[data-testid="stSidebar"]')
    press_button(page.locator(".st-key-tformer-bar").get_by_role("button", name="Present the slides (1)"))
    wait_for_text(page, "Slide 1/1")
    settle(page)
    sidebar.hover()  # its collapse button shows on hover
    click(page.get_by_role("button", name="Collapse sidebar"))  # the projector's view: no sidebar
    page.wait_for_function(
        "() => document.querySelector('[data-testid=\"stSidebar\"]').getBoundingClientRect().right < 50"
    )
    bar_fits(page)
    assert_no_error(page)
