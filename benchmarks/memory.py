"""Server memory under the inputs that once took a class's server from 1.8 GB to 17 GB, today's code beside ours.

    python benchmarks/memory.py                       # ours, and the baseline commit (a git worktree) beside it
    python benchmarks/memory.py --skip-baseline       # ours only
    python benchmarks/memory.py --baseline-rev <rev>  # another baseline

Each server is started fresh (`streamlit run app.py` of its tree, offline, on the CPU) and driven by one
simulated browser (benchmarks/stclient.py) through, in order:

    warm-up      the Text attention page and the Mean attention distance page with their defaults
                 (MiniLM and vit-tiny loaded, a first trace of each)
    (a) text     64 distinct 512-token sentences typed into the Text attention page, one after another
    (b) distance 64 distinct 512-token lines on the Mean attention distance page, then 64 other ones
    (c) pictures 20 distinct 56-megapixel pictures (PNG, 8640 x 6480) uploaded to that page at once
    cleared      ours: the Server page's "Clear cached results" (TFORMER_ADMIN=1); the baseline has no
                 such control, so it gets Streamlit's own "Clear caches" (st.cache_*, models included);
                 then every session is closed

and the server's resident memory (RSS, /proc) is read after each step, with the peak since the start.
Goal (ours): RSS stays under the results budget (TFORMER_CACHE_MB) + the loaded models + the
post-warm-up level, and falls back to within 10 % of the post-warm-up level once the caches are cleared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from stclient import Session
from streamlit.proto.BackMsg_pb2 import BackMsg

BASELINE_REV = "443d66d"  # the code before the memory work (issue 12)
MB = 2**20
PICTURE_WH = (8640, 6480)  # 56 megapixels
WORDS = [
    "the",
    "animal",
    "street",
    "river",
    "teacher",
    "student",
    "model",
    "head",
    "layer",
    "token",
    "sentence",
    "picture",
    "quiet",
    "red",
    "long",
    "because",
    "although",
    "while",
    "after",
    "before",
    "near",
    "under",
    "over",
    "runs",
    "reads",
    "looks",
    "sees",
    "finds",
    "keeps",
    "carries",
    "a",
    "an",
    "old",
    "new",
    "small",
    "large",
    "bright",
    "dark",
    "early",
    "late",
    "every",
    "some",
    "many",
    "few",
]


def sentences(n: int, seed: int) -> list[str]:
    """n distinct texts of about 700 words: the page cuts each to MiniLM's 512 tokens."""
    rng = random.Random(seed)
    return [f"Text {seed}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(700)) for i in range(n)]


def pictures(n: int, folder: Path) -> list[tuple[str, bytes, str]]:
    """n distinct 56-megapixel PNGs (smooth colours: a few hundred kB each, under the upload limit),
    made once and kept in `folder`."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = folder / f"big-{i}.png"
        if not path.exists():
            w, h = PICTURE_WH
            row = np.linspace(0, 255, w, dtype=np.float32)
            rgb = np.stack([row, row[::-1], np.full(w, (37 * i) % 256, np.float32)], axis=-1).astype(np.uint8)
            image = Image.fromarray(np.broadcast_to(rgb, (h, w, 3)).copy())
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", compress_level=9)
            path.write_bytes(buffer.getvalue())
        out.append((path.name, path.read_bytes(), "image/png"))
    return out


def rss(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak(pid: int) -> None:
    """Start a new peak (VmHWM) for the next step (Linux: clear_refs 5); a no-op where not allowed."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(tree: Path, log: Path, **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TFORMER_DEVICE": "cpu", **env}
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
    command += ["--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=tree, env=environment, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/_stcore/health", timeout=2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the server of {tree} stopped:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


async def settled(session: Session, label: str, value: str) -> None:
    run = await session.set_value(label, value)
    if run.exceptions:
        raise RuntimeError(f"{label}: the page raised {run.exceptions[0][:300]}")


async def drive(url: str, pid: int, ours: bool, picture_files: list[tuple[str, bytes, str]]) -> dict[str, int]:
    """The steps of the module docstring; returns RSS after each (and "peak")."""
    figures: dict[str, int] = {}
    text = await Session.open(url, "/text", timeout_s=900)
    distance = await Session.open(url, "/distance", timeout_s=900)
    figures["warm-up"] = rss(pid)[0]
    reset_peak(pid)
    for i, sentence in enumerate(sentences(64, seed=1)):
        await settled(text, "Sentence", sentence)
        if i % 16 == 15:
            print(f"  (a) {i + 1} sentences, RSS {rss(pid)[0] / MB:,.0f} MB", flush=True)
    figures["(a) 64 sentences, text page"], figures["(a) peak"] = rss(pid)
    reset_peak(pid)
    for seed in (2, 3):
        await settled(distance, "Sentences, one per line", "\n".join(sentences(64, seed=seed)))
        print(f"  (b) 64 lines, RSS {rss(pid)[0] / MB:,.0f} MB", flush=True)
    figures["(b) 2 x 64 lines, distance page"], figures["(b) peak"] = rss(pid)
    reset_peak(pid)
    run = await distance.upload_files("And your own pictures", picture_files)
    if run.exceptions:
        raise RuntimeError(f"pictures: the page raised {run.exceptions[0][:300]}")
    figures["(c) 20 x 56 MP pictures, distance page"], figures["(c) peak"] = rss(pid)
    if ours:
        admin = await Session.open(url, "/server", timeout_s=300)
        await admin.click("Clear cached results")
        await admin.close()
    else:  # Streamlit's own "Clear caches" (the C key in developer mode): st.cache_data and st.cache_resource
        msg = BackMsg()
        msg.clear_cache = True
        await text._send(msg)
        await asyncio.sleep(2)
    for session in (text, distance):
        await session.close()
    await asyncio.sleep(15)  # sessions end on disconnect; their uploads, media and state go with them
    figures["caches cleared, sessions closed"] = rss(pid)[0]
    return figures


def measure(tree: Path, ours: bool, picture_files: list[tuple[str, bytes, str]], log: Path) -> dict[str, int]:
    print(f"{'ours' if ours else 'baseline'}: {tree}", flush=True)
    env = {"TFORMER_ADMIN": "1"} if ours else {}
    with server(tree, log, **env) as (url, proc):
        return asyncio.run(drive(url, proc.pid, ours, picture_files))


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tformer-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), rev], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)


def report(ours: dict[str, int], baseline: dict[str, int] | None, budget_mb: float) -> None:
    print()
    print("| step | baseline RSS | ours RSS | ours / baseline |")
    print("|---|---:|---:|---:|")
    for step, value in ours.items():
        base = baseline.get(step) if baseline else None
        ratio = f"{value / base:.2f}" if base else "-"
        base_text = f"{base / MB:,.0f} MB" if base else "-"
        print(f"| {step} | {base_text} | {value / MB:,.0f} MB | {ratio} |")
    warm = ours["warm-up"]
    ceiling = warm + budget_mb * MB
    steady = max(v for k, v in ours.items() if k[0] == "(" and "peak" not in k)
    peak = max(v for k, v in ours.items() if "peak" in k)
    print()
    print(
        f"Ours: post-warm-up {warm / MB:,.0f} MB (MiniLM and vit-tiny loaded: the models of these pages) + the "
        f"results budget {budget_mb:,.0f} MB (TFORMER_CACHE_MB) = {ceiling / MB:,.0f} MB; after each step at most "
        f"{steady / MB:,.0f} MB ({'within' if steady <= ceiling else 'OVER'}); peak during a step "
        f"{peak / MB:,.0f} MB ({'within' if peak <= ceiling else 'OVER'}: a forward pass's activations, freed "
        "memory not yet handed back)."
    )
    back = ours["caches cleared, sessions closed"] / warm
    print(
        f"After clearing: {back:.2f} x the post-warm-up level (goal <= 1.10): {'within' if back <= 1.10 else 'OVER'}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--skip-baseline", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tformer_app.settings import server_settings

    settings = server_settings()
    cache = Path(tempfile.gettempdir()) / "tformer-memory-benchmark"
    picture_files = pictures(20, cache / "pictures")
    print(
        f"Load average at the start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; "
        f"{sum(len(d) for _, d, _ in picture_files) / MB:.1f} MB of pictures"
    )
    logs = Path(tempfile.mkdtemp(prefix="tformer-memory-logs-"))
    baseline = None
    if not args.skip_baseline:
        with worktree(args.baseline_rev) as tree:
            baseline = measure(tree, False, picture_files, logs / "baseline.log")
    ours = measure(ROOT, True, picture_files, logs / "ours.log")
    report(ours, baseline, settings.cache_bytes / MB)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}. Server logs: {logs}")


if __name__ == "__main__":
    main()
