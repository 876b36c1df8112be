"""The model cache: one model object per source for the whole server, shared by every session (the core's capture
is per call, so sharing is safe); at most TFORMER_MODELS_MB of weights, least recently used dropped first.

A page loads a model with `load_model` (a progress bar on first use, the loader's message instead of an error), the
rest of the app with `cached_model`. A failed load is remembered for RETRY_AFTER_S, which also tells the model
lists whether the hub can be reached (`hub_unreachable`). A model trained on the Train page comes from its
session's own models (tformer_app.session_models), never from this cache.

Importing it sets the server process up, once: glibc keeps freed memory for reuse, in few heaps
(tformer_app.memory), and the process's device and its share of a shared GPU are chosen (tformer_app.gpu).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import streamlit as st
import torch
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

import tformer_core as tc
from tformer_core.bundled import BUNDLED_MODELS
from tformer_core.checkpoints import BUNDLED_TEXT, gguf
from tformer_core.checkpoints.sources import looks_like_path

from . import gpu, logs, memory, session_models
from .budget import ByteBudgetCache
from .markdown import escape
from .settings import server_settings

Progress = Callable[[float, str], None]
BAR_EVERY_S = 0.1  # `progress_bar(after_s)`: redrawn at most this often
RETRY_AFTER_S = 300.0  # a failed load is not tried again for this long (an unreachable hub costs seconds a try)

SETTINGS = server_settings()

# Once per server process (this module is imported once; app.py runs on every rerun). Traces allocate and
# free hundreds of MB per request: keep that memory for reuse, in few heaps, and give it back when the
# caches drop entries (memory.GIVE_BACK). See tformer_app/memory.py.
memory.limit_malloc_arenas(2)
memory.retain_freed_memory()
DEVICE = gpu.server_device()  # where this process runs its models
gpu.limit_gpu_memory(SETTINGS.gpu_bytes, DEVICE)  # TFORMER_GPU_MB: this replica's share of a shared GPU


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


MODELS = ByteBudgetCache("models", SETTINGS.models_bytes, weigh=model_bytes, on_evict=memory.GIVE_BACK.check)
memory.GIVE_BACK.add_holder(lambda: MODELS.stats().used_bytes)


@dataclass(frozen=True)
class _Failure:
    """A load that failed: its message, and no exception object. An exception raised again keeps growing its
    traceback with every page that hits it, and keeps those pages' frames (their uploads, their traces) alive."""

    message: str
    at: float

    def error(self) -> tc.CheckpointError:
        """A new exception, with a traceback of its own, each time."""
        return tc.CheckpointError(self.message)


_failures: OrderedDict[str, _Failure] = OrderedDict()
_failures_lock = threading.Lock()


def cached_model(source: str, progress: Progress | None = None) -> tc.TracedModel:
    """The model for `source`, loaded once per server process; CheckpointError when it cannot be loaded.

    Concurrent sessions asking for one model load it once. A failed load is logged with its cause once, and
    tried again after RETRY_AFTER_S (until then a new error with the same message comes back at once,
    without touching the hub). A bug in the loader (any other exception) is raised as it is. A model trained
    on the Train page ("session:...") comes from this session's own models, never from the shared cache.
    """
    if session_models.is_session_name(source):
        return session_models.get(source)
    with _failures_lock:
        failure = _failures.get(source)
    if failure is not None and time.monotonic() - failure.at < RETRY_AFTER_S:
        raise failure.error()
    try:
        return MODELS.get_or_compute(source, lambda: tc.load_model(source, progress=progress))
    except (tc.CheckpointError, OSError) as error:  # OSError: a file system's own refusal (a full disk...)
        logs.failure(f"loading the model {source!r}", error)
        message = str(error) if isinstance(error, tc.CheckpointError) else f"{source} cannot be read from disk"
        with _failures_lock:
            _failures[source] = _Failure(message, time.monotonic())
            while len(_failures) > 64:
                _failures.popitem(last=False)
        raise tc.CheckpointError(message) from None


@contextlib.contextmanager
def progress_bar(after_s: float = 0.0) -> Iterator[Progress]:
    """A progress bar in the page for work other sessions may be waiting on (a model load, many pictures),
    removed afterwards. A rerun asked for meanwhile (a click, a key) reaches the script where the bar is drawn:
    it is held until the work is done and raised then, so the work is not thrown away, for this session or
    for the others waiting on it.

    after_s: drawn only once the work has taken this long (a click's ablation: a bar that came and went within
    half a second would only flicker), then at most every BAR_EVERY_S (a report per layer)."""
    slot = st.empty()
    held: list[ScriptControlException] = []
    started, drawn = time.monotonic(), [0.0]

    def progress(fraction: float, message: str) -> None:
        if held:
            return
        now = time.monotonic()
        if after_s and (now - started < after_s or now - drawn[0] < BAR_EVERY_S):
            return
        drawn[0] = now
        try:
            slot.progress(min(max(fraction, 0.0), 1.0), text=escape(message))
        except ScriptControlException as stop:
            held.append(stop)

    try:
        yield progress
    finally:
        slot.empty()
    if held:
        raise held[0]


def hub_unreachable() -> bool:
    """True when the hub is switched off (HF_HUB_OFFLINE), or a load failed in the last RETRY_AFTER_S because it
    could not be reached: then a hub model not in the local cache cannot be had (the model lists say so)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    now = time.monotonic()
    with _failures_lock:
        recent = [failure.message for failure in _failures.values() if now - failure.at < RETRY_AFTER_S]
    return any("cannot be reached" in message for message in recent)


def load_model(source: str, quiet: bool = False) -> tc.TracedModel | None:
    """The cached model for `source`, loading it with a progress bar on first use.

    On failure, shows the loader's message (unknown id, offline hub, unsupported family...) and
    returns None: the page stops drawing that part, the session keeps working. quiet: no message
    (the page falls back to another model and says so itself).
    """
    try:
        with progress_bar() as progress:
            return cached_model(source, progress)
    except tc.CheckpointError as error:
        if not quiet:
            st.error(f"Could not load **{escape(source)}**: {escape(error)}")
        return None
    except Exception as error:  # a bug in a loader: said as one, never as if the model id were wrong
        what = f"Loading {source}"
        note_id = logs.bug(what, error)
        if not quiet:
            st.error(logs.bug_note(what, note_id))
        return None


def is_server_model(source: str) -> bool:
    """True for the models this server offers itself (bundled ones and folders under its model folders,
    named as `local_model_names` names them), False for a hub id someone typed."""
    return source in BUNDLED_TEXT or source in BUNDLED_MODELS or looks_like_path(source)


def is_loaded(source: str) -> bool:
    """True when this server holds the model for `source` already (using it costs no load)."""
    return source in loaded_models()


def loaded_models() -> list[str]:
    """Every source whose model this server process holds now."""
    return sorted({model.source for model in MODELS.values()})


def clear_models() -> None:
    """Drop every model (tests: a fresh server) and every remembered failure."""
    MODELS.clear()
    with _failures_lock:
        _failures.clear()


_warmed = threading.Event()


def warm_up() -> threading.Thread | None:
    """Once per process: when SmolLM2 is installed but not yet converted into TFORMER_CACHE_DIR, convert it in the
    background now (a Python process of its own, 20-40 s quiet, minutes on a loaded machine), so that the first
    student to open a page with it ("Does this head matter?" opens on it) does not wait for that on top of the
    page's own work (230 s for a first visit of /heads on a fresh server at load 12). A page that asks for it
    meanwhile waits for this conversion (one at a time per cache folder). Returns the thread, or None."""
    if _warmed.is_set():
        return None
    _warmed.set()
    if "smollm2" not in gguf.GGUF_MODELS or gguf.is_converted("smollm2"):
        return None

    def convert() -> None:
        try:
            started = time.perf_counter()
            gguf.converted_folder("smollm2")
            logs.log.info("smollm2 converted in the background in %.0f s", time.perf_counter() - started)
        except (tc.CheckpointError, OSError) as error:  # a page that asks for it later says why
            logs.failure("converting smollm2 in the background", error)

    logs.log.info("smollm2 is not converted yet: converting it in the background (once per TFORMER_CACHE_DIR)")
    thread = threading.Thread(target=convert, name="tformer-warm-up", daemon=True)
    thread.start()
    return thread
