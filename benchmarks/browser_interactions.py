"""Clicks in a real browser, timed from the click to the settled page, against the budgets of issue 13.

    python benchmarks/browser_interactions.py [--runs 7] [--only text-head] [--profile prof.txt]
    python benchmarks/browser_interactions.py --only text-head text-sentence --beside-studies  # issue 34

A real server (`streamlit run app.py`, offline, on the CPU, as tests/browser/server.py starts it; DeiT-Tiny
from ../shared/models where it is there) and Debian's Chromium driven by Playwright, with the browser
tests' window (1400 x 1000; --window 1280x720 a projector's, --present in presenter mode) and flags.
Interactions, each on its page with its defaults:

    text-head          Text attention (MiniLM, the lecture's sentence, default views): choose another head
    text-layer         the same page: choose another layer
    s2s-head           Encoder-decoder (the bundled translator): choose another head
    vision-patch       Vision Transformer (DeiT-Tiny, else vit-tiny): click another patch of the picture
    text-sentence      Text attention (MiniLM, default views): type a new sentence (Ctrl+Enter); the baseline for
                       the decoder's, measured in the same run on the same machine
    decoder-sentence   Text attention's decoder side (SmolLM2, default views): type a new sentence (Ctrl+Enter)
    deck-slide         a deck of two slides (Text attention on layer 2, head 3; Attention, step by step) presented
                       in presenter mode: Page Down / Page Up, as a clicker sends them
    presenter-head     Text attention in presenter mode (the head view): the → key, the next head
    heads-click        Does this head matter? (SmolLM2, "The capital of France is"): click another cell of the
                       layers x heads grid (its head ablated: the number, the prediction, its attention)
    sinks-knockout     Text attention's sinks (SmolLM2): "Run the knockout", attention to the first token blocked
                       from another layer each run (a pass not computed yet; the address does not change)
    remove-source      Text attention's "Why this weight" (MiniLM, "it" -> "animal"): "Remove this source", another
                       source each run (a real pass without it, not computed yet; the address does not change)
    flow-toggle        Vision (DeiT-Tiny, else vit-tiny): the flow to the class token turned on for a picture just
                       uploaded (a photo shifted by a few pixels each run: its flow not computed yet)
    flow-layer         the same section on: its "Before layer" slider one step

Each run is a real change (another head, layer or patch than the run before); one warm-up run first.
A run is timed from the click or the key (the pointer or the key going down, as the page records it) to the
first moment the page is settled and stays so for a second (tests/browser/helpers.settle's condition): the
address changed, every script run the click started has finished (the websocket's new_session /
script_finished messages), no status widget and no stale element. Measured beside it, per run:

- server: the script runs, from their new_session to their script_finished as the browser receives them
  (the script, the element messages and their transfer); "browser" = settled - the last script_finished
  (drawing the charts, tables and pictures);
- what was sent: websocket bytes, chart elements sent in full and those the browser had (a ref_hash);
- Chromium's main-thread time (DevTools Performance metrics: script, layout, style);
- forward passes the server ran (a global forward pre-hook on the model stacks, installed in the server
  process through a sitecustomize module on PYTHONPATH; must be 0 for a view change).

The printed table gives the median and 90th percentile of the click-to-settled time, the budget, the
figure measured before this work, and their ratio; with the machine's load average (timings on a busy
machine are slower: say so when reporting). --profile records the server with py-spy during extra runs
of the slowest interaction and prints the functions that took the most of its time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
PROJECTOR = {"width": 1280, "height": 720}  # a lecture's projector
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.browser.helpers import settle
from tests.browser.server import streamlit_server
from tests.core.hf_helpers import DEIT, IMAGES

WINDOW = {"width": 1400, "height": 1000}  # the browser tests' window; --window 1280x720 for a projector's
QUIET_S = 1.0  # settled: quiet for this long (as helpers.settle)
POLL_S = 0.02

# Installed in the server process (PYTHONPATH): counts the forward passes of every model stack and writes
# the server's pid, without touching the app's code.
SITECUSTOMIZE = textwrap.dedent(
    """
    import os, threading
    _path = os.environ.get("TFORMER_BENCH_PASSES")
    if _path:
        open(_path + ".pid", "w").write(str(os.getpid()))
        import torch
        _lock = threading.Lock()
        _stack = None

        def _count(module, args):
            global _stack
            if _stack is None:
                from tformer_core.models.layers import Stack as _s
                _stack = _s
            if isinstance(module, _stack):
                with _lock, open(_path, "a") as f:
                    f.write("1")

        torch.nn.modules.module.register_module_forward_pre_hook(_count)
    """
)
QUIET_JS = """() => !document.querySelector('[data-testid="stStatusWidget"]')
    && !document.querySelector('[data-stale="true"]')"""


@dataclass
class Run:
    total: float  # click -> settled
    server: list[float]  # each script run: new_session -> script_finished, as received
    last_finished: float  # click -> the last script_finished
    first_started: float  # click -> the first new_session
    bytes: int
    charts_sent: int
    charts_cached: int
    passes: int
    cdp: dict[str, float]


@dataclass
class Interaction:
    name: str
    label: str
    path: str
    budget: float | None  # seconds; None: the issue set none
    before: float | None  # the figure measured before the work that set the budget (None: none was)
    act: Callable  # (page, i) -> None: the i-th change
    setup: Callable | None = None  # (page) -> None: after the page opened, before the warm-up
    window: dict[str, int] | None = None  # its own browser window (PROJECTOR for presenter keys), else WINDOW
    link: bool = True  # the click changes the page's link (a setting); False: it does not (a button)
    runs: list[Run] = field(default_factory=list)


class Wire:
    """What the page's websocket received: script runs started / finished (with times), bytes, charts."""

    def __init__(self) -> None:
        self.started: list[float] = []
        self.finished: list[float] = []
        self.bytes = 0
        self.charts_sent = 0
        self.charts_cached = 0

    def attach(self, page) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        def on_frame(payload) -> None:
            now = time.time()
            if isinstance(payload, str):
                return
            self.bytes += len(payload)
            msg = ForwardMsg.FromString(payload)
            kind = msg.WhichOneof("type")
            if kind == "new_session":
                self.started.append(now)
            elif kind == "script_finished":
                self.finished.append(now)
            elif kind == "ref_hash":
                self.charts_cached += 1  # a cacheable element the browser already has (charts, mostly)
            elif (
                kind == "delta"
                and msg.delta.WhichOneof("type") == "new_element"
                and "vega_lite" in str(msg.delta.new_element.WhichOneof("type"))
            ):
                self.charts_sent += 1

        page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
        # When the user's click or key happened: the pointer or the key going down, on the system clock.
        page.add_init_script(
            "addEventListener('pointerdown', () => { window.__benchClick = Date.now(); }, true);"
            "addEventListener('keydown', () => { window.__benchClick = Date.now(); }, true);"
        )


def passes(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


CDP_METRICS = ("ScriptDuration", "LayoutDuration", "RecalcStyleDuration", "TaskDuration")


def cdp_metrics(cdp) -> dict[str, float]:
    values = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return {name: values.get(name, 0.0) for name in CDP_METRICS}


def timed(
    page, wire: Wire, cdp, pass_file: Path, act: Callable[[], None], timeout: float = 120.0, link: bool = True
) -> Run:
    """Do `act` (a click) and time it to the settled page (see the module's docstring); link: the click changes
    the address (else the settled page need not have a new one: a button)."""
    url0, n_started, n_finished, bytes0 = page.url, len(wire.started), len(wire.finished), wire.bytes
    sent0, cached0, passes0, cdp0 = wire.charts_sent, wire.charts_cached, passes(pass_file), cdp_metrics(cdp)
    page.evaluate("window.__benchClick = 0")
    act()
    t0 = page.evaluate("window.__benchClick") / 1000  # the click itself, not Playwright's work before it
    if not t0:
        raise AssertionError("no pointerdown or keydown reached the page")
    quiet_since = None
    while time.time() - t0 < timeout:
        quiet = page.evaluate(QUIET_JS)  # also lets Playwright deliver the websocket frames
        started, finished = len(wire.started) - n_started, len(wire.finished) - n_finished
        done = quiet and (page.url != url0 or not link) and started >= 1 and finished >= started
        now = time.time()
        if not done:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= QUIET_S:
            break
        time.sleep(POLL_S)
    else:
        raise AssertionError(f"the page did not settle in {timeout:.0f} s")
    runs = list(zip(wire.started[n_started:], wire.finished[n_finished:], strict=False))
    cdp1 = cdp_metrics(cdp)
    return Run(
        total=quiet_since - t0,
        server=[b - a for a, b in runs],
        last_finished=wire.finished[-1] - t0,
        first_started=wire.started[n_started] - t0,
        bytes=wire.bytes - bytes0,
        charts_sent=wire.charts_sent - sent0,
        charts_cached=wire.charts_cached - cached0,
        passes=passes(pass_file) - passes0,
        cdp={k: cdp1[k] - cdp0[k] for k in CDP_METRICS},
    )


def choose_nth(label: str, options: Callable[[int], str]) -> Callable:
    """Open the selectbox labelled `label` (not timed) and return the click on its i-th choice (timed)."""

    def prepare(page, i: int) -> Callable[[], None]:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        box = page.locator('[data-testid="stSelectbox"]').filter(has=page.get_by_text(label, exact=True)).first
        wanted = page.get_by_role("option", name=options(i), exact=True)
        for _ in range(5):
            box.evaluate("e => e.scrollIntoView({block: 'center'})")
            box.click()
            try:
                wanted.wait_for(state="visible", timeout=5000)
                break
            except PlaywrightTimeout:
                page.keyboard.press("Escape")
        return wanted.click

    return prepare


SENTENCES = (
    "The cat sat on the mat because it was warm.",
    "A robot wrote a poem about the sea.",
    "Students asked why the model looked at the first token.",
    "The river flooded the village after the storm.",
    "My neighbour plays the violin every evening.",
    "Paris is the capital of France and a large city.",
    "The trophy did not fit in the suitcase because it was too big.",
    "Bees carry pollen from one flower to the next.",
    "The old clock in the hall stopped at midnight.",
    "We trained a small transformer on children's stories.",
)


def type_sentence(page, i: int) -> Callable[[], None]:
    """The Sentence box filled with the i-th sentence (not timed); the key that sends it (timed)."""
    box = page.get_by_role("textbox", name="Sentence", exact=True)
    box.evaluate("e => e.scrollIntoView({block: 'center'})")
    box.fill(SENTENCES[i % len(SENTENCES)])
    return lambda: box.press("Control+Enter")


def press_key(key: Callable[[int], str]) -> Callable:
    """The page itself focused (nothing else: the keys go to the document), the i-th key (timed)."""

    def prepare(page, i: int) -> Callable[[], None]:
        settle(page)
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        return lambda: page.keyboard.press(key(i))

    return prepare


def make_deck(page) -> None:
    """Two slides from the page the interaction opened on (Text attention): it, then Attention, step by step;
    presenter mode on and the deck presented from slide 1."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    for then in ("Attention, step by step", None):
        add = sidebar.get_by_role("button", name="Add this view")
        if not add.is_visible():
            sidebar.get_by_text("Slides (", exact=False).click()
        add.click()
        settle(page)
        if then:
            sidebar.get_by_role("link", name=then).click()
            settle(page)
    page.locator('[data-testid="stMain"] h1').first.click()
    page.keyboard.press("Shift+P")
    settle(page)
    page.locator(".st-key-tformer-bar").get_by_role("button", name="Present the slides (2)").click()
    settle(page, timeout=600)


def click_patch(page, i: int) -> Callable[[], None]:
    """The picture's patch picker: a click on the i-th of a few spots, each another patch."""
    spots = [(0.3, 0.6), (0.7, 0.35), (0.45, 0.8), (0.8, 0.7), (0.2, 0.3), (0.6, 0.55), (0.35, 0.4), (0.75, 0.85)]
    heading = page.locator("xpath=//h2[contains(., 'Attention over the picture')]")
    picker = (
        page.locator(
            "xpath=//h2[contains(., 'Attention over the picture')]/following::*[@data-testid='stVegaLiteChart'][1]"
        )
        if heading.count()
        else page.locator('[data-testid="stVegaLiteChart"]').first  # presenter mode: the first screen's picture
    )
    picker.evaluate("e => e.scrollIntoView({block: 'center'})")
    box = picker.bounding_box()
    fx, fy = spots[i % len(spots)]
    return lambda: page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)


_head_clicks = itertools.count()  # every click of a run of this script another cell: none of them cached yet


def click_head(page, i: int) -> Callable[[], None]:
    """The ablation grid of "Does this head matter?" (SmolLM2: 30 layers x 9 heads): a click in the middle of a cell
    (Vega names each cell's mark by its axes) this script has not clicked before, nor the one chosen now: its head's
    ablation is computed for the click, as for a student's first click on it."""
    chosen = re.search(r"layer=(\d+)&head=(\d+)", page.url)
    while True:
        layer, head = divmod(next(_head_clicks) * 37 % 270, 9)  # 37 and 270 coprime: every cell once
        if not chosen or (layer, head) != (int(chosen.group(1)), int(chosen.group(2))):
            break
    cell = page.locator('[data-testid="stVegaLiteChart"]').first.locator(
        f'.cells_marks path[aria-label^="head: H{head}; layer: L{layer};"]'
    )
    cell.evaluate("e => e.scrollIntoView({block: 'center'})")
    box = cell.bounding_box()
    return lambda: page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def interactions() -> list[Interaction]:
    vision_model = str(DEIT) if DEIT.is_dir() else "vit-tiny"
    vision_name = "DeiT-Tiny" if DEIT.is_dir() else "vit-tiny"
    return [
        Interaction(
            "text-head",
            "Text attention: head switch (default views)",
            "/text",
            0.6,
            1.35,
            # The page opens on head 1 (the lecture's "it" -> "animal" head): each run another head than the last.
            choose_nth("Head", lambda i: str((2 + i) % 12)),
        ),
        Interaction(
            "text-layer",
            "Text attention: layer switch",
            "/text",
            0.7,
            1.56,
            choose_nth("Layer", lambda i: str(1 + i % 5)),
        ),
        Interaction(
            "s2s-head",
            "Encoder-decoder: head switch",
            "/seq2seq",
            0.8,
            2.29,
            choose_nth("Head", lambda i: str(1 + i % 3)),
        ),
        Interaction(
            "vision-patch",
            f"Vision: patch click ({'DeiT-Tiny' if DEIT.is_dir() else 'vit-tiny'})",
            f"/vision?model={quote(vision_model)}",
            0.8,
            1.25,
            click_patch,
        ),
        Interaction("text-sentence", "Text attention: new sentence (MiniLM)", "/text", None, None, type_sentence),
        # Issue 20: before, a new sentence also wrote the 20-token continuation (2.5-8 s on a quiet machine).
        Interaction(
            "decoder-sentence",
            "Text attention: decoder new sentence (SmolLM2)",
            "/text?arch=decoder",
            1.0,
            2.5,
            type_sentence,
        ),
        Interaction(
            "deck-slide",
            "Deck: slide change, presenter mode (Page Down/Up)",
            "/text?layer=2&head=3",
            None,
            0.8,
            press_key(lambda i: "PageUp" if i % 2 else "PageDown"),
            setup=make_deck,
        ),
        Interaction(
            "presenter-head",
            "Presenter mode: head step (→, head view)",
            "/text?present=1",
            0.6,
            None,
            press_key(lambda i: "ArrowRight"),
        ),
        # Issue 36: every key of presenter mode, on the page's first screen at a projector's 1280 x 720.
        Interaction(
            "presenter-layer",
            "Presenter mode: layer step (↓, head view)",
            "/text?present=1",
            0.6,
            None,
            press_key(lambda i: "ArrowDown"),
            window=PROJECTOR,
        ),
        Interaction(
            "presenter-vision-layer",
            "Presenter mode: Vision layer step (←)",
            f"/vision?present=1&model={quote(vision_model)}",
            0.6,
            None,
            press_key(lambda i: "ArrowLeft"),
            window=PROJECTOR,
        ),
        Interaction(
            "presenter-vision-head",
            "Presenter mode: Vision head step (↓)",
            f"/vision?present=1&model={quote(vision_model)}",
            0.6,
            None,
            press_key(lambda i: "ArrowDown"),
            window=PROJECTOR,
        ),
        Interaction(
            "presenter-patch",
            "Presenter mode: Vision patch click",
            f"/vision?present=1&model={quote(vision_model)}",
            0.8,
            None,
            click_patch,
            window=PROJECTOR,
        ),
        Interaction(
            "presenter-step",
            "Presenter mode: Encoder-decoder step (→ / ←)",
            "/seq2seq?present=1",
            0.8,
            None,
            press_key(lambda i: "ArrowLeft" if i % 2 else "ArrowRight"),
            window=PROJECTOR,
        ),
        # Issue 36: 0.6 s on a quiet machine, 6.6 s under load, before its work (measured by a lecturer).
        Interaction("heads-click", "Does this head matter?: grid click (SmolLM2)", "/heads", None, 0.6, click_head),
        # Issue 38: each (but the layer step) a computation not cached yet. "before": the whole page ran and was
        # drawn again for it; the medians of this benchmark at 1280 x 720 (load 1.2-1.8, 2 cores), 2026-11-28.
        Interaction(
            "sinks-knockout",
            "Text attention: sinks knockout (SmolLM2)",
            "/text?model=smollm2&sink_ko=block&sink_from=0",
            1.0,
            0.50,
            run_knockout,
            link=False,
        ),
        Interaction(
            "remove-source",
            "Why this weight: remove a source (MiniLM)",
            "/text?views=heatmap,why&layer=3&head=1&query=10&key=2",
            1.0,
            None,
            remove_source,
            link=False,
        ),
        Interaction(
            "flow-toggle",
            f"Vision: flow to the class token on ({vision_name})",
            f"/vision?model={quote(vision_model)}&from=upload",
            1.0,
            0.80,
            toggle_flow,
            setup=flow_on,
        ),
        Interaction(
            "flow-layer",
            f"Vision: flow's Before layer step ({vision_name})",
            f"/vision?model={quote(vision_model)}",
            1.0,
            0.32,
            step_flow_layer,
            setup=flow_layer_on,
        ),
    ]


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cores)"


STUDY_WORDS = ("a tired dog", "the old teacher", "my sister", "the robot", "our neighbour", "the pilot", "a bird")


class Studies:
    """Another student studying heads on SmolLM2 without pause (issue 34), from their own laptop: a text of their own
    of about 30 tokens on "Does this head matter?" (within TFORMER_REQUEST_GFLOP, so every study runs: tens of
    seconds of the server's work), and another as soon as the page has drawn the last. They speak the browser's
    protocol (benchmarks/stclient.py) from a thread of their own: their pages are not drawn on this machine, whose
    two cores the measured browser and the server share already."""

    def __init__(self, url: str) -> None:
        self.url, self.started, self.finished, self.errors = url, 0, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._study()), name="studies", daemon=True)

    def text(self) -> str:
        who = STUDY_WORDS[self.started % len(STUDY_WORDS)]
        return f"In round {self.started} {who} painted the last train before it rained, and the capital of France is"

    async def _study(self) -> None:
        from stclient import ProtocolError, Session

        while not self._stop.is_set():
            self.started += 1
            session = Session(self.url, timeout_s=900)
            try:
                run = await session.connect(f"/heads?text={quote(self.text())}")
                self.finished += 1
                self.errors += run.errors
            except ProtocolError:  # the server stopped at the end of the benchmark
                return
            finally:
                await session.close()

    def __enter__(self) -> Studies:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(1)  # a study under way is left to the server (it stops once nobody waits for it)


def run_knockout(page, i: int) -> Callable[[], None]:
    """Text attention's sinks (SmolLM2, "block attention to the first token from a layer on"): "From layer" one
    layer on (not timed: the page's run), then "Run the knockout" (timed): each run a knockout not computed yet."""
    slider = page.get_by_role("slider", name="From layer")
    slider.evaluate("e => e.scrollIntoView({block: 'center'})")
    slider.focus()
    page.keyboard.press("ArrowRight")
    settle(page)
    button = page.get_by_role("button", name="Run the knockout")
    button.evaluate("e => e.scrollIntoView({block: 'center'})")
    return button.click


def remove_source(page, i: int) -> Callable[[], None]:
    """Why this weight (Text attention, MiniLM): another source chosen in "Source to remove" (not timed), then
    "Remove this source" (timed): a real pass without it, not computed yet."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.locator('[data-testid="stSelectbox"]').filter(has=page.get_by_text("Source to remove", exact=True))
    for _ in range(5):
        box.first.evaluate("e => e.scrollIntoView({block: 'center'})")
        box.first.click()
        try:
            page.get_by_role("option").nth(1 + i).wait_for(state="visible", timeout=5000)
            break
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    page.get_by_role("option").nth(1 + i).click()
    settle(page)
    button = page.get_by_role("button", name="Remove this source")
    button.evaluate("e => e.scrollIntoView({block: 'center'})")
    return button.click


FLOW_SECTION = "How information flows to the class token"
FLOW_TOGGLE = "Follow the routes to the class token"


def open_flow(page) -> None:
    """The Vision page's flow section unfolded (its toggle in sight)."""
    page.get_by_text(FLOW_SECTION).click()
    page.get_by_text(FLOW_TOGGLE).wait_for()
    settle(page)


def upload_picture(page, i: int) -> None:
    """The i-th of the benchmark's pictures uploaded: a real photo (../shared/images) shifted by i pixels, so each
    is new to the server (its flow not computed yet); the page settled."""
    import io

    from PIL import Image

    photo = Image.open(IMAGES / "dogbird.png").convert("RGB") if IMAGES.is_dir() else Image.new("RGB", (256, 256))
    shifted = photo.crop((i, i, photo.width - 40 + i, photo.height - 40 + i))
    buffer = io.BytesIO()
    shifted.save(buffer, format="PNG")
    uploader = page.locator('[data-testid="stMain"] [data-testid="stFileUploaderDropzoneInput"]')
    uploader.set_input_files(files=[{"name": f"shifted-{i}.png", "mimeType": "image/png", "buffer": buffer.getvalue()}])
    settle(page)


def flow_on(page) -> None:
    upload_picture(page, 0)
    open_flow(page)


_flow_pictures = itertools.count(1)  # every picture of a run of this script another


def toggle_flow(page, i: int) -> Callable[[], None]:
    """Vision, the flow to the class token: (not timed) its toggle off and a new picture uploaded, each settled;
    (timed) the toggle on, the flow of a picture not computed yet."""
    toggle = page.get_by_text(FLOW_TOGGLE)
    if page.get_by_role("switch", name=re.compile(FLOW_TOGGLE)).is_checked():
        toggle.click()
        settle(page)
    upload_picture(page, next(_flow_pictures))
    if not toggle.is_visible():  # a new picture draws the page anew, its sections folded
        open_flow(page)
    toggle.evaluate("e => e.scrollIntoView({block: 'center'})")
    return toggle.click


def flow_layer_on(page) -> None:
    open_flow(page)
    page.get_by_text(FLOW_TOGGLE).click()
    page.get_by_role("slider", name="Before layer").wait_for()
    settle(page)


def step_flow_layer(page, i: int) -> Callable[[], None]:
    """Vision, the flow to the class token on: the "Before layer" slider one step right, then back (timed)."""
    slider = page.get_by_role("slider", name="Before layer")
    slider.evaluate("e => e.scrollIntoView({block: 'center'})")
    slider.focus()
    return lambda: page.keyboard.press("ArrowLeft" if i % 2 else "ArrowRight")


def measure(chosen: list[Interaction], runs: int, url: str, browser, pass_file: Path) -> None:
    for it in chosen:
        page = browser.new_page(viewport=it.window or WINDOW)
        wire = Wire()
        wire.attach(page)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        page.goto(url + it.path)
        settle(page, timeout=600)
        if it.setup is not None:
            it.setup(page)
        for i in range(runs + 1):  # the first: warm-up
            run = timed(page, wire, cdp, pass_file, it.act(page, i), link=it.link)
            if i:
                it.runs.append(run)
        print(f"  {it.name}: {', '.join(f'{r.total:.2f}' for r in it.runs)} s   [{load()}]", flush=True)
        page.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(chosen: list[Interaction], loads: list[str]) -> None:
    print(f"\nClick to settled page, headless Chromium, {len(chosen[0].runs)} runs each (median, 90th pct).")
    header = (
        f"| {'interaction':<50} | median | p90    | budget | before | median/budget | median/before |"
        " to start | server/run | browser | passes |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for it in chosen:
        totals = [r.total for r in it.runs]
        med = statistics.median(totals)
        server = statistics.median([s for r in it.runs for s in r.server] or [0.0])
        browser_s = statistics.median([r.total - r.last_finished for r in it.runs])
        to_start = statistics.median([r.first_started for r in it.runs])
        budget = f"{it.budget:5.2f}s" if it.budget else "    - "
        before = f"{it.before:5.2f}s" if it.before else "    - "
        versus_budget = f"{med / it.budget:8.2f} {'ok' if med <= it.budget else 'over':>4}" if it.budget else " " * 13
        versus_before = f"{med / it.before:13.2f}" if it.before else " " * 13
        print(
            f"| {it.label:<50} | {med:5.2f}s | {pct(totals, 0.9):5.2f}s | {budget} | {before} "
            f"| {versus_budget} | {versus_before} | {to_start:7.2f}s | {server:9.2f}s "
            f"| {browser_s:6.2f}s "
            f"| {sum(r.passes for r in it.runs):6d} |"
        )
    print("\nPer run (medians): script runs per click, bytes received, charts sent in full / from the browser's")
    print("cache, Chromium main-thread time (script, layout, style, all tasks).")
    for it in chosen:
        m = {k: statistics.median([r.cdp[k] for r in it.runs]) for k in CDP_METRICS}
        print(
            f"  {it.name:<13} runs {statistics.median([len(r.server) for r in it.runs]):.0f}, "
            f"{statistics.median([r.bytes for r in it.runs]) / 1024:7.0f} KB, charts "
            f"{statistics.median([r.charts_sent for r in it.runs]):.0f} / "
            f"{statistics.median([r.charts_cached for r in it.runs]):.0f}, "
            f"script {m['ScriptDuration']:.2f}s, layout {m['LayoutDuration']:.2f}s, "
            f"style {m['RecalcStyleDuration']:.2f}s, tasks {m['TaskDuration']:.2f}s"
        )
    print("\nMachine: " + "; ".join(loads))


BESIDE_GOAL = 1.5  # issue 34: a view change beside another student's study within 1.5 x the one without


def studies_report(alone: list[Interaction], beside: list[Interaction], studies: Studies) -> None:
    """Each interaction's median and 90th percentile alone and beside the studies, and their ratio."""
    print(
        f"\nBeside another student's studies ({studies.started} started, {studies.finished} drawn, errors "
        f"{studies.errors[:3] or 'none'}), same server and browser, click to settled:"
    )
    print("| interaction | median alone | median beside | p90 alone | p90 beside | p90 ratio | verdict |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for a, b in zip(alone, beside, strict=True):
        ta, tb = [r.total for r in a.runs], [r.total for r in b.runs]
        ratio = pct(tb, 0.9) / pct(ta, 0.9)
        print(
            f"| {a.label} | {statistics.median(ta):.2f} s | {statistics.median(tb):.2f} s | {pct(ta, 0.9):.2f} s "
            f"| {pct(tb, 0.9):.2f} s | {ratio:.2f} | {'within' if ratio <= BESIDE_GOAL else 'OVER'} "
            f"(<= {BESIDE_GOAL}) |"
        )


def profile(it: Interaction, runs: int, url: str, browser, pass_file: Path, out: Path) -> None:
    """py-spy on the server while `it` is clicked `runs` more times (only the thread holding the GIL is
    sampled: where the server's Python time goes); prints the heaviest functions."""
    pid = int(Path(str(pass_file) + ".pid").read_text())
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    page = browser.new_page(viewport=WINDOW)
    wire = Wire()
    wire.attach(page)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    page.goto(url + it.path)
    settle(page, timeout=600)
    timed(page, wire, cdp, pass_file, it.act(page, 0))
    command = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250", "--gil", "-o", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    for i in range(1, runs + 1):
        timed(page, wire, cdp, pass_file, it.act(page, i))
    proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
    proc.wait(60)
    page.close()
    summarise(out, out.with_suffix(".txt"))


def summarise(folded: Path, out: Path, top: int = 30) -> None:
    """Inclusive and own time of each function in py-spy's folded stacks, by thread: the script thread
    (the page's code) and the others (the event loop: serialising and sending the messages)."""
    lines = []
    for name, is_script in (("script thread", True), ("other threads", False)):
        inclusive: collections.Counter[str] = collections.Counter()
        own: collections.Counter[str] = collections.Counter()
        total = 0
        for line in folded.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            if any("_run_script" in f for f in frames) != is_script:
                continue
            n = int(count)
            total += n
            for f in set(frames):
                inclusive[f] += n
            own[frames[-1]] += n
        lines.append(f"{name}: {total} samples holding the GIL (250/s)")
        lines += ["  inclusive:"] + [f"  {n / max(total, 1):6.1%}  {f}" for f, n in inclusive.most_common(top)]
        lines += ["  own:"] + [f"  {n / max(total, 1):6.1%}  {f}" for f, n in own.most_common(top)]
    out.write_text("\n".join(lines) + "\n")
    print(f"(profile: {out})")


def chosen_interactions(only: list[str] | None, present: bool) -> list[Interaction]:
    """The interactions named (all when none is), each page in presenter mode when `present`."""
    chosen = [it for it in interactions() if not only or it.name in only]
    for it in chosen if present else []:
        it.path += ("&" if "?" in it.path else "?") + "present=1"
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", nargs="*", help="interaction names (text-head, ..., presenter-head: see above)")
    parser.add_argument("--profile", type=Path, help="a folder: py-spy each interaction's server time into it")
    parser.add_argument(
        "--beside-studies",
        action="store_true",
        help="measure again while another browser session studies heads without pause (issue 34), and compare",
    )
    parser.add_argument(
        "--window", default="1400x1000", help="the browser window, WIDTHxHEIGHT (a projector's: 1280x720)"
    )
    parser.add_argument("--present", action="store_true", help="every page in presenter mode (?present=1)")
    args = parser.parse_args()
    width, height = (int(n) for n in args.window.lower().split("x"))
    WINDOW.update(width=width, height=height)
    from playwright.sync_api import sync_playwright

    chosen = chosen_interactions(args.only, args.present)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
        pass_file = folder / "passes"
        env = {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        env["TFORMER_BENCH_PASSES"] = str(pass_file)
        if DEIT.is_dir():
            env |= {"TFORMER_MODEL_DIRS": str(DEIT.parent), "TFORMER_IMAGE_DIRS": str(IMAGES)}
        loads = [f"start: {load()}"]
        with streamlit_server(folder / "streamlit.log", **env) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            measure(chosen, args.runs, url, browser, pass_file)
            loads.append(f"end: {load()}")
            report(chosen, loads)
            if args.beside_studies:
                beside = chosen_interactions(args.only, args.present)
                print(f"\nThe same, while another student studies heads on SmolLM2 without pause ({load()})")
                with Studies(url) as studies:
                    measure(beside, args.runs, url, browser, pass_file)
                    loads.append(f"end, beside the studies: {load()}")
                report(beside, loads)
                studies_report(chosen, beside, studies)
            print(f"(Forward passes counted in the server since it started, page loads included: {passes(pass_file)}.)")
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                for it in chosen:
                    print(f"Profiling the server during {args.runs} more runs of {it.name} ({load()})", flush=True)
                    profile(it, args.runs, url, browser, pass_file, args.profile / f"{it.name}.folded")
            browser.close()


if __name__ == "__main__":
    main()
