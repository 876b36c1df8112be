"""Process-level settings for a server that traces many inputs."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

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
