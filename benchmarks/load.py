"""A class on one server: N simulated students drive the app through its websocket protocol, as browsers do.

    python benchmarks/load.py --url http://127.0.0.1:8501 --sessions 20 --duration 120
    python benchmarks/load.py --start 2 --sessions 20 --duration 120      # 2 replicas behind nginx (deploy/)
    python benchmarks/load.py --start 2 --app /tmp/baseline/app.py ...    # replicas of another checkout

With --start, each replica first opens the Text attention and Vision Transformer pages once (on --text-model and
--vision-model), as deploy/serve.py does before a class; --cold leaves them cold (a fresh replica's first visit
imports torch, starts the device and loads the model while the students who arrived wait).

Each session (benchmarks/stclient.py: cookies, websocket, widget state, uploads, media, as a browser)
runs a lecture's loop with think times (uniform, 0.5 to 1.5 x --think seconds; seeded):

    open the Text attention page (a new session on /text)
    repeat until --duration is over:
        1 to 3 times: a new sentence (--shared of them the lecture's, the rest the student's own),
                      a layer change, a head change
        the first time and then every other time:
            open the Vision Transformer page (the sidebar link; --vision-model as a link's ?model=),
            pick another sample picture, or (--photos of the times) upload a photo of one's own (12 megapixels,
            a JPEG of about 4.5 MB, each upload a different one), click a patch of the picture (the chart's
            point selection), back to the Text attention page ("open page")

An action's time is from its first byte sent to the end of the script run it caused (the pictures it
shows are fetched after that, as a browser does, and not counted). An error is an action that raised
(time-out, closed connection, a widget missing) or whose run showed an exception or an error message.

Prints per action kind: count, p50, p95, max seconds, mean kB received, errors; the throughput; the
server's CPU (per process, from /proc, in cores: 1.0 = one core busy) and RSS (per process, and the
replicas' sum at its peak and at the end); on a machine with an NVIDIA GPU, each replica's GPU memory (peak
and end, from nvidia-smi) and the GPU's utilisation; this process's and the whole machine's CPU, so the load
of others on a shared machine shows; and the load average at the start and the end. Loopback servers only.
--p95-goal S adds a verdict: the p95 of every view change (layer, head, patch) within S seconds, no errors.
--text-model opens the Text attention page on that model (a link's ?model=, as --vision-model does for the Vision
Transformer page), when and back. --json PATH writes the figures to that file too (benchmarks/gpu/check.py).

On a GPU machine (issue 23's figure: 100 sessions, p95 of every view change <= 1.0 s, 0 errors):

    python benchmarks/load.py --start 16 --sessions 100 --duration 300 --vision-model <a ViT> --p95-goal 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import random
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from stclient import ProtocolError, Session

from deploy.serve import Deployment, _children, print_warmed

MAX_SESSIONS = 200
MAX_DURATION_S = 15 * 60
KINDS = (
    "open page",
    "new sentence",
    "layer change",
    "head change",
    "open vision",
    "sample",
    "upload photo",
    "patch click",
)
SHARED_SENTENCES = (  # what the lecturer puts on the slide: everyone types the same
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "The cat sat on the mat because it was warm.",
    "Attention is all you need.",
)
WORDS = {  # a student's own sentences: mostly different from everyone's
    "who": ["my sister", "the old teacher", "a tired dog", "the robot", "our neighbour", "the pilot", "a small bird"],
    "did": ["painted", "carried", "forgot", "found", "followed", "watched", "repaired", "described"],
    "what": ["the red bicycle", "a long letter", "the broken clock", "an empty box", "the last train", "a quiet song"],
    "why": ["before it rained", "because it was late", "after the meeting", "while everyone slept", "near the river"],
}


# ---- the class ------------------------------------------------------------------------------------------
@dataclass
class Record:
    kind: str
    seconds: float
    kbytes: float
    error: str = ""


@dataclass
class Results:
    records: list[Record] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def add(self, kind: str, seconds: float, kbytes: float = 0.0, error: str = "") -> None:
        self.records.append(Record(kind, seconds, kbytes, error))


@dataclass(frozen=True)
class Plan:
    base_url: str
    deadline: float
    think_s: float
    shared: float
    vision_model: str | None
    timeout_s: float
    photo_share: float = 0.0  # of the vision rounds that upload a photo instead of picking a sample
    photos: tuple[tuple[str, bytes, str], ...] = ()  # (name, bytes, MIME type), each uploaded once in turn
    text_model: str | None = None  # the Text attention page's model, in its links (None: the page's default)

    @property
    def text_query(self) -> str:
        return model_query(self.text_model)

    @property
    def vision_query(self) -> str:
        return model_query(self.vision_model)


def model_query(model: str | None) -> str:
    """A link's query string that opens a page on `model` ("" for the page's default)."""
    return f"model={urllib.parse.quote(model)}" if model else ""


def with_query(path: str, query: str) -> str:
    return f"{path}?{query}" if query else path


class PhotoPool:
    """Distinct photos handed out one per upload (round robin once all were used)."""

    def __init__(self, photos: tuple[tuple[str, bytes, str], ...]) -> None:
        self.photos, self.next = photos, 0

    def take(self) -> tuple[str, bytes, str]:
        photo = self.photos[self.next % len(self.photos)]
        self.next += 1
        return photo


def own_sentence(rng: random.Random) -> str:
    w = {k: rng.choice(v) for k, v in WORDS.items()}
    return f"Yesterday {w['who']} {w['did']} {w['what']} {w['why']}, and nobody knew why it mattered."


def another(options: list[str], current: object, rng: random.Random) -> str:
    """A different option from the current one (a user changes something)."""
    choices = [o for o in options if o != current] or options
    return rng.choice(choices)


class Student:
    """One simulated user: a session and the loop of the lecture."""

    def __init__(self, index: int, plan: Plan, results: Results, seed: int, pool: PhotoPool | None = None) -> None:
        self.index, self.plan, self.results, self.pool = index, plan, results, pool
        self.rng = random.Random(seed * 1_000_003 + index)
        self.session: Session | None = None

    async def act(self, kind: str, action) -> bool:
        """Run one action, record it; False when it failed (the student then reloads the page)."""
        start = time.perf_counter()
        try:
            run = await action()
        except (ProtocolError, TimeoutError, OSError, LookupError, ValueError) as error:
            # The session is not where the loop thinks (closed, still waiting, another page): start again.
            self.results.add(kind, time.perf_counter() - start, error=f"{type(error).__name__}: {error}"[:160])
            return False
        error = "; ".join(run.errors)[:160]
        self.results.add(kind, run.elapsed_s, run.n_bytes / 1e3, error)
        return True

    async def think(self) -> None:
        await asyncio.sleep(self.plan.think_s * self.rng.uniform(0.5, 1.5))

    def time_left(self) -> bool:
        return time.monotonic() < self.plan.deadline

    async def open(self) -> bool:
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
        self.session = Session(self.plan.base_url, timeout_s=self.plan.timeout_s)
        page = with_query("/text", self.plan.text_query)
        return await self.act("open page", lambda: self.session.connect(page))

    async def text_round(self) -> bool:
        s, rng = self.session, self.rng
        current = s.value("Sentence", "text_area")
        sentence = current
        while sentence == current:  # a browser sends nothing for an unchanged text
            sentence = rng.choice(SHARED_SENTENCES) if rng.random() < self.plan.shared else own_sentence(rng)
        steps = [
            ("new sentence", lambda: s.set_value("Sentence", sentence, "text_area")),
            ("layer change", lambda: s.set_value("Layer", self.pick("Layer"), "selectbox")),
            ("head change", lambda: s.set_value("Head", self.pick("Head"), "selectbox")),
        ]
        return await self.steps(steps)

    async def vision_round(self) -> bool:
        s = self.session
        query = self.plan.vision_query
        upload = self.pool is not None and self.rng.random() < self.plan.photo_share
        steps = [
            ("open vision", lambda: s.switch_page("vision", query)),
            ("upload photo", self.upload_photo) if upload else ("sample", self.pick_sample),
            ("patch click", self.click_patch),
            ("open page", lambda: s.switch_page("text", self.plan.text_query)),
        ]
        return await self.steps(steps)

    async def pick_sample(self):
        s = self.session
        if s.value("Picture", "radio") != "Sample":  # a photo was uploaded last time
            await s.set_value("Picture", "Sample", "radio")
        return await s.set_value("Sample", self.pick("Sample"), "selectbox")

    async def upload_photo(self):
        s = self.session
        if s.value("Picture", "radio") != "Upload":
            await s.set_value("Picture", "Upload", "radio")
        label = next(w.label for w in s.last.widgets() if w.kind == "file_uploader" and w.key == "vit.upload")
        return await s.upload_files(label, [self.pool.take()])

    async def steps(self, steps) -> bool:
        for kind, action in steps:
            if not self.time_left():
                return True
            await self.think()
            if not await self.act(kind, action):
                return False
        return True

    def pick(self, label: str) -> str:
        widget = self.session.last.widget(label, "selectbox")
        return another(widget.options, self.session.value(label, "selectbox"), self.rng)

    async def click_patch(self):
        s = self.session
        n = len(s.last.widget("Query", "selectbox").options) - 1  # "the class token", "patch 0", ...
        current = s.value("Query", "selectbox")
        patch = self.rng.choice([p for p in range(n) if f"patch {p}" != current])
        return await s.select("vit.picker", "patch", [{"patch": patch}])

    async def lecture(self, start_at: float) -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        ok = await self.open()
        cycle = 0
        while self.time_left():
            if not ok:  # a broken session: the student reloads the page
                await self.think()
                ok = await self.open()
                continue
            for _ in range(self.rng.randint(1, 3)):
                ok = ok and await self.text_round()
            if ok and cycle % 2 == 0:
                ok = await self.vision_round()
            cycle += 1
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()


LABEL = "Text (the model predicts the next token)"  # the /heads page's text box for a language model


class StudyStudent(Student):
    """A student who studies heads (issue 34): opens "Does this head matter?" on SmolLM2 with a text of their own
    of about 30 tokens (within TFORMER_REQUEST_GFLOP's default, so every study runs: tens of seconds of both
    cores), waits for the whole page (the study, the patching grid, induction heads), then types another."""

    TIMEOUT_S = 900.0  # a study queued behind others' at a loaded machine's pace

    def text(self, round_: int) -> str:
        w = {k: self.rng.choice(v) for k, v in WORDS.items()}
        return (
            f"In round {round_} student {self.index} wrote that {w['who']} {w['did']} {w['what']} {w['why']}, "
            "and then the capital of France is"
        )

    async def lecture(self, start_at: float) -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        self.session = Session(self.plan.base_url, timeout_s=self.TIMEOUT_S)
        query = "text=" + urllib.parse.quote(self.text(0))
        ok = await self.act("study", lambda: self.session.connect(f"/heads?{query}"))
        round_ = 1
        while ok and self.time_left():
            await self.think()
            text = self.text(round_)
            ok = await self.act(
                "study", lambda text=text: self.session.set_value(None, text, "text_input", "heads.text")
            )
            round_ += 1
        with contextlib.suppress(Exception):
            await self.session.close()


# ---- the server, seen from /proc ----------------------------------------------------------------------------
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_bytes(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return None


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (from /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS, sum(values[:8]) / TICKS


def command(pid: int) -> str:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(p.decode(errors="replace") for p in parts if p)
    return text if len(text) <= 60 else text[:57] + "..."


def listener_pid(port: int) -> int | None:
    """The process listening on this TCP port (from /proc/net/tcp and the processes' sockets)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


VIEW_CHANGES = ("layer change", "head change", "patch click")  # what the p95 goal is about (no new input)


def gpu_sample() -> tuple[dict[int, float], float | None, float | None]:
    """(GPU MB per process id, the GPU's utilisation %, its memory used MB) from nvidia-smi (the first GPU);
    ({}, None, None) without one. Processes in another PID namespace (a container) may not be listed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}, None, None
    try:
        apps = subprocess.run(
            [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        gpu = subprocess.run(
            [smi, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()[0]
        per_process = {int(pid): float(mb) for pid, mb in (line.split(",") for line in apps.splitlines() if line)}
        utilisation, used = (float(v) for v in gpu.split(","))
        return per_process, utilisation, used
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}, None, None


@dataclass
class Watched:
    role: str  # "replica" (counted in the RSS sum) or "nginx"
    pid: int
    cpu_start: float
    cpu_end: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0
    rss_end: int = 0
    gpu_peak_mb: float | None = None  # None: not seen on a GPU
    gpu_end_mb: float | None = None


class Monitor:
    """Samples the server's processes every second: CPU time, RSS; and the machine's load."""

    def __init__(self, processes: dict[int, str]) -> None:
        self.watched = [Watched(role, pid, cpu_seconds(pid) or 0.0) for pid, role in processes.items()]
        for w in self.watched:
            w.rss_start = w.rss_peak = w.rss_end = rss_bytes(w.pid) or 0
        self.sum_peak = self.replica_rss()
        self.loads: list[float] = []
        self.gpu_utilisation: list[float] = []
        self.gpu_used_peak: float | None = None
        self.machine_start = machine_busy()
        self.self_start = self._self_cpu()
        self.wall_start = time.monotonic()
        self.wall = 0.0
        self.machine_cores = 0.0
        self.self_cores = 0.0

    @staticmethod
    def _self_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def replica_rss(self) -> int:
        return sum(w.rss_end for w in self.watched if w.role == "replica")

    def sample(self) -> None:
        for w in self.watched:
            rss = rss_bytes(w.pid)
            if rss is not None:
                w.rss_end, w.rss_peak = rss, max(w.rss_peak, rss)
            cpu = cpu_seconds(w.pid)
            if cpu is not None:
                w.cpu_end = cpu
        self.sum_peak = max(self.sum_peak, self.replica_rss())
        self.loads.append(os.getloadavg()[0])
        per_process, utilisation, used = gpu_sample()
        for w in self.watched:
            if w.pid in per_process:
                w.gpu_end_mb = per_process[w.pid]
                w.gpu_peak_mb = max(w.gpu_peak_mb or 0.0, w.gpu_end_mb)
        if utilisation is not None and used is not None:
            self.gpu_utilisation.append(utilisation)
            self.gpu_used_peak = max(self.gpu_used_peak or 0.0, used)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)  # nvidia-smi takes tens of ms: not on the sessions' loop
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        self.sample()
        self.wall = time.monotonic() - self.wall_start
        busy, _ = machine_busy()
        self.machine_cores = (busy - self.machine_start[0]) / self.wall
        self.self_cores = (self._self_cpu() - self.self_start) / self.wall


# ---- the report --------------------------------------------------------------------------------------------
def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of values sorted ascending."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def action_stats(results: Results) -> list[dict]:
    """Per action kind, then "all": count, p50, p95 and max seconds, mean kB received, errors."""
    by_kind: dict[str, list[Record]] = defaultdict(list)
    for r in results.records:
        by_kind[r.kind].append(r)
    out = []
    for kind in [*KINDS, "study", "all"]:
        records = results.records if kind == "all" else by_kind.get(kind, [])
        if records:
            times = sorted(r.seconds for r in records)
            out.append(
                {
                    "action": kind,
                    "count": len(records),
                    "p50_s": percentile(times, 50),
                    "p95_s": percentile(times, 95),
                    "max_s": times[-1],
                    "kb_mean": statistics.mean(r.kbytes for r in records),
                    "errors": sum(1 for r in records if r.error),
                }
            )
    return out


def action_table(results: Results) -> None:
    wall = results.ended - results.started
    by_kind: dict[str, list[Record]] = defaultdict(list)
    for r in results.records:
        by_kind[r.kind].append(r)
    print("| action | count | p50 s | p95 s | max s | kB received (mean) | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in [*KINDS, "study", "all"]:
        records = results.records if kind == "all" else by_kind.get(kind, [])
        if not records:
            continue
        times = sorted(r.seconds for r in records)
        kb = statistics.mean(r.kbytes for r in records)
        errors = sum(1 for r in records if r.error)
        name = f"**{kind}**" if kind == "all" else kind
        print(
            f"| {name} | {len(records)} | {percentile(times, 50):.2f} | {percentile(times, 95):.2f} "
            f"| {times[-1]:.2f} | {kb:.0f} | {errors} |"
        )
    print(f"\nThroughput: {len(results.records) / wall:.2f} actions/s over {wall:.0f} s.")
    messages = defaultdict(int)
    for r in results.records:
        if r.error:
            messages[f"{r.kind}: {r.error}"] += 1
    for message, n in sorted(messages.items(), key=lambda item: -item[1])[:5]:
        print(f"  error x{n}: {message}")


def server_table(monitor: Monitor, cores: int) -> None:
    mb = 2**20
    print("\n| process | pid | CPU s | cores (mean) | RSS start MB | RSS peak MB | RSS end MB | command |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    total = 0.0
    for w in monitor.watched:
        cpu = w.cpu_end - w.cpu_start
        total += cpu
        print(
            f"| {w.role} | {w.pid} | {cpu:.1f} | {cpu / monitor.wall:.2f} | {w.rss_start / mb:.0f} "
            f"| {w.rss_peak / mb:.0f} | {w.rss_end / mb:.0f} | `{command(w.pid)}` |"
        )
    n_replicas = sum(1 for w in monitor.watched if w.role == "replica")
    print(
        f"| **server** | | {total:.1f} | {total / monitor.wall:.2f} of {cores} | "
        f"{sum(w.rss_start for w in monitor.watched if w.role == 'replica') / mb:.0f} "
        f"| {monitor.sum_peak / mb:.0f} (sum) | {monitor.replica_rss() / mb:.0f} | {n_replicas} app process(es) |"
    )
    others = monitor.machine_cores - total / monitor.wall - monitor.self_cores
    print(
        f"\nMachine: {monitor.machine_cores:.2f} of {cores} cores busy on average: server "
        f"{total / monitor.wall:.2f}, this load generator {monitor.self_cores:.2f}, everything else {others:.2f}."
    )
    if monitor.loads:
        mean, peak = statistics.mean(monitor.loads), max(monitor.loads)
        print(f"Load average (1 min) during the run: mean {mean:.2f}, max {peak:.2f}.")
    gpu_table(monitor)


def gpu_table(monitor: Monitor) -> None:
    """Each replica's GPU memory and the GPU's utilisation, when nvidia-smi answered."""
    if not monitor.gpu_utilisation:
        return
    print("\n| replica pid | GPU MB peak | GPU MB end |")
    print("|---:|---:|---:|")
    for w in monitor.watched:
        if w.role == "replica":
            peak = "not listed" if w.gpu_peak_mb is None else f"{w.gpu_peak_mb:.0f}"
            end = "not listed" if w.gpu_end_mb is None else f"{w.gpu_end_mb:.0f}"
            print(f"| {w.pid} | {peak} | {end} |")
    u = monitor.gpu_utilisation
    print(
        f"GPU: utilisation mean {statistics.mean(u):.0f} %, max {max(u):.0f} %; memory used (every process) "
        f"peak {monitor.gpu_used_peak:.0f} MB."
    )


def p95_verdict(results: Results, goal: float) -> dict:
    """Issue 23's class figure: the p95 of every view change within `goal` seconds, and no errors at all."""
    parts, worst = [], 0.0
    for kind in VIEW_CHANGES:
        times = sorted(r.seconds for r in results.records if r.kind == kind)
        if times:
            p95 = percentile(times, 95)
            worst = max(worst, p95)
            parts.append(f"{kind} {p95:.2f} s")
    errors = sum(1 for r in results.records if r.error)
    within = bool(parts) and worst <= goal and errors == 0
    verdict = "within" if within else "OVER"
    print(f"\nView changes p95: {', '.join(parts)}; errors {errors}: {verdict} (goal <= {goal} s, 0 errors).")
    return {"goal_s": goal, "worst_view_change_p95_s": worst, "errors": errors, "within": within}


def report(args: argparse.Namespace, results: Results, monitor: Monitor, verdict: dict | None) -> dict:
    """The run's figures as data (--json)."""
    replicas = [w for w in monitor.watched if w.role == "replica"]
    wall = results.ended - results.started
    u = monitor.gpu_utilisation
    return {
        "sessions": args.sessions,
        "duration_s": args.duration,
        "replicas": len(replicas),
        "actions": action_stats(results),
        "throughput_per_s": len(results.records) / wall if wall > 0 else None,
        "verdict": verdict,
        "replica_rss_peak_mb": [w.rss_peak / 2**20 for w in replicas],
        "replica_rss_sum_peak_mb": monitor.sum_peak / 2**20,
        "replica_gpu_peak_mb": [w.gpu_peak_mb for w in replicas],
        "gpu_utilisation_mean": statistics.mean(u) if u else None,
        "gpu_utilisation_max": max(u) if u else None,
        "gpu_memory_used_peak_mb": monitor.gpu_used_peak,
        "server_cores_mean": sum(w.cpu_end - w.cpu_start for w in monitor.watched) / monitor.wall,
        "errors": sorted({f"{r.kind}: {r.error}" for r in results.records if r.error})[:5],
    }


def nginx_summary(log: str) -> None:
    """What nginx's access log says: requests, answers by status class, requests that failed over."""
    lines = log.splitlines()
    statuses = defaultdict(int)
    for line in lines:
        match = re.search(r'HTTP/[0-9.]+" (\d)\d\d ', line)
        statuses[f"{match.group(1)}xx" if match else "?"] += 1
    failovers = sum(1 for line in lines if re.search(r'upstream="[^"]*, ', line))
    by_status = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    print(f"nginx: {len(lines)} requests ({by_status}); {failovers} answered by another replica after a failure.")


# ---- running it --------------------------------------------------------------------------------------------
def loopback_url(url: str) -> str:
    """The URL if its host is this machine's loopback; ValueError otherwise (this tool loads local servers only)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(f"{url!r}: give an http://host:port URL")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parsed.hostname, parsed.port or 80)}
    except socket.gaierror as error:
        raise ValueError(f"{parsed.hostname!r} does not resolve: {error}") from error
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise ValueError(f"{parsed.hostname!r} is not a loopback address ({sorted(addresses)}): refused")
    return url.rstrip("/")


async def run_class(args: argparse.Namespace, base_url: str, processes: dict[int, str]) -> dict:
    if not args.studies:
        return (await run_phase(args, base_url, processes, 0))[1]
    # Issue 34: the same class without, then with, students studying heads; same server, same seed.
    async with await Session.open(base_url, "/heads", timeout_s=StudyStudent.TIMEOUT_S) as warm:
        if warm.last is not None and warm.last.errors:
            print(f"(warm-up of /heads: {warm.last.errors[:2]})")
    print(f"\n## Without studies: {args.sessions} students")
    without, without_report = await run_phase(args, base_url, processes, 0)
    print(f"\n## With {args.studies} students studying heads on SmolLM2 (about 30 tokens each): {args.sessions} others")
    with_, with_report = await run_phase(args, base_url, processes, args.studies)
    ratio = studies_table(without, with_, args.studies)
    return {"without_studies": without_report, "with_studies": with_report, "others_p95_ratio": ratio}


async def run_phase(
    args: argparse.Namespace, base_url: str, processes: dict[int, str], studies: int
) -> tuple[Results, dict]:
    results = Results()
    monitor = Monitor(processes)
    stop = asyncio.Event()
    watcher = asyncio.create_task(monitor.run(stop))
    results.started = time.perf_counter()
    now = time.monotonic()
    photos = photo_files(args.photo_files) if args.photos > 0 else ()
    plan = Plan(
        base_url,
        now + args.duration,
        args.think,
        args.shared,
        args.vision_model,
        args.timeout,
        args.photos,
        photos,
        args.text_model,
    )
    ramp = min(args.ramp, args.duration / 4)
    pool = PhotoPool(photos) if photos else None
    students = [Student(i, plan, results, args.seed, pool) for i in range(args.sessions)]
    students += [StudyStudent(args.sessions + i, plan, results, args.seed) for i in range(studies)]
    try:
        await asyncio.gather(*(s.lecture(now + ramp * i / len(students)) for i, s in enumerate(students)))
    finally:
        results.ended = time.perf_counter()
        stop.set()
        await watcher
    print()
    action_table(results)
    verdict = p95_verdict(results, args.p95_goal) if args.p95_goal is not None else None
    server_table(monitor, os.cpu_count() or 1)
    return results, report(args, results, monitor, verdict)


STUDIES_GOAL = 1.5  # issue 34: the others' p95 with 3 studies running within 1.5 x the run without


def studies_table(without: Results, with_: Results, studies: int) -> float:
    """Each action's p50 and p95 without and with the studies, their ratio, and the verdict on the others' p95."""
    print(f"\n## The class without and with {studies} studies (same server, same seed)\n")
    print("| action | p50 without s | p50 with s | p95 without s | p95 with s | p95 ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for kind in [*KINDS, "all but studies", "study"]:
        a = sorted(r.seconds for r in without.records if _kind_of(r, kind))
        b = sorted(r.seconds for r in with_.records if _kind_of(r, kind))
        if not b:
            continue
        p95a, p95b = (percentile(a, 95) if a else float("nan")), percentile(b, 95)
        ratios[kind] = p95b / p95a if a else float("nan")
        print(
            f"| {kind} | {percentile(a, 50) if a else float('nan'):.2f} | {percentile(b, 50):.2f} | {p95a:.2f} "
            f"| {p95b:.2f} | {ratios[kind]:.2f} |"
        )
    studied = [r for r in with_.records if r.kind == "study"]
    done = sum(1 for r in studied if not r.error)
    ratio = ratios.get("all but studies", float("nan"))
    verdict = "within" if ratio <= STUDIES_GOAL else "OVER"
    print(
        f"\nStudies: {done} finished, {len(studied) - done} failed. The others' p95 with the studies / without: "
        f"{ratio:.2f} ({verdict}, goal <= {STUDIES_GOAL})."
    )
    return ratio


def _kind_of(record: Record, kind: str) -> bool:
    return record.kind != "study" if kind == "all but studies" else record.kind == kind


def photo_files(n: int) -> tuple[tuple[str, bytes, str], ...]:
    """n distinct 12-megapixel JPEG photos (benchmarks/memory.py makes them once and keeps them)."""
    import tempfile

    from memory import photos

    return tuple(photos(n, Path(tempfile.gettempdir()) / "tformer-memory-benchmark" / "photos"))


def server_processes(args: argparse.Namespace, base_url: str, deployment: Deployment | None) -> dict[int, str]:
    """pid -> role of the processes whose CPU and memory are reported."""
    if deployment is not None:
        pids = deployment.pids()
        return {**dict.fromkeys(pids["replicas"], "replica"), **dict.fromkeys(pids["nginx"], "nginx")}
    if args.pid:
        return dict.fromkeys(args.pid, "replica")
    pid = listener_pid(urllib.parse.urlsplit(base_url).port or 80)
    if pid is None:
        print("(no process found listening on that port: server CPU and memory not reported; give --pid)")
        return {}
    if Path(f"/proc/{pid}/comm").read_text().strip() == "nginx":
        print("(nginx listens there: its replicas are not known; give their --pid to see them)")
        return {pid: "nginx", **dict.fromkeys(_children(pid), "nginx")}
    return {pid: "replica"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server on this machine, e.g. http://127.0.0.1:8501")
    where.add_argument("--start", type=int, metavar="K", help="start K replicas behind nginx (deploy/serve.py)")
    parser.add_argument("--sessions", type=int, default=10, help=f"simulated students (1..{MAX_SESSIONS})")
    parser.add_argument("--duration", type=float, default=120, help=f"seconds of load (at most {MAX_DURATION_S})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--think", type=float, default=2.0, help="mean think time between actions, s")
    parser.add_argument("--ramp", type=float, default=10.0, help="seconds over which the sessions arrive")
    parser.add_argument("--shared", type=float, default=0.5, help="share of sentences that are the lecture's")
    parser.add_argument("--vision-model", help="the ViT the Vision page is opened with (a link's ?model=)")
    parser.add_argument("--text-model", help="the model the Text attention page is opened with (a link's ?model=)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--photos", type=float, default=0.0, help="share of vision rounds that upload a photo")
    parser.add_argument("--photo-files", type=int, default=160, help="distinct photos to upload, in turn")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds an action may take")
    parser.add_argument("--pid", type=int, action="append", help="with --url: a server process to watch")
    parser.add_argument("--app", type=Path, default=ROOT / "app.py", help="with --start: the app to run")
    parser.add_argument("--cache-mb", type=float, help="with --start: each replica's TFORMER_CACHE_MB")
    parser.add_argument("--keep", action="store_true", help="with --start: keep nginx's prefix (config, logs)")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="with --start: students meet replicas that have served nothing yet (deploy/serve.py's CLI opens the "
        "Text attention and Vision Transformer pages on each before nginx starts; this run does too, with "
        "--text-model and --vision-model, unless --cold)",
    )
    parser.add_argument("--gpu-mb", type=float, help="with --start: each replica's TFORMER_GPU_MB (default 90%% / K)")
    parser.add_argument(
        "--device", help="with --start: the replicas' TFORMER_DEVICE (cpu, cuda; default: a GPU if any)"
    )
    parser.add_argument("--p95-goal", type=float, help="seconds: the p95 every view change must keep (a verdict)")
    parser.add_argument(
        "--studies",
        type=int,
        default=0,
        help="run the class twice, without then with this many students studying heads on SmolLM2 (issue 34)",
    )
    args = parser.parse_args()
    if not 1 <= args.sessions <= MAX_SESSIONS:
        parser.error(f"--sessions must be 1..{MAX_SESSIONS}")
    if not 0 < args.duration <= MAX_DURATION_S:
        parser.error(f"--duration must be more than 0 and at most {MAX_DURATION_S} s")
    if args.start is not None and not 1 <= args.start <= 16:
        parser.error("--start must be 1..16 replicas")
    if args.think < 0 or not 0 <= args.shared <= 1 or not 0 <= args.photos <= 1 or args.photo_files < 1:
        parser.error("--think must be >= 0, --shared and --photos in 0..1, --photo-files >= 1")
    return args


def main() -> None:
    args = parse_args()
    print(f"Load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min)")
    deployment = None
    if args.start:
        env = {"TFORMER_DEVICE": args.device} if args.device else None
        pages = (("/text", args.text_model), ("/vision", args.vision_model))
        warm = () if args.cold else tuple(with_query(path, model_query(model)) for path, model in pages)
        deployment = Deployment(
            replicas=args.start,
            app=args.app,
            cache_mb=args.cache_mb,
            gpu_mb=args.gpu_mb,
            env=env,
            keep=args.keep,
            warm=warm,
        )
        deployment.start()
        base_url = deployment.url
        print(f"Started {args.start} replica(s) of {args.app} behind nginx at {base_url} ({deployment.prefix})")
        if warm:
            print_warmed(deployment.warmed)
        else:
            print("Cold replicas (--cold): nothing was opened on them before the class")
    else:
        try:
            base_url = loopback_url(args.url)
        except ValueError as error:
            sys.exit(f"load.py: {error}")
    try:
        processes = server_processes(args, base_url, deployment)
        print(
            f"{args.sessions} sessions for {args.duration:.0f} s against {base_url} (seed {args.seed}, think "
            f"{args.think} s, {args.shared:.0%} shared sentences, vision model {args.vision_model or 'the default'})"
        )
        with contextlib.suppress(KeyboardInterrupt):
            figures = asyncio.run(run_class(args, base_url, processes))
            if deployment is not None:  # the pages each replica opened before the class: seconds, and whether ok
                figures["warmed"] = [
                    {"replica": w.replica, "page": w.page, "seconds": w.seconds, "ok": w.ok} for w in deployment.warmed
                ]
            if args.json:
                args.json.write_text(json.dumps(figures, indent=1))
    finally:
        if deployment is not None:
            nginx_summary(deployment.access_log())
            deployment.stop()
        print(f"\nLoad average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min)")


if __name__ == "__main__":
    main()
