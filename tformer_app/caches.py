"""The app's one cache layer: every st.cache_* of the project is here, and nothing else keeps results.

- Models are cached once per server process (`cached_model`: one object shared by every session;
  the core's capture is per call, so sharing is safe), loaded with a progress bar (`load_model`).
- What a model computes for an input (a trace, a translation, a picture's trace) is cached per
  (kind, model, input) (`cached`): changing only the view (layer, head, token, step, colours) reads
  the cached result and runs no model.
- What a view derives once from such a result (the overview picture, the distance grid, a
  picture's patch grid) is cached per (view, the result's key, view settings) (`derived`); what is
  derived from a model alone (its filters) per (view, model) (`from_model`).
- Long work over many inputs (`computed`) shows a progress bar in the page that asked.

Every cached result is shared by all sessions and read-only: pages must not modify them.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import streamlit as st

import tformer_core as tc
from tformer_views import distance, overview, pictures, samples
from tformer_views import seq2seq as sv
from tformer_views import vision as vv

from .markdown import escape

Progress = Callable[[float, str], None]
RETRY_AFTER_S = 300.0  # a failed load is not tried again for this long (an unreachable hub costs seconds a try)


# ---- models ------------------------------------------------------------------------------------
class _ModelSlot:
    """Where one model lives once loaded; the lock makes concurrent sessions load it only once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.model: tc.TracedModel | None = None
        self.error: Exception | None = None
        self.failed_at = 0.0


# Slots Streamlit's cache still holds, for the sidebar: a slot the cache evicts disappears from here too.
_slots: weakref.WeakValueDictionary[str, _ModelSlot] = weakref.WeakValueDictionary()


# The slot, not the model, is what Streamlit caches: loading reports progress to the page that asked,
# and Streamlit replays any element drawn inside a cached function on later hits, where that page's
# progress bar no longer exists. So the cached function draws nothing and loading happens outside it.
@st.cache_resource(show_spinner=False, max_entries=6)
def _model_slot(source: str) -> _ModelSlot:
    slot = _ModelSlot()
    _slots[source] = slot
    return slot


def cached_model(source: str, progress: Progress | None = None) -> tc.TracedModel:
    """The model for `source`, loaded once per server process; raises what the loader raises.

    A failed load is tried again after RETRY_AFTER_S (until then the same error comes back at once).
    """
    slot = _model_slot(source)
    with slot.lock:
        if slot.model is None:
            if slot.error is not None and time.monotonic() - slot.failed_at < RETRY_AFTER_S:
                raise slot.error
            try:
                model = tc.load_model(source, progress=progress)
            except (tc.CheckpointError, ValueError, OSError) as error:
                slot.error, slot.failed_at = error, time.monotonic()
                raise
            slot.model, slot.error = model, None
        return slot.model


def load_model(source: str, quiet: bool = False) -> tc.TracedModel | None:
    """The cached model for `source`, loading it with a progress bar on first use.

    On failure, shows the loader's message (unknown id, offline hub, unsupported family...) and
    returns None: the page stops drawing that part, the session keeps working. quiet: no message
    (the page falls back to another model and says so itself).
    """
    bar = st.empty()

    def progress(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=escape(message))

    try:
        return cached_model(source, progress)
    except (tc.CheckpointError, ValueError, OSError) as error:
        if not quiet:
            st.error(f"Could not load **{escape(source)}**: {escape(error)}")
        return None
    finally:
        bar.empty()


def loaded_models() -> list[str]:
    """Sources of the models this server process holds now (for the sidebar)."""
    return sorted(source for source, slot in list(_slots.items()) if slot.model is not None)


# ---- what a model computes for an input -------------------------------------------------------------
def _trace_text(model: tc.TracedModel, text: str, pair: str | None) -> tc.Trace:
    return model.trace(text, pair=pair) if pair else model.trace(text)


# kind -> function(model, *args).
COMPUTATIONS: dict[str, Callable[..., Any]] = {
    "text": _trace_text,  # (text, second segment or None) -> Trace
    "translate": sv.translate,  # (source, max new tokens) -> Translation (greedy, every step traced)
    "teacher": sv.teacher_force,  # (source, target) -> Translation (teacher forcing)
    "image": vv.analyse,  # (image file bytes, file name) -> VisionResult
}


@st.cache_resource(show_spinner=False, max_entries=64)
def cached(kind: str, source: str, *args: Any) -> Any:
    """COMPUTATIONS[kind](the model for `source`, *args), computed once per (kind, source, args)."""
    if kind not in COMPUTATIONS:
        raise ValueError(f"unknown cached computation {kind!r}")
    return COMPUTATIONS[kind](cached_model(source), *args)


# ---- what a view derives from a computed result --------------------------------------------------------
def trace_of(result: tc.Trace | sv.Translation | vv.VisionResult) -> tc.Trace:
    """The trace inside a cached result (a translation's teacher-forced pass, a picture's trace)."""
    return result if isinstance(result, tc.Trace) else result.trace


def _picture_png(draw: Callable[..., Any]) -> Callable[[vv.VisionResult], bytes]:
    return lambda result: pictures.to_png(draw(result.image, result.patch_size))


# view -> function(the cached result, *view args).
VIEWS: dict[str, Callable[..., Any]] = {
    # (result, stack, hide special tokens) -> ...
    "overview": lambda result, stack, hide: overview.overview(trace_of(result), stack, hide_special=hide),
    "token_distances": lambda result, stack, hide: distance.token_distances(trace_of(result), stack, hide),
    "uniform_token_distance": lambda result, stack, hide: distance.uniform_token_distance(
        trace_of(result), stack, hide
    ),
    "teacher_agreement": sv.teacher_agreement,  # (translation) -> int
    "grid_picture": _picture_png(pictures.grid_picture),  # (vision result) -> PNG
    "patch_sequence": _picture_png(pictures.patch_sequence),  # (vision result) -> PNG
}


@st.cache_resource(show_spinner=False, max_entries=256)
def derived(view: str, key: tuple, *args: Any) -> Any:
    """VIEWS[view](cached(*key), *args) once per (view, key, args): key is what `cached` was called with."""
    if view not in VIEWS:
        raise ValueError(f"unknown derived view {view!r}")
    return VIEWS[view](cached(*key), *args)


def _figure_7(model: tc.TracedModel) -> tuple[bytes, list[float], bytes]:
    pcs, variance = vv.embedding_filter_pcs(model)
    return pictures.to_png(pcs), [float(v) for v in variance], pictures.to_png(vv.position_similarity_maps(model))


# view -> function(model, *args)
MODEL_VIEWS: dict[str, Callable[..., Any]] = {
    "figure_7": _figure_7  # ViT: (filter PCs as PNG, their variance shares, position similarity maps as PNG)
}


@st.cache_resource(show_spinner=False, max_entries=16)
def from_model(view: str, source: str, *args: Any) -> Any:
    """MODEL_VIEWS[view](the model for `source`, *args), once per (view, source, args)."""
    if view not in MODEL_VIEWS:
        raise ValueError(f"unknown model view {view!r}")
    return MODEL_VIEWS[view](cached_model(source), *args)


@st.cache_resource(show_spinner=False, max_entries=4)
def _sample_pictures(image_dirs: tuple[str, ...]) -> dict[str, bytes]:
    return samples.samples()


def sample_pictures() -> dict[str, bytes]:
    """The sample pictures (tformer_views.samples), read once per set of configured image folders."""
    return _sample_pictures(tuple(str(d) for d in samples.image_dirs()))


# ---- longer computations with a progress bar ------------------------------------------------------
_computed: OrderedDict[tuple, Any] = OrderedDict()
_computed_lock = threading.Lock()
MAX_COMPUTED = 16


def computed(key: tuple, compute: Callable[[Progress], Any], label: str) -> Any:
    """compute(progress) once per `key` for the whole server (the last MAX_COMPUTED results are kept),
    with a progress bar in the page that asked. For work too long to wait for without one (many images).

    Not st.cache_resource: Streamlit replays elements drawn inside a cached function on later hits,
    and the progress bar belongs to the page that asked first.
    """
    with _computed_lock:
        if key in _computed:
            _computed.move_to_end(key)
            return _computed[key]
    bar = st.progress(0.0, text=label)
    try:
        value = compute(lambda fraction, message: bar.progress(min(max(fraction, 0.0), 1.0), text=message))
    finally:
        bar.empty()
    with _computed_lock:
        _computed[key] = value
        while len(_computed) > MAX_COMPUTED:
            _computed.popitem(last=False)
    return value
