"""A cache bounded in bytes, shared by every session of a server: least recently used entries go first.

A class of 100 types 100 sentences; what their traces cost depends on their length (a 512-token
trace is about 60 times a 12-token one), so a cache that counts entries cannot bound memory. Each
entry here is weighed when it is stored (`size_of`), and the least recently used ones are dropped
until the total fits the budget. A value larger than the whole budget is returned but not kept.

Bytes on a GPU (a trace kept on the device its model runs on) are weighed apart (`device_size_of`) and bounded
by a budget of their own: GPU memory is not the host's.

Concurrent requests for one key compute it once: the others wait for that result (a lecturer's
link opened by 60 students at once runs one forward pass, not 60).

No Streamlit here, so the policy can be tested on its own; tformer_app.models and tformer_app.results hold the
server's instances.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

MB = 2**20


def size_of(value: Any) -> int:
    """Bytes `value` holds in the host's memory, following what caches store: numpy arrays (a buffer shared by
    several views counts once), bytes, strings, PIL images, torch tensors, objects with `nbytes` and `device` (a
    Trace), dataclasses, and containers of these. Small Python objects count by sys.getsizeof. What lives on a
    GPU is not counted here: `device_size_of`."""
    return _sizes(value, set())[0]


def device_size_of(value: Any) -> int:
    """Bytes `value` holds on accelerators (a GPU's memory): tensors and traces whose device is not the CPU,
    followed through the same containers as `size_of`."""
    return _sizes(value, set())[1]


def _on_device(value: Any) -> bool:
    device = getattr(value, "device", None)
    return device is not None and getattr(device, "type", "cpu") != "cpu"


def _sizes(value: Any, seen: set[int]) -> tuple[int, int]:
    """(host bytes, device bytes) of `value` (see `size_of`); `seen`: objects already counted."""
    if id(value) in seen:
        return 0, 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        root = value
        while isinstance(root.base, np.ndarray):
            root = root.base
        if root is not value:
            if id(root) in seen:
                return 0, 0
            seen.add(id(root))
        return root.nbytes, 0
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value), 0
    if isinstance(value, str):
        return sys.getsizeof(value), 0
    if isinstance(value, dict):
        return _sum(sys.getsizeof(value), [x for item in value.items() for x in item], seen)
    if isinstance(value, (list, tuple, set, frozenset)):
        return _sum(sys.getsizeof(value), list(value), seen)
    if hasattr(value, "getbands") and hasattr(value, "size"):  # a PIL image: its decoded pixels
        width, height = value.size
        return width * height * len(value.getbands()) + 256, 0
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a torch tensor
        nbytes = int(value.element_size() * value.numel())
        return (0, nbytes) if _on_device(value) else (nbytes, 0)
    if hasattr(type(value), "nbytes") and not isinstance(value, np.generic):  # e.g. Trace.nbytes, on Trace.device
        nbytes = int(value.nbytes)
        fields = [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else []
        # What nbytes leaves out (tokens, meta) is small; count it anyway, without the arrays again.
        host, device = _sum(0, [getattr(value, f) for f in fields if f != "activations"], seen)
        return (host, device + nbytes) if _on_device(value) else (host + nbytes, device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _sum(sys.getsizeof(value), [getattr(value, f.name) for f in dataclasses.fields(value)], seen)
    return sys.getsizeof(value), 0


def _sum(own: int, parts: list[Any], seen: set[int]) -> tuple[int, int]:
    host, device = own, 0
    for part in parts:
        h, d = _sizes(part, seen)
        host, device = host + h, device + d
    return host, device


class _Pending:
    """A computation in progress: the sessions that ask for the same key wait on it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False  # stopped without a result or a failure: a waiter computes it


@dataclasses.dataclass(frozen=True)
class CacheStats:
    name: str
    entries: int
    used_bytes: int
    budget_bytes: int
    hits: int
    misses: int
    evicted: int
    device_bytes: int = 0  # what the entries hold on a GPU, counted apart (device_budget_bytes; None: not bounded)
    device_budget_bytes: int | None = None


class ByteBudgetCache:
    """key -> value, at most `budget_bytes` in all (by `size_of`), least recently used dropped first.

    on_evict(bytes): called (outside the lock) after entries were dropped, e.g. to give memory back.
    after_compute(): called after each computation of this cache ended, its value stored (and what that evicted
    dropped) or its failure passed on: what the computation freed can be given back then, measured against
    what the cache now holds (checked before the value is stored, the value would count as freed memory).
    device_budget_bytes: what the entries may hold on a GPU (by `device_size_of`), counted apart from the host's
    bytes (a trace on the GPU costs its memory, not the host's); None: not bounded.
    shared(): bytes held elsewhere that count against the same budget (the sessions' uploads): the cache keeps
    at most budget_bytes - shared() itself, and at least its most recent entry.
    """

    def __init__(
        self,
        name: str,
        budget_bytes: int,
        weigh: Callable[[Any], int] = size_of,
        on_evict: Callable[[int], None] | None = None,
        device_budget_bytes: int | None = None,
        shared: Callable[[], int] | None = None,
        after_compute: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.budget_bytes = int(budget_bytes)
        self.device_budget_bytes = None if device_budget_bytes is None else int(device_budget_bytes)
        self._weigh = weigh
        self._on_evict = on_evict
        self._after_compute = after_compute
        self._device_used = 0
        self._device_sizes: dict[Hashable, int] = {}  # the entries that hold GPU memory
        self._shared = shared
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._pending: dict[Hashable, _Pending] = {}
        self._lock = threading.Lock()
        self._used = 0
        self._hits = self._misses = self._evicted = 0

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The value for `key`: from the cache, from a computation already under way, or compute()."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self._hits += 1
                return self._entries[key][0]
            under_way = self._pending.get(key)
            owner = under_way is None
            if under_way is None:
                pending = self._pending[key] = _Pending()
                self._misses += 1
            else:
                pending = under_way
                self._hits += 1
        if not owner:
            pending.done.wait()
            if pending.abandoned:  # the session computing it was stopped (a rerun): this one computes it
                return self.get_or_compute(key, compute)
            if pending.error is not None:
                raise pending.error
            return pending.value
        try:
            value = compute()
        except BaseException as error:
            # A failure is every waiter's; a stop of the computing session's script (not an Exception) is not.
            pending.error, pending.abandoned = (error, False) if isinstance(error, Exception) else (None, True)
            with self._lock:
                del self._pending[key]
            pending.done.set()
            self._computed()
            raise
        pending.value = value
        self._store(key, value)
        with self._lock:
            del self._pending[key]
        pending.done.set()
        self._computed()
        return value

    def _computed(self) -> None:
        if self._after_compute is not None:
            self._after_compute()

    def _store(self, key: Hashable, value: Any) -> None:
        size = self._weigh(value)
        on_device = device_size_of(value) if self.device_budget_bytes is not None else 0
        with self._lock:
            if size > self.budget_bytes or (
                self.device_budget_bytes is not None and on_device > self.device_budget_bytes
            ):
                return  # larger than the whole budget: used once, not kept
            if key in self._entries:
                self._used -= self._entries.pop(key)[1]
                self._device_used -= self._device_sizes.pop(key, 0)
            self._entries[key] = (value, size)
            self._used += size
            if on_device:
                self._device_sizes[key] = on_device
                self._device_used += on_device
        freed = self.trim()
        if freed and self._on_evict is not None:
            self._on_evict(freed)

    def trim(self) -> int:
        """Drop least recently used entries until this cache and what it shares its budget with fit, on the host
        and on a GPU (its most recent entry stays); returns the host bytes dropped. Runs after every store, and
        whenever the shared part grew."""
        shared = self._shared() if self._shared is not None else 0
        freed = 0
        with self._lock:
            while self._over_budget(shared) and len(self._entries) > 1:
                dropped_key, (_, dropped) = self._entries.popitem(last=False)
                self._used -= dropped
                self._device_used -= self._device_sizes.pop(dropped_key, 0)
                self._evicted += 1
                freed += dropped
        return freed

    def _over_budget(self, shared: int) -> bool:
        over_device = self.device_budget_bytes is not None and self._device_used > self.device_budget_bytes
        return self._used + shared > self.budget_bytes or over_device

    def get(self, key: Hashable) -> Any | None:
        """The cached value for `key` (now the most recently used), or None when absent; nothing is computed."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry[0]

    def put(self, key: Hashable, value: Any) -> None:
        """Store a value computed elsewhere (a worker thread's), as if `get_or_compute` had computed it."""
        with self._lock:
            self._misses += 1
        self._store(key, value)
        self._computed()

    def peek(self, key: Hashable) -> Any | None:
        """The cached value for `key` without computing or reordering anything (None when absent)."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def values(self) -> list[Any]:
        with self._lock:
            return [value for value, _ in self._entries.values()]

    def discard(self, key: Hashable) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._used -= entry[1]
                self._device_used -= self._device_sizes.pop(key, 0)

    def clear(self) -> int:
        """Drop every entry; returns the bytes they held."""
        with self._lock:
            freed, self._used, self._device_used = self._used, 0, 0
            self._entries.clear()
            self._device_sizes.clear()
        return freed

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.name,
                len(self._entries),
                self._used,
                self.budget_bytes,
                self._hits,
                self._misses,
                self._evicted,
                self._device_used,
                self.device_budget_bytes,
            )
