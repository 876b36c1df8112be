"""The README's picture (docs/images/text-attention.png): the Text attention page as a projector shows it. Its recipe:

    .venv/bin/python tools/readme_picture.py                # writes the picture, then its size
    .venv/bin/python tools/readme_picture.py --plain        # the page out of presenter mode (sidebar, settings)

Starts the app as tools/home_pictures.py does (tests/browser/server.py: headless, offline, on the CPU), opens
Debian's Chromium through Playwright in a 1280 x 720 window, opens Text attention in presenter mode on the lecture's
sentence (layer 3, head 1: "it" gives "animal" 0.68 of its attention), waits for the head view to be drawn, and
writes the whole window as PNG in a palette of 256 colours (fewer until it is within MAX_BYTES: the picture loads
with the repository's front page). Needs requirements-dev.txt (Playwright) and chromium; about half a minute.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from tests.browser.server import streamlit_server  # noqa: E402
from tools.home_pictures import MAIN, WINDOW, open_page  # noqa: E402

PICTURE = ROOT / "docs" / "images" / "text-attention.png"
MAX_BYTES = 150_000
COLOURS = (256, 128, 64)


def shoot(url: str, presenting: bool) -> Image.Image:
    """The whole 1280 x 720 window once the head view is drawn, the mouse off the page (no hover state)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=WINDOW)
        open_page(page, f"{url}/text" + ("?present=1" if presenting else ""), "Head view · layer 3")
        page.locator(f"{MAIN} [data-testid='stVegaLiteChart'] canvas, {MAIN} svg.marks").first.wait_for()
        page.mouse.move(WINDOW["width"] - 1, 1)
        image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
        browser.close()
    return image


def save(image: Image.Image) -> int:
    """PNG in the most colours that fit MAX_BYTES; returns its size in bytes."""
    for colours in COLOURS:
        data = io.BytesIO()
        image.quantize(colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            data, "PNG", optimize=True
        )
        if data.tell() <= MAX_BYTES:
            break
    else:
        raise SystemExit(f"{data.tell()} bytes in {colours} colours, over {MAX_BYTES}")
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    PICTURE.write_bytes(data.getvalue())
    return data.tell()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plain", action="store_true", help="out of presenter mode: the sidebar and the settings")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, streamlit_server(Path(tmp) / "streamlit.log") as url:
        image = shoot(url, presenting=not args.plain)
    print(f"{PICTURE.relative_to(ROOT)}: {image.width} x {image.height} px, {save(image):,} bytes")


if __name__ == "__main__":
    main()
