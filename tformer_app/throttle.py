"""Guesses at a secret (a class's join code, the admin token) counted per client address and in all, with a lockout
that holds no lock and sleeps no thread, and one log line per burst instead of one per try. No Streamlit here.

    guesses = Guesses("wrong join codes", per_client=10, overall=30, window_s=60, counters=lambda: backend)
    attempt = guesses.begin("10.0.0.7")     # Locked(wait_s) when this address used up its guesses
    ...check the secret...
    guesses.right(attempt) / guesses.wrong(attempt)

A try is counted before the secret is checked (`begin`), and a right one is counted back (`right`): ten sessions
of one address asking at once cannot all pass a check that counts only after it. Within a window, an address has
`per_client` wrong tries; once every address together made `overall`, each has one (a guesser with many addresses
is slowed too, and a student who mistyped once still gets in). Counters live in the class store's backend (Redis:
shared by the replicas, so a guesser cannot multiply its tries by choosing its replica); while it cannot be
reached, in this process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("tformer_app")

PREFIX = "tformer:guess:"
ALL = "*"  # the counter of every address together


class Counters(Protocol):
    """What the counts need of a store (class_store.Backend offers it)."""

    def get(self, key: str) -> str | None: ...
    def incr(self, key: str, ttl_s: int) -> int: ...


class Locked(Exception):
    """This address made too many wrong tries in this window; it may try again in `wait_s` seconds."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"too many wrong tries; try again in {wait_s:.0f} s")
        self.wait_s = wait_s


@dataclass(frozen=True)
class Attempt:
    """A try under way: its address and window (a right answer is counted back in the window it was counted in)."""

    client: str
    bucket: int


class BurstLog:
    """One warning per address and window for a burst of refused tries ("12 wrong join codes from 10.0.0.7 in the
    last 60 s; 40 more refused unchecked"), written when the window that saw the first of them ends."""

    def __init__(self, what: str, window_s: float) -> None:
        self.what, self.window_s = what, window_s
        self._counts: dict[str, list[int]] = {}  # address -> [wrong, refused unchecked]
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def add(self, client: str, refused: bool = False) -> None:
        with self._lock:
            self._counts.setdefault(client, [0, 0])[int(refused)] += 1
            if self._timer is None:
                self._timer = threading.Timer(self.window_s, self.flush)
                self._timer.daemon = True  # a server stopping must not wait for the last line
                self._timer.start()

    def flush(self) -> list[str]:
        """Write (and return) the lines of the window so far; the next try starts another."""
        with self._lock:
            counts, self._counts = self._counts, {}
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
        lines = []
        for client, (wrong, refused) in counts.items():
            more = f"; {refused} more refused unchecked (too many)" if refused else ""
            lines.append(f"{wrong} {self.what} from {client} in the last {self.window_s:.0f} s{more}")
            log.warning("%s", lines[-1])
        return lines


class Guesses:
    """Tries at one kind of secret, limited per address and in all within fixed windows of `window_s`."""

    def __init__(
        self,
        what: str,
        per_client: int,
        overall: int,
        window_s: int,
        counters: Callable[[], Counters],
        fallback: Counters,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.what = what
        self.per_client, self.overall, self.window_s = per_client, overall, window_s
        self._counters, self._fallback = counters, fallback
        self._clock = clock
        self.bursts = BurstLog(what, window_s)
        self._kind = what.replace(" ", "-")
        self._local = False  # counting in this process (the store failed)

    def _key(self, client: str, part: str, bucket: int) -> str:
        return f"{PREFIX}{self._kind}:{client[:64]}:{part}:{bucket}"

    def _counted(self, count: Callable[[Counters], Any]) -> Any:
        """`count` on the store's counters, or on this process's while the store cannot be reached."""
        try:
            result = count(self._counters())
            self._local = False
            return result
        except Exception as error:  # the store is down: guesses are still counted, in this process
            if not self._local:
                self._local = True
                log.warning("%s are counted in this process: the class store cannot be reached (%s)", self.what, error)
            return count(self._fallback)

    def begin(self, client: str) -> Attempt:
        """Count a try of `client` (an address) before its secret is checked; Locked if it may not try now."""
        now = self._clock()
        bucket = int(now // self.window_s)

        def count(store: Counters) -> tuple[int, int]:
            ttl = self.window_s * 2
            mine = store.incr(self._key(client, "tries", bucket), ttl)
            every = store.incr(self._key(ALL, "tries", bucket), ttl)
            mine -= int(store.get(self._key(client, "back", bucket)) or 0)
            every -= int(store.get(self._key(ALL, "back", bucket)) or 0)
            return mine, every

        mine, every = self._counted(count)
        allowed = self.per_client if every <= self.overall else 1
        attempt = Attempt(client, bucket)
        if mine > allowed:
            # Not checked, so no guess in all: a locked-out guesser must not use up everyone's. Its own count stays
            # (counted back, a refused try could let a try of another session of its address through).
            self._back(attempt, mine=False)
            self.bursts.add(client, refused=True)
            raise Locked(self.window_s * (bucket + 1) - now)
        return attempt

    def right(self, attempt: Attempt) -> None:
        """The secret was right: this try does not count against its address."""
        self._back(attempt)

    def _back(self, attempt: Attempt, mine: bool = True) -> None:
        def count(store: Counters) -> None:
            if mine:
                store.incr(self._key(attempt.client, "back", attempt.bucket), self.window_s * 2)
            store.incr(self._key(ALL, "back", attempt.bucket), self.window_s * 2)

        self._counted(count)

    def wrong(self, attempt: Attempt) -> None:
        """The secret was wrong: counted already; said in the burst's log line."""
        self.bursts.add(attempt.client)
