"""The app's one cache layer: a result and what is derived from it are computed once and shared; a model
the cache has dropped is no longer listed as loaded."""

import gc

import pytest

from tformer_app import caches


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
    caches.cached.clear()
    caches.derived.clear()
    yield calls
    caches.cached.clear()
    caches.derived.clear()


def test_a_result_and_its_derived_views_are_computed_once(counted):
    key = ("test-upper", "vit-tiny", "hello")
    first = caches.cached(*key)
    assert caches.cached(*key) is first and counted["compute"] == 1
    assert first == {"text": "hello", "model": "vit-tiny"}
    assert caches.derived("test-suffix", key, "!") == "hello!"
    assert caches.derived("test-suffix", key, "!") == "hello!" and counted["view"] == 1
    assert caches.derived("test-suffix", key, "?") == "hello?" and counted["view"] == 2  # other view settings
    assert counted["compute"] == 1  # the derived views read the cached result
    with pytest.raises(ValueError, match="unknown derived view"):
        caches.derived("no-such-view", key)


def test_the_sidebar_lists_only_the_models_the_cache_holds():
    caches.cached_model("vit-tiny")
    assert "vit-tiny" in caches.loaded_models()
    caches._model_slot.clear()  # what Streamlit does when it evicts an entry
    gc.collect()
    assert "vit-tiny" not in caches.loaded_models()
