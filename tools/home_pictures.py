"""The Home page's pictures (assets/home/*.png): cropped screenshots of the running app. This is their recipe.

    .venv/bin/python tools/home_pictures.py                # all of them, then their sizes
    .venv/bin/python tools/home_pictures.py present deck   # only these (names: tformer_app.home.PICTURES)
    .venv/bin/python tools/home_pictures.py --keep /tmp/x  # also the whole screenshots each was cut from

What it does, in order:

1. Starts the app as the browser tests do (tests/browser/server.py: `streamlit run app.py` headless on a free port,
   offline, on the CPU), with ../shared's DeiT-Tiny and photos when they are there (as CI has them; else the
   Vision page shows the bundled vit-tiny on a generated shape).
2. Opens Debian's Chromium (/usr/bin/chromium, or $TFORMER_CHROMIUM; --no-sandbox --disable-gpu) through
   Playwright, in a 1280 x 720 window at device scale 2 (a projector's size, drawn sharp).
3. For each picture, drives the app to the state it shows (clicks in the sidebar, a link's settings), waits for
   the page to settle (tests/browser/helpers.py: conditions, never sleeps), and cuts out a region of the window:
   - present: Text attention in presenter mode (?present=1), its top left: the bar, the title, the keys' buttons;
   - deck: the sidebar's Slides box after "Add this view" on Text attention and on Vision Transformer, down to
     the second slide (the sidebar widened to 380 px, as dragging its edge does: at its own width a slide's
     ↑ ↓ ✕ wrap under its title);
   - class: after the sidebar's "Start a class session", the line above the page: the QR code and the join code;
   - step: Attention, step by step, Q = XW^Q's heatmap;
   - text: Text attention's head view (the lecture's sentence, layer 3), the middle 4:3 of it;
   - vision: Vision Transformer's attention over the picture (the class token, the last layer, the heads' mean),
     the middle 4:3 of it.
4. Scales each to twice its width on Home (tformer_app.home.PICTURES: sharp on a 2x screen) and writes it as PNG,
   in a palette of 256 colours (fewer until it is within MAX_PICTURE_BYTES); then checks all of them against
   MAX_PICTURES_BYTES.
   PNG, not WebP: st.image sends a PNG as it is (output_format="PNG", no resizing: Home draws it in a box of its
   width), where it would decode a WebP and encode it again as JPEG on every run of every student's Home.

Chromium here has no emoji font: it would draw the pages' icons (the sidebar's, the presenter bar's) as empty
boxes, so the script hides them when `fc-list` finds no emoji font (install fonts-noto-color-emoji to keep them).
The join code in the class picture is whatever the session drew: a new one each time the script runs.

Needs requirements-dev.txt (Playwright) and chromium. Takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import functools
import io
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
from playwright.sync_api import FloatRect, Locator, Page, ViewportSize, sync_playwright  # noqa: E402

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.browser.helpers import centre, settle, wait_for_text  # noqa: E402
from tests.browser.server import streamlit_server  # noqa: E402
from tests.core.hf_helpers import DEIT, IMAGES  # noqa: E402
from tformer_app.home import MAX_PICTURE_BYTES, MAX_PICTURES_BYTES, PICTURES, PICTURES_DIR  # noqa: E402

WINDOW = ViewportSize(width=1280, height=720)
TALL = ViewportSize(width=1280, height=1400)  # the sidebar's boxes whole, without scrolling the sidebar
SCALE = 2  # device pixels per CSS pixel
COLOURS = (256, 128, 64)  # a palette of so many colours (UI and a thumbnail need no more), fewer until it fits
SIDEBAR = '[data-testid="stSidebar"]'
MAIN = '[data-testid="stMain"]'
NO_EMOJI_CSS = '[data-testid="stIconEmoji"] { visibility: hidden; }'
# The sidebar as a lecturer widens it by dragging its edge: a slide's row (its title, ↑ ↓ ✕) on one line.
WIDE_SIDEBAR_CSS = '[data-testid="stSidebar"] { width: 380px !important; min-width: 380px !important; }'


@functools.cache
def has_emoji_font() -> bool:
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return False
    found = subprocess.run([fc_list, ":charset=1f3e0"], capture_output=True, text=True, check=False)
    return bool(found.stdout.strip())


def open_page(page: Page, url: str, text: str) -> None:
    page.goto(url)
    wait_for_text(page, text)
    settle(page)
    if not has_emoji_font():
        page.add_style_tag(content=NO_EMOJI_CSS)


def region(left: float, top: float, right: float, bottom: float) -> FloatRect:
    """A region of the window in CSS px, by its edges (none outside the window's top left)."""
    left, top = max(left, 0), max(top, 0)
    return FloatRect(x=left, y=top, width=right - left, height=bottom - top)


def union(*boxes: FloatRect | None, pad: float = 8) -> FloatRect:
    """The smallest region holding every box, `pad` CSS px wider on each side."""
    found = [b for b in boxes if b is not None]
    assert found, "nothing to cut out: the page did not draw what the picture shows"
    return region(
        min(b["x"] for b in found) - pad,
        min(b["y"] for b in found) - pad,
        max(b["x"] + b["width"] for b in found) + pad,
        max(b["y"] + b["height"] for b in found) + pad,
    )


def shoot(page: Page, clip: FloatRect, aspect: float | None = None) -> Image.Image:
    """The region of the window (CSS px), its middle cut to `aspect` (width / height) when given. The mouse is
    moved off the page first: a control it last clicked would show its hover state."""
    page.mouse.move(WINDOW["width"] - 1, 1)
    image = Image.open(io.BytesIO(page.screenshot(clip=clip))).convert("RGB")
    if aspect is None:
        return image
    width, height = min(image.width, round(image.height * aspect)), min(image.height, round(image.width / aspect))
    left, top = (image.width - width) // 2, (image.height - height) // 2
    return image.crop((left, top, left + width, top + height))


def below(page: Page, heading: str, level: str, what: str) -> Locator:
    """The first element matching the XPath test `what` after the main column's heading that says `heading`."""
    return page.locator(f"{MAIN} {level}", has_text=heading).first.locator(f"xpath=following::*[{what}][1]")


# ---- the pictures: each drives the app and returns the region it shows -------------------------------------
def present(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(WINDOW)
    open_page(page, f"{url}/text?present=1", "Head view · layer 3, head 1")
    heading = page.locator(f"{MAIN} h3", has_text="Head view").first.bounding_box()
    assert heading is not None
    return shoot(page, region(0, 0, 640, heading["y"] + heading["height"] + 12))


def deck(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(TALL)
    open_page(page, f"{url}/text", "Head view · layer 3")
    sidebar = page.locator(SIDEBAR)
    sidebar.get_by_text("Slides (0)").click()
    sidebar.get_by_role("button", name="Add this view").click()
    wait_for_text(page, "Slides (1)")
    settle(page)
    sidebar.get_by_role("link", name="Vision Transformer").click()  # in this session: the deck stays
    page.wait_for_url("**/vision**")
    wait_for_text(page, "What the model sees: top 5")
    settle(page)
    sidebar.get_by_role("button", name="Add this view").click()
    wait_for_text(page, "Slides (2)")
    page.add_style_tag(content=WIDE_SIDEBAR_CSS)
    settle(page)
    box = sidebar.locator('[data-testid="stExpander"]', has_text="Slides (2)").bounding_box()
    second = sidebar.get_by_role("button", name="✕").nth(1).bounding_box()  # slide 2's row
    assert box is not None and second is not None
    return shoot(page, region(box["x"], box["y"], box["x"] + box["width"], second["y"] + second["height"] + 8))


def class_banner(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(WINDOW)
    open_page(page, f"{url}/step-by-step", "Scores, scaling, softmax, Z")
    sidebar = page.locator(SIDEBAR)
    sidebar.get_by_text("Class session", exact=True).click()
    sidebar.get_by_role("button", name="Start a class session").click()
    wait_for_text(page, "Join the class: code")
    settle(page)
    banner = page.locator(".st-key-tformer-class-banner").bounding_box()
    code = page.locator(".st-key-tformer-class-banner strong").first.bounding_box()
    assert banner is not None and code is not None
    right = code["x"] + code["width"] + 2  # the QR code and "Join the class: code K7M2QX"
    return shoot(page, region(banner["x"], banner["y"], right, banner["y"] + banner["height"]))


def step(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(TALL)
    open_page(page, f"{url}/step-by-step", "Scores, scaling, softmax, Z")
    chart = below(page, "Q, K, V", "h3", "@data-testid='stVegaLiteChart'")  # Q's heatmap
    chart.locator("canvas, svg.marks").first.wait_for()
    centre(chart)
    return shoot(page, union(chart.bounding_box()))


def text(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(TALL)
    open_page(page, f"{url}/text", "Head view · layer 3")
    chart = below(page, "Head view", "h3", "@data-testid='stVegaLiteChart'")
    chart.locator("canvas, svg.marks").first.wait_for()
    centre(chart)
    return shoot(page, union(chart.bounding_box(), pad=2), aspect=4 / 3)  # the tokens and their lines


def vision(page: Page, url: str) -> Image.Image:
    page.set_viewport_size(TALL)
    open_page(page, f"{url}/vision", "Attention over the picture")
    picker = page.locator(f"{MAIN} .st-key-vit-picker")  # the picture, its patches and the heat
    picker.locator("canvas, svg.marks").first.wait_for()
    centre(picker)
    return shoot(page, union(picker.bounding_box(), pad=0), aspect=4 / 3)


SHOTS: dict[str, Callable[[Page, str], Image.Image]] = {
    "present": present,
    "deck": deck,
    "class": class_banner,
    "step": step,
    "text": text,
    "vision": vision,
}


def save(name: str, image: Image.Image) -> int:
    """The picture at twice its width on Home, as PNG within MAX_PICTURE_BYTES (fewer colours until it fits);
    returns its size in bytes."""
    width = 2 * PICTURES[name].width
    if image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.Resampling.LANCZOS)
    for colours in COLOURS:
        shown = image.quantize(colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        data = io.BytesIO()
        shown.save(data, "PNG", optimize=True)
        if data.tell() <= MAX_PICTURE_BYTES:
            break
    else:
        raise SystemExit(f"{name}: {data.tell()} bytes in {colours} colours, over {MAX_PICTURE_BYTES}: cut it smaller")
    PICTURES[name].path.write_bytes(data.getvalue())
    return data.tell()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"the pictures to make, of {', '.join(SHOTS)} (default: all)")
    parser.add_argument("--keep", type=Path, help="a folder for the uncut screenshots too (to see what was cut)")
    args = parser.parse_args()
    names = args.names or list(SHOTS)
    unknown = [n for n in names if n not in SHOTS]
    if unknown:
        parser.error(f"no picture named {', '.join(unknown)}: the pictures are {', '.join(SHOTS)}")
    PICTURES_DIR.mkdir(parents=True, exist_ok=True)
    extra = {"TFORMER_MODEL_DIRS": str(DEIT.parent), "TFORMER_IMAGE_DIRS": str(IMAGES)} if DEIT.is_dir() else {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        streamlit_server(Path(tmp) / "streamlit.log", **extra) as url,
        sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        for name in names:
            context = browser.new_context(viewport=WINDOW, device_scale_factor=SCALE)  # a session of its own
            page = context.new_page()
            image = SHOTS[name](page, url)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.keep / f"{name}-window.png"))
            print(f"{PICTURES[name].file}: {image.width} x {image.height} px cut, {save(name, image):,} bytes")
            context.close()
        browser.close()
    total = sum(p.path.stat().st_size for p in PICTURES.values() if p.path.exists())
    print(f"all {len(PICTURES)}: {total:,} bytes (at most {MAX_PICTURES_BYTES:,})")
    if total > MAX_PICTURES_BYTES:
        raise SystemExit("over the budget of Home's pictures: cut them smaller")


if __name__ == "__main__":
    main()
