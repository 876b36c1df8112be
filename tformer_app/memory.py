"""The server process's memory: glibc's allocator set up for a server that traces many inputs, and the freed memory
given back to the operating system once the process holds more than its caches and sessions do (`GIVE_BACK`).

No Streamlit and no cache here: the model and results caches (tformer_app.models, tformer_app.results) name what
they hold (`GIVE_BACK.add_holder`) and call `GIVE_BACK.check` after they compute or evict; the sessions' sweeper
(tformer_app.upkeep) calls `GIVE_BACK.swept` and `collect_ended_sessions`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import logs
from .budget import MB

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit systems
_TRIM_THRESHOLD = 2**30


@functools.cache  # looking libc up forks ldconfig: once per process is enough
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _ = libc.gnu_get_libc_version  # only glibc has it (AttributeError elsewhere)
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory() -> bool:
    """Return the heap memory freed so far to the operating system (glibc's malloc_trim).

    `retain_freed_memory` keeps freed memory for the next trace; when a server drops many cached
    traces at once (eviction, clearing), this hands that memory back so the process's resident size
    follows what it holds. Costs milliseconds. Returns False where libc is not glibc.
    """
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) in (0, 1)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Let glibc keep at most `arenas` heaps for all threads (its default: 8 per core).

    A server runs every session's script in a thread of its own; each contended thread can get a
    heap of its own, and freed memory kept in many heaps adds up to gigabytes of resident memory
    that no cache holds. Call it before the threads start. Returns False where libc is not glibc.
    """
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_ARENA_MAX, int(arenas)) == 1


def retain_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS at once.

    A plain forward pass frees each intermediate as soon as the next one exists, so the allocator
    hands the same pages back out. A traced pass keeps every intermediate until the trace is
    dropped; glibc then unmaps or trims those hundreds of MB, and the next trace page-faults all of
    them in again (measured here: about 30 % of a BERT-base-sized forward at 128 tokens).
    Keeping up to 1 GiB of freed heap removes that cost. Process-wide, so the app calls it once at
    start-up; notebooks may call it too. Returns False (and does nothing) where libc is not glibc.
    """
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1


# ---- memory given back ---------------------------------------------------------------------------
# Freed memory the process may keep for reuse before it is handed back to the OS: more saves page faults on the
# next pass (a few percent of a BERT-base pass), less keeps the resident size closer to what the caches hold.
SLACK = 32 * 2**20


def rss_bytes() -> int | None:
    """This process's resident memory (Linux), or None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class GiveBack:
    """Keeps the process's resident memory close to what it holds.

    What a request frees (a forward pass's activations, a decoded photo) and what the caches evict stays in
    glibc's heaps for reuse (`retain_freed_memory`: it saves page faults on the next trace). After each
    computation, eviction and sweep, the process's RSS beyond what the caches and sessions hold is compared
    with its level: the lowest it has been since the last sweep. Once it is more than SLACK above, the freed
    memory goes back to the OS (malloc_trim, a few milliseconds).

    Why the lowest: any reading is the process's own memory plus what was freed and kept plus objects alive
    only for the moment (a pass's activations in another session, a picture being drawn). A level read once,
    right after a hand-back, kept such a moment's objects as the level, and the memory they later freed
    stayed (175 MB after 80 photos). A level that only goes down between sweeps misses nothing freed; the
    sweeps (every 30 s) start it afresh, so memory the process keeps for good (a model's tokenizer) costs
    extra hand-backs for at most that long.

    What the hand-back cannot return still counts: freed memory scattered in pages that live objects share
    (glibc returns whole free pages only). A class uploading photos left 60 to 210 MB of it, run to run, beyond
    TFORMER_CACHE_MB (benchmarks/memory.py). Each full sweep compares its interval's level with the floor: the
    lowest level of any interval since the models last changed (a model brings memory of its own that it keeps:
    its tokenizer, its tables). The difference, `kept`, is counted in the results' budget beside the sessions'
    uploads, so the results make room for it and the resident size stays within the budget the operator set.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.level: int | None = None  # the lowest RSS minus held bytes since the last sweep
        self.floor: int | None = None  # the lowest level of a sweep's interval since the models last changed
        self.kept = 0  # the last interval's level above the floor: kept by the process, held by nobody
        self.logged = 0  # `kept` when the log last said it (it says it again once it has moved by SLACK)
        self.models_bytes: int | None = None  # the models' bytes when the floor was started
        self.holders: list[Callable[[], int]] = []  # what the caches and the sessions hold on purpose (`add_holder`)

    def add_holder(self, held_bytes: Callable[[], int]) -> None:
        """Count held_bytes() as memory the process holds on purpose (a cache's entries, the sessions' uploads): only
        what lies beyond all of it is freed memory to hand back."""
        self.holders.append(held_bytes)

    def held(self) -> int:
        return sum(held_bytes() for held_bytes in self.holders)

    def check(self, _evicted: int = 0) -> None:
        rss = rss_bytes()
        if rss is None:
            return
        with self.lock:
            beyond = rss - self.held()
            if self.level is not None and beyond <= self.level + SLACK:
                self.level = min(self.level, beyond)
                return
            release_freed_memory()
            after = rss_bytes()
            measured = (after if after is not None else rss) - self.held()
            self.level = measured if self.level is None else min(self.level, measured)

    def swept(self, models_bytes: int) -> None:
        """At a full sweep: the interval's level against the floor (the class's docstring), then a new interval,
        everything freed handed back. `models_bytes`: what the models hold now; a change starts the floor anew."""
        with self.lock:
            if models_bytes != self.models_bytes:
                self.floor, self.kept, self.models_bytes = None, 0, models_bytes
            elif self.level is not None:
                self.floor = self.level if self.floor is None else min(self.floor, self.level)
                self.kept = self.level - self.floor
                if abs(self.kept - self.logged) >= SLACK:
                    logs.log.info(
                        "freed memory not given back: %.0f MB (was %.0f MB), counted in the results' budget",
                        self.kept / MB,
                        self.logged / MB,
                    )
                    self.logged = self.kept
            self.level = None
        self.check()


GIVE_BACK = GiveBack()  # the server's: its caches and its sessions' uploads are counted in it


def collect_ended_sessions() -> None:
    """Free what ended sessions leave in reference cycles, now: a full garbage collection.

    Why: an ended session's state (its widgets, their callbacks and serializers) is a web of reference cycles,
    freed only by Python's full collection. That one runs when the objects that survived earlier collections
    have grown by a quarter, and a server with its models and a class's sessions keeps about 385,000: it can
    wait for hours. Meanwhile every ended session's widget values stay, each uploaded photo's bytes with them
    (4.5 MB for a 12-megapixel JPEG), counted by no budget: 490 MB after a class of 160 photos had ended and
    been cleared, 160 MB while the class was still uploading (benchmarks/memory.py). A full collection takes
    0.2 to 0.4 s on such a server (2 CPUs), so it runs only when sessions ended, at most once a look of the
    sweeper (every 10 s)."""
    started = time.perf_counter()
    found = gc.collect()
    logs.log.info("collected %d unreachable objects in %.0f ms", found, (time.perf_counter() - started) * 1000)
