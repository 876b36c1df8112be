"""Long work (every head ablated, a patching grid, induction heads, many pictures) in its own bounded queue, beside
the passes pages wait for. No Streamlit here (tested on its own); tformer_app.long_work is the pages' way in.

    job = QUEUE.submit(key, session_id, "Ablating every head…", compute)   # compute(progress) -> the result
    QUEUE.watch(job, session_id)        # the page still waits for it (it polls every POLL_S)
    job.done.wait(POLL_S); QUEUE.position(job); job.fraction, job.message

Why a queue of its own: a study runs hundreds of batch rows. Inside the one forward-pass slot (TFORMER_PASSES=1),
a 120-word text held every other student's new sentence for a minute, and a study whose page had been closed
kept computing for two. Here:
- the work runs in worker threads (TFORMER_STUDIES of them), its passes behind the pages' passes
  (slots.PassGate: a page's pass waits for one step of a layer, not for the study), with one CPU thread fewer
  than the process has (the pages' Python keeps a core);
- each session has at most one job of its own waiting or running: a new one (another text) cancels the one it
  asked for before unless another session waits for that too; equal requests share one job (a lecturer's link
  opened by the whole class runs one study); first come, first served, so each session gets its turn;
- at most MAX_WAITING jobs wait; more are refused with a message (`Busy`);
- a job nobody has asked about for STALE_S (its page closed, its student moved on) stops at its next step;
- what it reports (a fraction and a line) is read by the waiting pages, which show it with their place in line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from tformer_core.capture import checkpoints
from tformer_core.errors import InputError
from tformer_train.classroom import thread_count

from .slots import PassGate

log = logging.getLogger("tformer_app")

Progress = Callable[[float, str], None]
MAX_WAITING = 64
STALE_S = 5.0  # a waiting page asks every POLL_S; a page's next run asks again within a second or two
POLL_S = 0.25
STEP_LOOK_S = 0.1  # how often a running job looks whether anybody still waits for it
# The workers' scheduling priority (Linux: per thread; the threads torch starts from them inherit it). A page's
# script does not wait for a pass slot to redraw a view, so the gate cannot put it first: it shared the cores with
# a study and drew a head switch in 0.52 s instead of 0.26 s (benchmarks/browser_interactions.py --beside-studies,
# 2 cores). At nice 19 a study gets what the pages leave of the cores, and all of a core nobody uses.
WORKER_NICE = 19


def _lower_priority() -> None:
    """This thread at WORKER_NICE, where the system allows it (Linux; elsewhere it keeps the process's priority)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except (AttributeError, OSError) as error:
        log.debug("long work runs at the server's own priority: %s", error)


class Busy(InputError):
    """Too many long computations wait already: the message says so (it is no bug, and not the input's either)."""


class Cancelled(Exception):
    """Raised inside a job's passes when nobody waits for it any more."""


@dataclass(eq=False)
class Job:
    """One long computation and where it stands. state: queued | running | done | failed | cancelled. value: the
    result (done); error: what it raised (failed); bug: the id the log gave a failure that is not the input's."""

    key: Hashable
    label: str
    compute: Callable[[Progress], Any]
    watchers: dict[str, float] = field(default_factory=dict)  # session id -> when it last asked
    state: str = "queued"
    fraction: float = 0.0
    message: str = ""
    value: Any = None
    error: Exception | None = None
    bug: str | None = None
    seconds: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def stale(self, now: float, stale_s: float) -> bool:
        return not self.watchers or now - max(self.watchers.values()) > stale_s

    def _report(self, fraction: float, message: str) -> None:
        self.fraction, self.message = min(max(float(fraction), 0.0), 1.0), message


class WorkQueue:
    """See the module. gate: the pass slots shared with the pages; workers: jobs run at once; threads: torch's CPU
    threads for a job (None: one fewer than the process uses, at least one); on_done(key, value): where a result
    goes (the results cache); on_bug(what, error) -> id: how a failure that is not the input's is logged."""

    def __init__(
        self,
        gate: PassGate,
        workers: int = 1,
        threads: int | None = None,
        max_waiting: int = MAX_WAITING,
        stale_s: float = STALE_S,
        on_done: Callable[[Hashable, Any], None] | None = None,
        on_bug: Callable[[str, Exception], str] | None = None,
    ) -> None:
        self.gate, self.workers, self.max_waiting, self.stale_s = gate, max(1, int(workers)), max_waiting, stale_s
        self.threads = threads if threads is not None else max(1, torch.get_num_threads() - 1)
        self.on_done, self.on_bug = on_done, on_bug
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._active: dict[Hashable, Job] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self.finished = {"done": 0, "failed": 0, "cancelled": 0}

    # ---- what the pages call ----------------------------------------------------------------------------
    def submit(self, key: Hashable, session: str, label: str, compute: Callable[[Progress], Any]) -> Job:
        """The job for `key`: the one under way (this session joins its watchers), or a new one queued. The
        session's other jobs that no other session waits for are cancelled. Busy when MAX_WAITING jobs wait."""
        now = time.monotonic()
        with self._lock:
            job = self._active.get(key)
            if job is not None:
                job.watchers[session] = now
                return job
            for other in list(self._active.values()):
                if other.watchers.pop(session, None) is not None and not other.watchers:
                    self._cancel(other, "its session asked for something else")
            if len(self._waiting) >= self.max_waiting:
                log.warning("long work refused: %d waiting already (%s)", len(self._waiting), label)
                raise Busy(
                    f"{len(self._waiting)} long computations are waiting on this server already: try again in a minute"
                )
            job = Job(key, label, compute, {session: now})
            self._active[key] = job
            self._waiting.append(job)
            self._start_workers()
            self._wake.notify()
        return job

    def watch(self, job: Job, session: str) -> None:
        """`session`'s page still waits for `job` (it keeps the job from going stale)."""
        with self._lock:
            job.watchers[session] = time.monotonic()

    def position(self, job: Job) -> int:
        """0 while it runs, k when it is k-th in line, -1 when it is neither (done, failed, cancelled)."""
        with self._lock:
            if job in self._running:
                return 0
            try:
                return self._waiting.index(job) + 1
            except ValueError:
                return -1

    def cancel_session(self, session: str) -> int:
        """`session` ended: it waits for nothing any more; its jobs that nobody else waits for stop. Returns how
        many were cancelled."""
        cancelled = 0
        with self._lock:
            for job in list(self._active.values()):
                if job.watchers.pop(session, None) is not None and not job.watchers:
                    self._cancel(job, "its session ended")
                    cancelled += 1
        return cancelled

    def counts(self) -> tuple[int, int]:
        """(running, waiting) now."""
        with self._lock:
            return len(self._running), len(self._waiting)

    # ---- the workers ---------------------------------------------------------------------------------------
    def _cancel(self, job: Job, why: str) -> None:
        """Under the lock: a waiting job leaves the line at once; a running one stops at its next step."""
        job.stop.set()
        if self._active.get(job.key) is job:  # asked for again, the key gets a new job
            del self._active[job.key]
        if job in self._waiting:
            self._waiting.remove(job)
            self._finish(job, "cancelled")
        log.info("long work cancelled (%s): %s", why, job.label)

    def _finish(self, job: Job, state: str) -> None:
        """Under the lock."""
        job.state = state
        self.finished[state] += 1
        if self._active.get(job.key) is job:
            del self._active[job.key]
        job.done.set()

    def _start_workers(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(self._threads) < self.workers:
            worker = threading.Thread(target=self._work, name=f"tformer-work-{len(self._threads)}", daemon=True)
            self._threads.append(worker)
            worker.start()

    def _next(self) -> Job:
        with self._lock:
            while True:
                now = time.monotonic()
                for job in [j for j in self._waiting if j.stale(now, self.stale_s)]:
                    self._cancel(job, "nobody waits for it")
                if self._waiting:
                    job = self._waiting.popleft()
                    job.state = "running"
                    self._running.append(job)
                    return job
                self._wake.wait()

    def _work(self) -> None:
        _lower_priority()
        while True:
            job = self._next()
            state = self._run(job)
            # Stored before its waiters wake: what their page asks next may read it (the click's ablation on /heads
            # reads the study's clean trace from the cache; stored after, the first one ran the clean pass again).
            if state == "done" and self.on_done is not None:
                try:
                    self.on_done(job.key, job.value)
                except Exception:  # its waiters still get the result; only the cache missed it
                    log.exception("long work's result could not be stored: %s", job.label)
            with self._lock:
                self._running.remove(job)
                self._finish(job, state)

    def _run(self, job: Job) -> str:
        looked = [time.monotonic()]

        def step() -> None:  # at every hook point of the job's passes: cheap unless a page's pass waits
            if job.stop.is_set():
                raise Cancelled
            now = time.monotonic()
            if now - looked[0] > STEP_LOOK_S:
                looked[0] = now
                with self._lock:
                    if job.stale(now, self.stale_s):
                        self._cancel(job, "nobody waits for it")
                if job.stop.is_set():
                    raise Cancelled
            pause()

        started = time.perf_counter()
        log.info("long work started (%d waiting): %s", len(self._waiting), job.label)
        try:
            with thread_count(self.threads), self.gate.behind() as pause, checkpoints(step):
                job.value = job.compute(job._report)
            log.info("long work done in %.1f s: %s", time.perf_counter() - started, job.label)
            return "done"
        except Cancelled:
            seconds = time.perf_counter() - started
            log.info("long work stopped after %.1f s, nobody waits for it: %s", seconds, job.label)
            return "cancelled"
        except InputError as error:
            job.error = error
            return "failed"
        except Exception as error:  # a bug: logged once here, with its traceback; the pages show its id
            job.error = error
            job.bug = self.on_bug(job.label, error) if self.on_bug is not None else None
            return "failed"
        finally:
            job.seconds = time.perf_counter() - started
