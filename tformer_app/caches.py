"""The app's one cache layer: everything the server keeps between requests is here, bounded in bytes.

- Models (`cached_model`, `load_model`): one object per source for the whole server, shared by every
  session (the core's capture is per call, so sharing is safe); at most TFORMER_MODELS_MB of weights,
  least recently used dropped first. A failed load is remembered for RETRY_AFTER_S.
- Results (`cached`): what a model computes for an input (a trace, a translation, a continuation, a
  picture's trace), per (kind, model, input), stored compactly (`Trace.compact`: attention weights recomputed
  from Q and K when read; only what the views read). Changing only the view (layer, head, token,
  step, colours) reads the cached result and runs no model.
- Derived views (`derived`, `from_model`): what a view computes once from a result (the overview
  picture, the distance grid, a picture's patch grid) or from a model alone (its filters).
- Long work over many inputs (`computed`) shows a progress bar in the page that asked.

Results, derived views and long work share one budget, TFORMER_CACHE_MB, with least-recently-used
eviction (tformer_app.budget); what they hold on a GPU (traces stay on their model's device) is bounded apart
(TFORMER_GPU_MB, tformer_app.settings). Forward passes run at most TFORMER_PASSES at a time, counted per GPU
across the server's processes when the models run on one (tformer_app.gpu). Every cached value is shared by
all sessions and read-only: pages must not modify them.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import streamlit as st
import torch

import tformer_core as tc
from tformer_core.bundled import BUNDLED_MODELS
from tformer_core.checkpoints import BUNDLED_TEXT
from tformer_core.checkpoints.sources import looks_like_path
from tformer_core.trace import lean
from tformer_views import detection as dv
from tformer_views import distance, overview, pictures, samples, search
from tformer_views import generation as gen
from tformer_views import inductive_bias as ib
from tformer_views import mae as mv
from tformer_views import seq2seq as sv
from tformer_views import vision as vv
from tformer_views.lessons import block as lb

from . import gpu, session_models
from .budget import ByteBudgetCache, CacheStats
from .markdown import escape
from .settings import server_settings

Progress = Callable[[float, str], None]
RETRY_AFTER_S = 300.0  # a failed load is not tried again for this long (an unreachable hub costs seconds a try)
SLACK = 128 * 2**20  # freed memory the process may keep for reuse before it is handed back to the OS

SETTINGS = server_settings()

# Once per server process (this module is imported once; app.py runs on every rerun). Traces allocate and
# free hundreds of MB per request: keep that memory for reuse, in few heaps, and give it back when the
# caches drop entries (`_freed`). See tformer_core/runtime.py.
tc.limit_malloc_arenas(2)
tc.retain_freed_memory()
DEVICE = gpu.server_device()  # where this process runs its models
gpu.limit_gpu_memory(SETTINGS.gpu_bytes, DEVICE)  # TFORMER_GPU_MB: this replica's share of a shared GPU


# ---- memory given back ---------------------------------------------------------------------------
class _GiveBack:
    """Keeps the process's resident memory close to what it holds.

    What a request frees (a forward pass's activations, a decoded photo) and what the caches evict stays in
    glibc's heaps for reuse (`retain_freed_memory`: it saves page faults on the next trace). After each
    computation the process's RSS beyond what the caches hold is compared with its level after the last
    hand-back; once it has grown by more than SLACK, the freed memory goes back to the OS (malloc_trim, a
    few milliseconds).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.level: int | None = None  # RSS minus cached bytes right after the last hand-back

    def check(self, _evicted: int = 0) -> None:
        rss = rss_bytes()
        if rss is None:
            return
        with self.lock:
            if self.level is not None and rss - _held() <= self.level + SLACK:
                return
            tc.release_freed_memory()
            after = rss_bytes()
            self.level = (after if after is not None else rss) - _held()


def _held() -> int:
    return _results.stats().used_bytes + _models.stats().used_bytes


_give_back = _GiveBack()


# ---- models ------------------------------------------------------------------------------------
def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


_models = ByteBudgetCache("models", SETTINGS.models_bytes, weigh=model_bytes, on_evict=_give_back.check)
_failures: OrderedDict[str, tuple[Exception, float]] = OrderedDict()
_failures_lock = threading.Lock()


def cached_model(source: str, progress: Progress | None = None) -> tc.TracedModel:
    """The model for `source`, loaded once per server process; raises what the loader raises.

    Concurrent sessions asking for one model load it once. A failed load is tried again after
    RETRY_AFTER_S (until then the same error comes back at once, without touching the hub). A model trained
    on the Train page ("session:...") comes from this session's own models, never from the shared cache.
    """
    if session_models.is_session_name(source):
        return session_models.get(source)
    with _failures_lock:
        failure = _failures.get(source)
    if failure is not None and time.monotonic() - failure[1] < RETRY_AFTER_S:
        raise failure[0]
    try:
        return _models.get_or_compute(source, lambda: tc.load_model(source, progress=progress))
    except (tc.CheckpointError, ValueError, OSError) as error:
        with _failures_lock:
            _failures[source] = (error, time.monotonic())
            while len(_failures) > 64:
                _failures.popitem(last=False)
        raise


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


def is_server_model(source: str) -> bool:
    """True for the models this server offers itself (bundled ones and folders under its model folders,
    named as `local_model_names` names them), False for a hub id someone typed."""
    return source in BUNDLED_TEXT or source in BUNDLED_MODELS or looks_like_path(source)


def loaded_models() -> list[str]:
    """Every source whose model this server process holds now."""
    return sorted({model.source for model in _models.values()})


# ---- what a model computes for an input ----------------------------------------------------------
_UNREAD = (".mlp.hidden", ".mlp.out", ".attn.out", ".resid_after_attn", ".resid_after_cross", ".resid_post")


def views_read(name: str) -> bool:
    """What the attention, vision and lesson views read from a trace: no [heads, n, n] parts (recomputed
    from Q and K when read), no FFN internals, no residual stream after the attention."""
    return lean(name) and not name.endswith(_UNREAD) and ".cross_attn.out" not in name


def _trace_text(model: tc.TracedModel, text: str, pair: str | None) -> tc.Trace:
    trace = model.trace(text, pair=pair, keep=views_read) if pair else model.trace(text, keep=views_read)
    return trace.compact()


def _translate(model: tc.TracedModel, source: str, max_new_tokens: int) -> sv.Translation:
    return _compact_translation(sv.translate(model, source, max_new_tokens))


def _teacher(model: tc.TracedModel, source: str, target: str) -> sv.Translation:
    return _compact_translation(sv.teacher_force(model, source, target))


def _compact_translation(t: sv.Translation) -> sv.Translation:
    steps = None if t.steps is None else tuple(s.compact(views_read) for s in t.steps)
    return replace(t, trace=t.trace.compact(views_read), steps=steps)


def _generate(
    model: tc.TracedModel, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None, seed: int
) -> gen.Continuation:
    return gen.continue_text(model, prompt, max_new_tokens, gen.sampling_of(temperature, top_k, seed))


def _analyse_image(model: tc.TracedModel, data: bytes, name: str) -> vv.VisionResult:
    result = vv.analyse(model, data, name)
    return replace(result, trace=result.trace.compact(views_read))


def _token_distance(model: tc.TracedModel, text: str) -> tuple[Any, float]:
    """(mean attention distance [layers, heads] in tokens, uniform baseline) of one sentence; the
    trace is dropped as soon as its figures are computed (a batch of 64 sentences keeps 64 small grids)."""
    trace = model.trace(text, keep=lambda name: name.endswith((".attn.q", ".attn.k", ".attn.mask")))
    return distance.token_distances(trace), distance.uniform_token_distance(trace)


# kind -> function(model, *args).
COMPUTATIONS: dict[str, Callable[..., Any]] = {
    "text": _trace_text,  # (text, second segment or None) -> Trace
    "translate": _translate,  # (source, max new tokens) -> Translation (greedy, every step traced)
    "teacher": _teacher,  # (source, target) -> Translation (teacher forcing)
    # (prompt, max new tokens, temperature (0: greedy), top-k or None, seed) -> Continuation: each step's
    # attention rows and top-k, not its trace (a decoder-only model continuing a text)
    "generate": _generate,
    "image": _analyse_image,  # (image file bytes, file name) -> VisionResult
    "token_distance": _token_distance,  # (text) -> ([layers, heads] tokens, uniform baseline)
    # Inside a block: the residual stream, norms and sub-layer outputs (lb.block_read), no attention internals.
    "block_text": lb.trace_text,  # (text) -> Trace of an encoder or decoder-only model
    "block_translation": lb.trace_translation,  # (source) -> Translation (greedy, no step traces)
    "block_image": lb.trace_image,  # (image file bytes, file name) -> VisionResult
    # The small models of attention before Transformers (a sentiment model, an RNN encoder-decoder): their
    # whole trace, a few KB (no [heads, n, n] parts to drop). (text) -> Trace
    "small_trace": lambda model, text: model.trace(text),
    # Inductive bias: (image bytes, file name, shift in px) -> ShiftStudy; (bytes, name, shifts) -> DataFrame
    "shift": ib.shift_study,
    "shift_sweep": lambda model, data, name, shifts: ib.sweep(model, data, name, list(shifts)),
    # Masked autoencoder: (image bytes, file name, masking seed) -> MAEResult; DETR: (bytes, name) -> DetrResult
    "mae": mv.analyse,
    "detr": dv.analyse,
}

_results = ByteBudgetCache(
    "results", SETTINGS.cache_bytes, on_evict=_give_back.check, device_budget_bytes=SETTINGS.results_gpu_bytes
)
_passes = gpu.pass_slots(SETTINGS.passes, DEVICE)  # per GPU across processes when the models run on one


def _key(args: tuple) -> tuple:
    """A cache key for `args`: file contents (bytes) by their digest, so keys stay small and cheap to hash."""
    return tuple(
        ("blake2b", len(a), hashlib.blake2b(a, digest_size=16).hexdigest()) if isinstance(a, bytes) else a for a in args
    )


def _owned(source: object) -> None:
    """A trained model's results are this session's only: CheckpointError before any cache is read when
    `source` names another session's model (its results may be cached under that name)."""
    if isinstance(source, str) and session_models.is_session_name(source):
        session_models.get(source)


def in_turn(compute: Callable[[], Any]) -> Any:
    """compute() when a forward-pass slot is free: at most TFORMER_PASSES passes run at once, so a burst of
    requests queues instead of sharing the cores (and the memory of their activations) all at once."""
    with _passes:
        return compute()


def cached(kind: str, source: str, *args: Any) -> Any:
    """COMPUTATIONS[kind](the model for `source`, *args), computed once per (kind, source, args)."""
    if kind not in COMPUTATIONS:
        raise ValueError(f"unknown cached computation {kind!r}")
    _owned(source)

    def compute() -> Any:
        model = cached_model(source)
        try:
            return in_turn(lambda: COMPUTATIONS[kind](model, *args))
        finally:
            _give_back.check()  # the pass's activations are free now

    return _results.get_or_compute(("result", kind, source, *_key(args)), compute)


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
    # (result, stack, query) -> [layers, heads, keys]: one query's weights everywhere, for the head search
    "query_rows": lambda result, stack, query: search.query_rows(trace_of(result), query, stack),
    "grid_picture": _picture_png(pictures.grid_picture),  # (vision result) -> PNG
    "patch_sequence": _picture_png(pictures.patch_sequence),  # (vision result) -> PNG
    "image_distances": lambda result: distance.image_distances(result.trace),  # (vision result) -> [layers, heads]
    # (vision result, head fusion, discard ratio) -> [rows, cols]: the same for every layer, head and patch
    "rollout": lambda result, fusion, discard: vv.rollout_map(result.trace, fusion, discard),
    # (any result, stack) -> lb.StreamNorms: the residual stream's size per layer and token
    "stream_norms": lambda result, stack: lb.stream_norms(trace_of(result), stack),
}


def derived(view: str, key: tuple, *args: Any) -> Any:
    """VIEWS[view](cached(*key), *args) once per (view, key, args): key is what `cached` was called with."""
    if view not in VIEWS:
        raise ValueError(f"unknown derived view {view!r}")
    _owned(key[1] if len(key) > 1 else "")
    return _results.get_or_compute(("derived", view, _key(key), *_key(args)), lambda: VIEWS[view](cached(*key), *args))


def _figure_7(model: tc.TracedModel) -> tuple[bytes, list[float], bytes]:
    pcs, variance = vv.embedding_filter_pcs(model)
    return pictures.to_png(pcs), [float(v) for v in variance], pictures.to_png(vv.position_similarity_maps(model))


# view -> function(model, *args)
MODEL_VIEWS: dict[str, Callable[..., Any]] = {
    "figure_7": _figure_7  # ViT: (filter PCs as PNG, their variance shares, position similarity maps as PNG)
}


def from_model(view: str, source: str, *args: Any) -> Any:
    """MODEL_VIEWS[view](the model for `source`, *args), once per (view, source, args)."""
    if view not in MODEL_VIEWS:
        raise ValueError(f"unknown model view {view!r}")
    _owned(source)
    return _results.get_or_compute(
        ("model-view", view, source, *_key(args)), lambda: MODEL_VIEWS[view](cached_model(source), *args)
    )


def sample_pictures() -> dict[str, bytes]:
    """The sample pictures (tformer_views.samples), read once per set of configured image folders."""
    dirs = tuple(str(d) for d in samples.image_dirs())
    return _results.get_or_compute(("samples", dirs), samples.samples)


# ---- longer computations with a progress bar ------------------------------------------------------
def computed(key: tuple, compute: Callable[[Progress], Any], label: str) -> Any:
    """compute(progress) once per `key` for the whole server, with a progress bar in the page that asked
    (a session asking for the same key meanwhile waits for that result). For work too long to wait for
    without one (many pictures).

    The bar is drawn outside any Streamlit cache: Streamlit replays elements drawn inside a cached
    function on later hits, and the bar belongs to the page that asked first.
    """
    slot = st.empty()

    def run() -> Any:
        bar = slot.progress(0.0, text=escape(label))
        try:
            return in_turn(lambda: compute(lambda f, m: bar.progress(min(max(f, 0.0), 1.0), text=escape(m))))
        finally:
            _give_back.check()

    try:
        return _results.get_or_compute(("computed", *_key(key)), run)
    finally:
        slot.empty()


# ---- for the server page and the tests --------------------------------------------------------------
@dataclass(frozen=True)
class MemoryReport:
    results: CacheStats
    models: CacheStats
    rss_bytes: int | None
    gpu_bytes: int | None = None  # what this process's tensors hold on its GPU; None without one


def rss_bytes() -> int | None:
    """This process's resident memory (Linux), or None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_report() -> MemoryReport:
    on_gpu = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else None
    return MemoryReport(_results.stats(), _models.stats(), rss_bytes(), on_gpu)


def clear_results() -> int:
    """Drop every cached result (models stay loaded) and give the memory back; returns the bytes dropped."""
    freed = _results.clear()
    _give_back.level = None  # hand everything back now
    _give_back.check()
    return freed


def clear_models() -> None:
    """Drop every model (tests: a fresh server) and every remembered failure."""
    _models.clear()
    with _failures_lock:
        _failures.clear()
