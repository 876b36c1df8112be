"""The byte-bounded cache a server shares between sessions: what it keeps, what it drops, who computes."""

import threading

import numpy as np
import pytest
from streamlit.runtime.scriptrunner_utils.exceptions import StopException

from tformer_app.budget import ByteBudgetCache, size_of

MB = 2**20


def array(mb: float) -> np.ndarray:
    return np.zeros(int(mb * MB), dtype=np.uint8)


def test_least_recently_used_entries_go_first_when_the_bytes_exceed_the_budget():
    freed = []
    cache = ByteBudgetCache("t", 10 * MB, on_evict=freed.append)
    for key in "abc":
        cache.get_or_compute(key, lambda: array(3))
    cache.get_or_compute("a", lambda: pytest.fail("a is cached"))  # a is now the most recent
    cache.get_or_compute("d", lambda: array(3))  # 12 MB > 10 MB: b, the least recently used, goes
    assert cache.peek("b") is None and cache.peek("a") is not None and cache.peek("c") is not None
    stats = cache.stats()
    assert stats.entries == 3 and stats.evicted == 1 and stats.used_bytes <= 10 * MB
    assert freed == [size_of(array(3))]


def test_after_compute_sees_the_new_value_held_and_the_evicted_ones_dropped():
    """The hand-back of freed memory (results._GiveBack) measures RSS minus what the caches hold: checked before the
    value was stored, the new value would count as freed memory and the evicted ones as held (a server kept about
    130 MB more than its budget allowed at 512 tokens)."""
    seen = []
    cache = ByteBudgetCache(
        "t", 10 * MB, after_compute=lambda: seen.append((cache.stats().used_bytes, cache.peek("new") is not None))
    )
    for key in "abc":
        cache.get_or_compute(key, lambda: array(3))
    cache.get_or_compute("new", lambda: array(3))  # 12 MB > 10 MB: a, the least recently used, goes
    assert seen[-1] == (3 * size_of(array(3)), True) and cache.peek("a") is None
    with pytest.raises(ValueError, match=r"^invalid literal for int\(\) with base 10: 'x'$"):
        cache.get_or_compute("bad", lambda: int("x"))  # a failed pass frees its activations too
    assert len(seen) == 5
    cache.get_or_compute("new", lambda: pytest.fail("cached"))
    assert len(seen) == 5  # a hit computes nothing


def test_one_big_entry_evicts_many_small_ones_and_a_too_big_one_is_not_kept():
    cache = ByteBudgetCache("t", 10 * MB)
    for i in range(10):
        cache.get_or_compute(i, lambda: array(0.9))
    cache.get_or_compute("big", lambda: array(8))
    assert cache.stats().used_bytes <= 10 * MB and cache.peek("big") is not None
    huge = cache.get_or_compute("huge", lambda: array(11))  # returned to the caller, not kept
    assert huge.nbytes == 11 * MB and cache.peek("huge") is None and cache.peek("big") is not None


def test_concurrent_requests_for_one_key_compute_it_once():
    cache = ByteBudgetCache("t", 10 * MB)
    started, release, calls = threading.Event(), threading.Event(), []

    def slow():
        calls.append(1)
        started.set()
        release.wait(10)
        return "value"

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_compute("k", slow))) for _ in range(8)]
    threads[0].start()
    started.wait(10)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert calls == [1] and results == ["value"] * 8


def test_a_failed_computation_reaches_every_waiter_and_is_not_cached():
    cache = ByteBudgetCache("t", MB)
    with pytest.raises(ValueError, match="bad input"):
        cache.get_or_compute("k", lambda: (_ for _ in ()).throw(ValueError("bad input")))
    assert cache.get_or_compute("k", lambda: 7) == 7


def test_a_computation_whose_script_was_stopped_is_computed_by_a_waiter():
    """A session loading a model is stopped by a click (Streamlit raises StopException, not an Exception, in
    its script): the sessions waiting for the same model load it themselves instead of failing with it."""
    cache = ByteBudgetCache("t", MB)
    started, release, results = threading.Event(), threading.Event(), []

    def stopped():
        started.set()
        release.wait(10)
        raise StopException()

    def owner():
        with pytest.raises(StopException):
            cache.get_or_compute("k", stopped)

    first = threading.Thread(target=owner)
    first.start()
    started.wait(10)
    waiter = threading.Thread(target=lambda: results.append(cache.get_or_compute("k", lambda: "loaded")))
    waiter.start()
    release.set()
    first.join(10)
    waiter.join(10)
    assert results == ["loaded"] and cache.get_or_compute("k", lambda: pytest.fail("cached")) == "loaded"


def test_size_of_counts_shared_buffers_once_and_follows_containers():
    a = array(2)
    views = [a[:MB], a[MB:]]
    assert size_of(views) - size_of([None, None]) == pytest.approx(2 * MB, rel=0.001)  # the buffer, once
    assert size_of({"x": b"1" * MB, "y": (array(1),)}) == pytest.approx(2 * MB, rel=0.01)
