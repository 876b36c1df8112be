"""Trainings started from the Train page: one at a time per server, in a worker thread, the others queued.

    ticket = training.QUEUE.submit(session_id, classroom.TextJob(epochs=3))
    ticket.state, QUEUE.position(ticket), ticket.latest, ticket.epochs   # what the page polls
    QUEUE.cancel(ticket)

Why a worker thread and a queue: a training takes seconds to a minute of both cores, and a class may start
twenty at once. Run in the page's own script thread it would hold that session's page (and with it every
rerun of the session) until it ends; run all at once, twenty would share the cores and the memory and all
finish late. Here one runs at a time in a daemon thread (torch releases the GIL, so other sessions'
pages go on being served; the training computes with one CPU thread, classroom.TRAIN_THREADS, so the other
cores stay with their passes), the others wait in order and each page shows its place in the queue.

Bounded: at most MAX_WAITING trainings wait (more are refused with a message), one per session; a
training whose page has not asked about it for STALE_AFTER_S (its student left) is dropped or stopped;
the finished result stays with its ticket until the page takes it into its session (`session_models`).
Nothing here is shared between sessions but the queue's order: a ticket is found by its session's id.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from tformer_train import classroom

log = logging.getLogger("tformer.training")

MAX_WAITING = 30
STALE_AFTER_S = 90.0  # a page polls every second while its training waits or runs


class QueueFull(Exception):
    """Too many trainings are waiting; the message says so."""


@dataclass(eq=False)
class Ticket:
    """One training: what it trains, where it stands, what it has reported so far."""

    session: str
    job: classroom.Job
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    state: str = "queued"  # queued | running | done | cancelled | failed
    latest: classroom.Progress | None = None
    epochs: list[classroom.Epoch] = field(default_factory=list)
    result: classroom.Result | None = None
    error: str | None = None
    submitted: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def active(self) -> bool:
        return self.state in ("queued", "running")

    def seen(self) -> None:
        """The page asked about this ticket (it keeps a waiting or running training alive)."""
        self.last_seen = time.monotonic()

    def _report(self, event: classroom.Progress | classroom.Epoch) -> None:
        if isinstance(event, classroom.Epoch):
            self.epochs.append(event)
        else:
            self.latest = event


class TrainingQueue:
    """First come, first served; one training runs at a time (see the module)."""

    def __init__(self, max_waiting: int = MAX_WAITING, stale_after_s: float = STALE_AFTER_S) -> None:
        self.max_waiting, self.stale_after_s = max_waiting, stale_after_s
        self._waiting: deque[Ticket] = deque()
        self._running: Ticket | None = None
        self._by_session: dict[str, Ticket] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None

    def submit(self, session: str, job: classroom.Job) -> Ticket:
        """Queue `job` for `session`; its earlier ticket is replaced (cancelled if still active)."""
        with self._lock:
            earlier = self._by_session.get(session)
            if earlier is not None and earlier.active:
                raise QueueFull("your training is still running: cancel it first, or wait for it to end")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} trainings are waiting already; try again in a minute")
            ticket = Ticket(session, job)
            self._waiting.append(ticket)
            self._by_session[session] = ticket
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="tformer-training", daemon=True)
                self._worker.start()
            self._wake.notify()
        log.info("training %s queued (%s), %d waiting", ticket.id, type(job).__name__, len(self._waiting))
        return ticket

    def ticket(self, session: str) -> Ticket | None:
        """This session's latest ticket (None when it has started none)."""
        with self._lock:
            return self._by_session.get(session)

    def forget(self, session: str) -> None:
        """Drop a finished ticket once its page has taken the result."""
        with self._lock:
            ticket = self._by_session.get(session)
            if ticket is not None and not ticket.active:
                del self._by_session[session]

    def position(self, ticket: Ticket) -> int:
        """0 while it runs, k when k-1 trainings wait before it (and one runs), -1 when it is not waiting."""
        with self._lock:
            if self._running is ticket:
                return 0
            try:
                return self._waiting.index(ticket) + 1
            except ValueError:
                return -1

    def cancel(self, ticket: Ticket) -> None:
        with self._lock:
            ticket.stop.set()
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                ticket.state = "cancelled"

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _next(self) -> Ticket:
        with self._lock:
            while True:
                now = time.monotonic()
                while self._waiting and now - self._waiting[0].last_seen > self.stale_after_s:
                    left = self._waiting.popleft()
                    left.state, left.error = "cancelled", "nobody was waiting for it any more"
                if self._waiting:
                    self._running = self._waiting.popleft()
                    self._running.state = "running"
                    return self._running
                self._wake.wait()

    def _work(self) -> None:
        while True:
            ticket = self._next()
            self._run(ticket)
            with self._lock:
                self._running = None

    def _run(self, ticket: Ticket) -> None:
        def cancelled() -> bool:
            stale = time.monotonic() - ticket.last_seen > self.stale_after_s
            return ticket.stop.is_set() or stale

        try:
            ticket.result = classroom.train(ticket.job, ticket._report, cancelled)
            ticket.state = "done"
            log.info("training %s done in %.1f s", ticket.id, ticket.result.seconds)
        except classroom.Cancelled:
            ticket.state = "cancelled"
        except Exception as error:  # reported on the page in one line; the cause goes to the log
            ticket.state, ticket.error = "failed", f"{type(error).__name__}: {error}"
            log.exception("training %s failed", ticket.id)


QUEUE = TrainingQueue()  # one per server process
