"""The server process's memory (tformer_app.memory): glibc keeps freed heap memory for the next pass and hands it
back when asked; GiveBack hands it back once the process holds more than its caches and sessions do, and counts
what it cannot hand back in the results' budget."""

import numpy as np
import pytest

from tformer_app import logs, memory, results, sessions, upkeep

mb = 2**20


def test_freed_heap_memory_is_kept_for_reuse_and_handed_back_when_asked():
    """The server's allocator settings (tformer_app.models sets them at import): 64 MB freed in 1 MB blocks stays
    resident, ready for the next trace without page faults, until `release_freed_memory` gives it to the OS."""
    if memory.rss_bytes() is None or not memory.release_freed_memory():
        pytest.skip("needs Linux's /proc and glibc")
    assert memory.limit_malloc_arenas(2) and memory.retain_freed_memory()
    before = memory.rss_bytes()
    blocks = [bytearray(b"x" * mb) for _ in range(64)]  # in the heap: below the 32 MB mmap threshold, each touched
    held = memory.rss_bytes()
    del blocks
    kept = memory.rss_bytes()
    assert memory.release_freed_memory()
    after = memory.rss_bytes()
    assert before is not None and held is not None and kept is not None and after is not None
    assert held - before >= 60 * mb  # the blocks are resident
    assert kept - before >= 56 * mb  # freed, and kept (glibc trims only beyond 1 GiB)
    assert kept - after >= 56 * mb  # handed back


@pytest.fixture
def memory_readings(monkeypatch, sweeper_paused):
    """The process's RSS read from a list a test fills (in MB, nothing held by the caches) and each hand-back
    counted: (readings, trims)."""
    readings: list[int] = []
    trims: list[int] = []
    monkeypatch.setattr(memory, "rss_bytes", lambda: readings.pop(0) * mb)
    monkeypatch.setattr(memory.GIVE_BACK, "holders", [])  # the server's own counts nothing held either
    monkeypatch.setattr(memory, "release_freed_memory", lambda: trims.append(1) or True)
    # The server's sweeper (started by earlier AppTests in this process) would sweep the test's GiveBack with the
    # real models' bytes, starting its floor anew mid-test: the test asks for sweeper_paused.
    yield readings, trims


def test_freed_memory_is_handed_back_against_the_lowest_level_seen(memory_readings):
    """_GiveBack compares RSS minus held bytes with a level. Read once after each hand-back, the level took in what
    was alive only at that moment (a picture being drawn); freed later, that memory was never handed back (175 MB
    after 80 photos). The level is the lowest reading since the last sweep: a higher one never raises it."""
    readings, trims = memory_readings
    give_back = memory.GiveBack()
    readings += [600, 470]  # a pass freed 130 MB: handed back, 470 MB stay
    give_back.check()
    assert len(trims) == 1 and give_back.level == 470 * mb
    readings += [560, 520]  # handed back while 50 MB of another session's picture were alive
    give_back.check()
    assert len(trims) == 2 and give_back.level == 470 * mb
    readings += [520, 470]  # the picture freed and kept: 50 MB over the level, more than SLACK (32 MB)
    give_back.check()
    assert len(trims) == 3 and give_back.level == 470 * mb
    readings += [490]  # 20 MB kept for the next pass: within SLACK, nothing to do
    give_back.check()
    assert len(trims) == 3 and not readings


def test_freed_memory_that_cannot_be_handed_back_is_counted_in_the_results_budget(monkeypatch, memory_readings):
    """glibc hands back whole free pages only: freed memory scattered among live objects stays resident. A class
    uploading photos left 60 to 210 MB of it beyond TFORMER_CACHE_MB. Each full sweep compares its interval's
    level (RSS minus held, the lowest since the sweep before) with the floor, the lowest level since the models
    last changed; what lies above is counted in the results' budget beside the sessions' uploads, and the oldest
    results make room for it. A model loaded starts the floor anew: its tokenizer is the process's own memory."""
    readings, trims = memory_readings
    give_back = memory.GiveBack()
    monkeypatch.setattr(memory, "GIVE_BACK", give_back)

    readings += [470, 470]  # the first sweep: models loaded since none were, no floor yet
    give_back.swept(models_bytes=100 * mb)
    assert give_back.floor is None and give_back.kept == 0 and give_back.level == 470 * mb
    readings += [480]  # a reading within SLACK of the level
    give_back.check()
    readings += [475, 475]
    give_back.swept(models_bytes=100 * mb)  # the interval's level, 470 MB, is the floor
    assert give_back.floor == 470 * mb and give_back.kept == 0 and give_back.level == 475 * mb
    readings += [650, 560]  # photos uploaded, freed: 90 MB of it stays after the hand-back
    give_back.check()
    readings += [560, 555]
    give_back.swept(models_bytes=100 * mb)  # the lowest of that interval was the sweep's own 475 MB
    assert give_back.kept == 5 * mb
    readings += [556]
    give_back.check()
    readings += [556, 556]
    records: list[tuple] = []  # the arguments of each info line
    monkeypatch.setattr(logs.log, "info", lambda *args: records.append(args))
    give_back.swept(models_bytes=100 * mb)  # a whole interval 85 MB above the floor
    assert give_back.floor == 470 * mb and give_back.kept == 85 * mb and give_back.level == 556 * mb
    assert [r[0] % r[1:] for r in records] == [  # the operator sees it change
        "freed memory not given back: 85 MB (was 0 MB), counted in the results' budget"
    ]  # 5 MB, before, was not worth a line: a line once it has moved by SLACK since the last one

    assert not readings and len(trims) == 5  # each of the 4 sweeps handed back, and the photos' 90 MB once
    monkeypatch.setattr(memory, "rss_bytes", lambda: 556 * mb)  # from now on, as steady as that
    upkeep.clear_results()
    monkeypatch.setattr(sessions, "held_bytes", lambda: 0)
    monkeypatch.setattr(results.RESULTS, "budget_bytes", 100 * mb)
    for name in ("a", "b", "c"):
        results.RESULTS.get_or_compute(("test-kept", name), lambda: np.ones(10 * mb, np.uint8))
    assert results.RESULTS.stats().used_bytes == 10 * mb  # 85 MB kept + one result of 10 MB fit 100 MB
    assert upkeep.memory_report().kept_bytes == 85 * mb

    # another model: the floor starts anew, nothing counted until the next interval
    give_back.swept(models_bytes=300 * mb)
    assert give_back.floor is None and give_back.kept == 0
    upkeep.clear_results()
