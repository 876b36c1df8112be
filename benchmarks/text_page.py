"""The Text attention page itself, on a BERT-base-sized model at 512 tokens: server time and bytes sent.

    python benchmarks/text_page.py [--repeats 7] [--no-browser]

Model: a BERT-base-sized checkpoint (12 layers x 12 heads, d_model 768, BERT's masked-word head)
with random weights, saved in the Hugging Face layout to a temporary model folder with the
bert-base-uncased vocabulary (the one MiniLM ships), and opened by the page as a local folder,
as a user's own checkpoint would be. Input: a text cut by the page to the model's 512 tokens.

1. Server time, measured with Streamlit's AppTest (the page's script run, the element messages
   and the chart data conversion; no browser): the first view of the input, then layer / head
   switches with every view on. Baseline: one traced forward pass of the same model on the same
   input, measured in the same run. Forward passes are counted during the switches (must be 0).
2. Bytes a real browser receives (headless Chromium, Playwright): the page's websocket messages
   and the media files (the overview picture), for the first view and for one head switch; and
   the wall time from choosing a head to the page settling. Baseline: the attention weights of
   the 12 x 12 heads as JSON, as BertViz's model view embeds them (its 6 x 12 view of a 512-token
   input is 869 MB of HTML by BertViz's own count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

import torch
import transformers as T

import tformer_core as tc
from tformer_core.checkpoints.sources import minilm_folder
from tformer_views.text import DEFAULT_SENTENCE

PAGE = str(ROOT / "app_pages" / "text_attention.py")
TEXT = " ".join([DEFAULT_SENTENCE] * 45)  # about 700 tokens: the page cuts it to 512
BUDGET_SWITCH_S = 0.150
BUDGET_BYTES = 3 * 2**20


def make_checkpoint(root: Path) -> Path:
    folder = root / "bert-base-random"
    torch.manual_seed(0)
    model = T.BertForMaskedLM(T.BertConfig())  # BERT-base: 12 x 12, 768, 512 positions
    model.save_pretrained(folder)
    T.AutoTokenizer.from_pretrained(str(minilm_folder())).save_pretrained(folder)
    return folder


def server_times(folder: Path, repeats: int) -> dict:
    from streamlit.testing.v1 import AppTest

    from tests.app.passes import PassCounter
    from tformer_app import models

    def widget(at, key):
        return next(w for w in at.main if getattr(w, "key", None) == key)

    at = AppTest.from_file(PAGE, default_timeout=600)
    at.query_params["model"] = str(folder)
    at.query_params["text"] = TEXT
    start = time.perf_counter()
    at.run()  # loads the model, traces, draws every view
    first_with_load = time.perf_counter() - start
    assert not at.exception, [e.value for e in at.exception]
    n_tokens = next(c.value for c in at.caption if "tokens" in c.value and "layers" in c.value)
    at2 = AppTest.from_file(PAGE, default_timeout=600)  # a second session: model cached, new trace
    at2.query_params["model"] = str(folder)
    at2.query_params["text"] = "One more sentence. " + TEXT  # a new input (the page cuts the end off)
    start = time.perf_counter()
    at2.run()
    first_view = time.perf_counter() - start
    source = str(folder)
    times = []
    with PassCounter(models.cached_model(source)) as counter:
        for i in range(repeats + 1):
            widget(at, "text.layer").set_value((3 * i + 1) % 12)
            widget(at, "text.head").set_value((5 * i + 2) % 12)
            start = time.perf_counter()
            at.run()
            if i:  # the first switch warms up caches
                times.append(time.perf_counter() - start)
            assert not at.exception, [e.value for e in at.exception]
    switch_passes = counter.count
    model = models.cached_model(source)
    fitted = tc.fit_to_model(model, TEXT)
    forward = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.trace(fitted.text)
        forward.append(time.perf_counter() - start)
    trace = model.trace(fitted.text)
    # BertViz's model view embeds every layer's [heads][n][n] weights as JSON.
    weights_json = sum(len(json.dumps(trace.attention(layer).tolist())) for layer in range(trace.n_layers))
    return {
        "tokens": n_tokens,
        "weights_json": weights_json,
        "first_with_load": first_with_load,
        "first_view": first_view,
        "switch": statistics.median(times),
        "switch_max": max(times),
        "forward": statistics.median(forward),
        "switch_passes": switch_passes,
    }


def browser_bytes(folder: Path, root: Path) -> dict | None:
    from browser.server import streamlit_server

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("(browser part skipped: playwright is not installed)")
        return None
    chromium = os.environ.get("TFORMER_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        print(f"(browser part skipped: no Chromium at {chromium})")
        return None
    from browser.helpers import choose, settle

    os.environ["TFORMER_MODEL_DIRS"] = str(root)
    received = {"ws": 0, "media": 0}
    media_files: list[tuple[str, int]] = []

    def on_ws(ws):
        ws.on("framereceived", lambda payload: received.__setitem__("ws", received["ws"] + len(payload)))

    def on_response(response):
        if "/media/" in response.url and "/static/" not in response.url:  # not Streamlit's own fonts
            size = len(response.body())
            received["media"] += size
            media_files.append((response.url.rsplit("/", 1)[-1], size))

    from urllib.parse import urlencode

    with streamlit_server(root / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("websocket", on_ws)
        page.on("response", on_response)
        page.goto(f"{url}/text?{urlencode({'model': str(folder), 'text': TEXT})}")
        settle(page, timeout=600)
        first = dict(received)
        received.update(ws=0, media=0)
        start = time.perf_counter()
        choose(page, "Head", "7")
        settle(page)
        switch_wall = time.perf_counter() - start - 1.0  # settle() waits 1 s of quiet
        switch = dict(received)
        browser.close()
    return {"first": first, "switch": switch, "switch_wall": switch_wall, "media_files": media_files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TFORMER_DEVICE", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = make_checkpoint(root)
        os.environ["TFORMER_MODEL_DIRS"] = str(root)
        s = server_times(folder, args.repeats)
        b = None if args.no_browser else browser_bytes(folder, root)

    print(
        f"Text attention page, BERT-base-sized checkpoint (random weights), {s['tokens']}; CPU, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads.\n"
    )
    print("1. Server time (AppTest: script run + element messages + chart data)")
    print("| what                                   |       ours |   baseline | baseline is            | ratio |")
    print("|----------------------------------------|------------|------------|------------------------|-------|")
    rows = [
        ("first view (model loaded, new input)", s["first_view"], s["forward"], "one traced forward"),
        ("layer/head switch, all views (median)", s["switch"], s["forward"], "one traced forward"),
        ("layer/head switch, all views (slowest)", s["switch_max"], s["forward"], "one traced forward"),
    ]
    for what, ours, base, label in rows:
        print(f"| {what:<38} | {ours * 1e3:>7.0f} ms | {base * 1e3:>7.0f} ms | {label:<22} | {ours / base:>5.2f} |")
    verdict = "within" if s["switch"] <= BUDGET_SWITCH_S and s["switch_passes"] == 0 else "OVER"
    print(
        f"Forward passes during {args.repeats + 1} switches: {s['switch_passes']} (must be 0). "
        f"Budget for a switch: <= 150 ms and 0 passes: {verdict}. "
        f"(First session, model loading included: {s['first_with_load']:.1f} s.)\n"
    )
    if b is None:
        return
    json_weights = s["weights_json"]
    print("2. Bytes a real browser receives (headless Chromium)")
    print("| what                          |   websocket |    media |    total | baseline: weights as JSON | ratio   |")
    print("|-------------------------------|-------------|----------|----------|---------------------------|---------|")
    for what, r in (("first view, every view on", b["first"]), ("switch to head 7", b["switch"])):
        total = r["ws"] + r["media"]
        print(
            f"| {what:<29} | {r['ws'] / 2**20:>8.2f} MB | {r['media'] / 2**20:>5.2f} MB | {total / 2**20:>5.2f} MB "
            f"| {json_weights / 2**20:>22.0f} MB | {total / json_weights:.1e} |"
        )
    print("Media files fetched: " + ", ".join(f"{name} {size / 2**10:.0f} KB" for name, size in b["media_files"]))
    print(
        f"Browser wall time from choosing a head to a settled page: {b['switch_wall'] * 1e3:.0f} ms "
        "(network, server and drawing the charts in Chromium)."
    )
    print(
        "Budget for the overview: <= 3 MB sent; whole first view: "
        f"{(b['first']['ws'] + b['first']['media']) / 2**20:.2f} MB."
    )


if __name__ == "__main__":
    main()
