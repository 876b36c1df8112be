"""Slots counted across processes: at most n holders at once among every process of a machine that opens one
folder (tformer_app.gpu uses it to count forward passes per GPU across a server's replicas). Standard library only.

Slot i is an exclusive `flock` on the file slot-i of the folder. The kernel drops a process's locks when it
exits, so a process killed while it holds a slot never leaves it taken; a lock belongs to an open file, so the
threads of one process count as holders too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Protocol

POLL_S = (
    0.0005,
    0.005,
)  # how often the first waiter looks for a free slot: from the first value, doubling to the second


class Slots(Protocol):
    """What `pass_slots` gives: a context manager that holds one slot while its block runs."""

    def __enter__(self) -> object: ...
    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class DeviceSlots:
    """At most `n` holders at once among every thread of every process on this machine that uses `folder`.

    `with slots:` waits for a free slot and holds it while the block runs. Waiters queue on a turnstile lock;
    the first of them looks for a free slot (every 0.5 to 5 ms), so a slot freed by any process is taken within
    milliseconds. With n = 1 a waiter simply blocks on the one slot's lock.
    """

    def __init__(self, folder: Path, n: int) -> None:
        if n < 1:
            raise ValueError(f"at least one slot, not {n}")
        self.folder, self.n = Path(folder), int(n)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.folder.stat().st_uid != os.getuid():
            raise PermissionError(f"{self.folder} belongs to another user: its locks cannot be trusted")
        self._held = threading.local()  # the slots this thread holds (a stack: `with` blocks may nest)

    def _open(self, name: str) -> int:
        return os.open(self.folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _try(self, i: int) -> int | None:
        fd = self._open(f"slot-{i}")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def acquire(self) -> int:
        """Wait for a slot; returns the descriptor whose lock holds it (`release` gives it back)."""
        if self.n == 1:
            fd = self._open("slot-0")
            fcntl.flock(fd, fcntl.LOCK_EX)
            return fd
        turnstile = self._open("turnstile")
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX)  # one waiter at a time looks; the others queue here
            delay = POLL_S[0]
            while True:
                for i in range(self.n):
                    free = self._try(i)
                    if free is not None:
                        return free
                time.sleep(delay)  # a pass elsewhere holds every slot: look again shortly
                delay = min(delay * 2, POLL_S[1])
        finally:
            os.close(turnstile)  # closing releases the turnstile for the next waiter

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # closing the descriptor releases its lock

    def held(self) -> int:
        """Slots held now by every process (each tried without waiting): for tests and the server page."""
        busy = 0
        for i in range(self.n):
            fd = self._try(i)
            if fd is None:
                busy += 1
            else:
                os.close(fd)
        return busy

    def __enter__(self) -> DeviceSlots:
        stack = getattr(self._held, "fds", None)
        if stack is None:
            stack = self._held.fds = []
        stack.append(self.acquire())
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release(self._held.fds.pop())


class PassGate:
    """The pass slots (`slots`: TFORMER_PASSES of them) shared by the passes pages wait for and long work
    (tformer_app.work: a study of every head, a patching grid), the pages' passes first.

    `with gate:` is a page's pass: it waits for a slot as before. `with gate.behind() as pause:` is long work: it
    takes a slot only while no page's pass of this process waits for one, and pause(), called often (at every
    hook point of its passes: tformer_core.capture.checkpoints), gives the slot back as soon as one waits and
    takes it again once none does. Why: a study runs hundreds of batch rows (70 s for a 120-word text on two
    cores); holding the one slot throughout, it kept another student's new sentence waiting 61.7 s instead of
    0.1 s. Now such a sentence waits for one step of one layer of the study.

    Only this process's waiting passes are seen: on a GPU shared by replicas, another replica's pass waits for
    the slot as for any pass (on a GPU a study's step takes milliseconds).
    """

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self._changed = threading.Condition()
        self._waiting = 0  # pages' passes waiting for a slot now

    def waiting(self) -> int:
        return self._waiting

    def __enter__(self) -> PassGate:
        with self._changed:
            self._waiting += 1
        try:
            self.slots.__enter__()
        finally:
            with self._changed:
                self._waiting -= 1
                if not self._waiting:
                    self._changed.notify_all()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.slots.__exit__(kind, error, tb)

    def _take_behind(self) -> None:
        while True:
            with self._changed:
                while self._waiting:
                    self._changed.wait()
            self.slots.__enter__()
            if not self._waiting:
                return
            self.slots.__exit__(None, None, None)  # a page's pass began to wait meanwhile: it goes first

    def _pause(self) -> None:
        if not self._waiting:  # an int read without the lock: the common case costs nothing
            return
        self.slots.__exit__(None, None, None)
        self._take_behind()

    @contextlib.contextmanager
    def behind(self) -> Iterator[Callable[[], None]]:
        """Hold a slot for long work, behind every page's pass; yields pause() (see the class)."""
        self._take_behind()
        try:
            yield self._pause
        finally:
            self.slots.__exit__(None, None, None)
