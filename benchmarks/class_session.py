"""A class session under load: one lecturer and N students over K replicas behind nginx, sharing Redis.

    python benchmarks/class_session.py                         # N = 40 and 100, 2 replicas, Redis (started here)
    python benchmarks/class_session.py --students 40 --changes 8

Every session speaks Streamlit's websocket protocol as a browser does (benchmarks/stclient.py): the runs the server
starts by itself (a class's move wakes its students' polls) and the students' fallback poll (the fragment's
`run_every`, sent on the client's timer as the browser sends it):

    the lecturer opens Text attention and starts a class session; N students open the join link (?class=CODE)
    --changes times: the lecturer picks another head; each student's page polls, opens the lecturer's view
    the lecturer asks "Which token does "it" attend to most ...?"; every student clicks a token
    the lecturer's projector (its fragment, once a second) counts the answers until all are there

Figures: follow = from the lecturer's change sent to a student's page having drawn the new head (its address
and its heading), per student and change: p50, p95, max; the baseline, measured in the same run, is the
lecturer's own page drawing the same change (one user, no class), and the ratio is follow p95 / baseline p50.
Answers: from the last student's answer sent to the projector showing them all; answers lost = answers sent
minus answers the projector counts. Goal (issue 25): follow p95 <= 1.5 s
at 40 students on a 2-core machine; issue 35 kept it, with 3 browser students beside (benchmarks/class_follow.py).
The machine's load is printed (others may share it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from load import machine_busy, percentile
from stclient import Session

from deploy.redis_server import RedisServer
from deploy.serve import Deployment

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TFORMER_DEVICE": "cpu"}
GOAL_FOLLOW_P95_S = 1.5
HEADS = ("5", "7", "2", "9", "4", "11", "0", "3", "8", "6")
FOLLOW_TIMEOUT_S = 60.0
OPENING = 8  # students opening the link at once (a class arrives over a minute, not in one millisecond)


@dataclass
class Shared:
    """What the lecturer's coroutine and the students' share: the change under way and what was seen."""

    head: str = "1"
    sent_at: float = 0.0
    seen: dict[int, float] = field(default_factory=dict)  # student -> when their page showed `head`
    follow_s: list[float] = field(default_factory=list)
    asking: bool = False
    tried: dict[int, float] = field(default_factory=dict)  # student -> when their answer was sent
    answered: dict[int, float] = field(default_factory=dict)  # student -> when their page confirmed the answer
    errors: list[str] = field(default_factory=list)
    done: bool = False


def shows(session: Session, head: str) -> bool:
    run = session.last
    return (
        run is not None
        and f"head={head}" in session.query_string
        and any(h.startswith(f"Heatmap · layer 2, head {head}") for h in run.headings())
    )


async def student(i: int, s: Session, shared: Shared, rng: random.Random) -> None:
    """A student's browser: the runs the server starts (the class's moves wake the student's poll), the poll on its
    timer besides; a new view drawn is noted; a question is answered once."""
    interval, fragment = min((v, k) for k, v in s.auto_reruns.items())
    next_poll = time.perf_counter() + interval
    while not shared.done:
        try:
            run, next_poll = await s.follow(fragment, interval, next_poll)
            if run is None:
                continue
            # The page's last whole run, whichever run came back here (the server's own run may have finished while
            # this student's poll was under way): timed when it finished.
            if s.last is not None and shows(s, shared.head):
                shared.seen.setdefault(i, s.last.finished_at)
            if shared.asking and i not in shared.tried:
                pills = [w for w in s.last.widgets() if w.kind == "button_group" and w.label == "Click a token"]
                if pills:
                    shared.tried[i] = time.perf_counter()
                    run = await s.set_value("Click a token", rng.choice(pills[0].options[:12]), kind="button_group")
                    shown = run.texts() + (s.last.texts() if s.last is not None else [])  # a run of the server's own
                    if any(t.startswith("Your answer:") for t in shown):  # may come back first; the page's shows it
                        shared.answered[i] = time.perf_counter()
                    else:
                        shared.errors.append(f"student {i}: the answer was not confirmed: {run.errors[:1]}")
        except Exception as error:  # one student's failure is counted, the class goes on
            shared.errors.append(f"student {i}: {type(error).__name__}: {error}")
            await asyncio.sleep(interval)


async def open_students(url: str, code: str, n: int) -> list[Session]:
    gate = asyncio.Semaphore(OPENING)

    async def one() -> Session:
        async with gate:
            return await Session.open(url, f"/?class={code}", timeout_s=300, fetch_media=False)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def one_class(url: str, n: int, changes: int, seed: int) -> dict:
    lecturer = await Session.open(url, "/text?layer=2&head=1", timeout_s=300, fetch_media=False)
    run = await lecturer.click("Start a class session")
    code = next(m.group(1) for t in run.texts() if (m := re.search(r"code \**([A-Z0-9]{6})\*\*", t)))
    students = await open_students(url, code, n)
    shared = Shared()
    followed_at_join = sum(shows(s, "1") for s in students)
    rng = random.Random(seed)
    tasks = [asyncio.create_task(student(i, s, shared, random.Random(rng.random()))) for i, s in enumerate(students)]
    baseline, missed = [], 0
    for head in HEADS[:changes]:
        shared.seen.clear()
        shared.head, shared.sent_at = head, time.perf_counter()
        run = await lecturer.set_value("Head", head)
        baseline.append(run.elapsed_s)
        deadline = shared.sent_at + FOLLOW_TIMEOUT_S
        while len(shared.seen) < n and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)  # the coroutines' shared state, checked 50 times a second
        shared.follow_s += [t - shared.sent_at for t in shared.seen.values()]
        missed += n - len(shared.seen)
        await asyncio.sleep(1.0)  # the lecturer talks a moment before the next change
    answers = await ask_and_count(lecturer, shared, n)
    shared.done = True
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in [lecturer, *students]:
        await s.close()
    return {"n": n, "joined": followed_at_join, "follow": sorted(shared.follow_s), "missed": missed,
            "baseline": sorted(baseline), "errors": shared.errors, **answers}  # fmt: skip


async def ask_and_count(lecturer: Session, shared: Shared, n: int) -> dict:
    """The lecturer asks the token question; the projector's fragment (once a second) counts until all answered."""
    await lecturer.click("Ask", key="_tformer.class.ask.0")  # the token question
    shared.asking = True
    interval, fragment = min((v, k) for k, v in lecturer.auto_reruns.items())
    counted, complete_at = 0, None
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        run = await lecturer.fragment_rerun(fragment)
        found = [re.search(r"(\d+) of (\d+) answered", t) for t in run.texts()]
        counted = max([int(m.group(1)) for m in found if m] or [counted])
        if counted >= n:
            complete_at = time.perf_counter()
            break
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))
    settle = time.perf_counter() + 60
    while len(shared.answered) + len(shared.errors) < len(shared.tried) and time.perf_counter() < settle:
        await asyncio.sleep(0.05)  # the students' own pages confirming the answers still under way
    last = max(shared.tried.values(), default=float("nan"))
    return {"sent": len(shared.tried), "confirmed": len(shared.answered), "counted": counted,
            "to_projector": (complete_at or float("nan")) - last}  # fmt: skip


def table(results: list[dict], replicas: int, load: tuple[float, float]) -> None:
    print(f"\nClass session: 1 lecturer, N students, {replicas} replicas behind nginx, Redis; this machine: "
          f"{os.cpu_count()} cores, {load[0]:.2f} of them busy over the run (all processes, others' too)")  # fmt: skip
    head = (f"{'N':>4} {'joined':>7} {'follows':>8} {'p50 s':>6} {'p95 s':>6} {'max s':>6} {'missed':>6} "
            f"{'own p50 s':>9} {'p95/own':>7} {'sent':>5} {'shown':>5} {'counted':>7} {'lost':>5} {'to proj. s':>10} "
            "verdict")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in results:
        f, b = r["follow"], r["baseline"]
        p95 = percentile(f, 95)
        own = percentile(b, 50)
        ok = "goal met" if p95 <= GOAL_FOLLOW_P95_S and not r["missed"] else "over the goal"
        verdict = ok if r["n"] <= 40 else "(goal at 40)"
        print(f"{r['n']:>4} {r['joined']:>7} {len(f):>8} {percentile(f, 50):>6.2f} {p95:>6.2f} {max(f or [0]):>6.2f} "
              f"{r['missed']:>6} {own:>9.2f} {p95 / own:>7.1f} {r['sent']:>5} {r['confirmed']:>5} {r['counted']:>7} "
              f"{r['sent'] - r['counted']:>5} {r['to_projector']:>10.2f} {verdict}")  # fmt: skip
        for error in r["errors"][:5]:
            print(f"     error: {error}")
        if len(r["errors"]) > 5:
            print(f"     ... and {len(r['errors']) - 5} more errors")
    print("follow: lecturer's change sent -> a student's page drawn with it; own: the lecturer's page drawing the "
          "same change; sent: answers sent; shown: confirmed on the student's page; lost: sent - counted; "
          "to proj.: the last answer sent -> the projector (polled once a second) counting every answer")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, nargs="+", default=[40, 100])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--changes", type=int, default=6, help="head changes by the lecturer (at most 10)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"Load average at the start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min)")
    results = []
    with RedisServer() as redis:
        env = {**OFFLINE, "TFORMER_REDIS_URL": redis.url}
        with Deployment(replicas=args.replicas, env=env) as deployment:
            busy0, total0 = machine_busy()
            for n in args.students:
                results.append(asyncio.run(one_class(deployment.url, n, min(args.changes, len(HEADS)), args.seed)))
            busy1, total1 = machine_busy()
    cores = os.cpu_count() or 1
    table(results, args.replicas, ((busy1 - busy0) / max(total1 - total0, 1e-9) * cores, cores))
    print(f"Load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min)")


if __name__ == "__main__":
    main()
