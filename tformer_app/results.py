"""The app's one cache layer: everything the server keeps between requests is here, bounded in bytes.

- Models (`cached_model`, `load_model`): one object per source for the whole server, shared by every
  session (the core's capture is per call, so sharing is safe); at most TFORMER_MODELS_MB of weights,
  least recently used dropped first. A failed load is remembered for RETRY_AFTER_S.
- Results (`result` of a typed `Request`): what a model computes for an input (a trace, a translation, a
  continuation, a picture's trace), per (kind, model, input), stored compactly (`Trace.compact`: attention weights
  recomputed from Q and K when read; only what the views read). Changing only the view (layer, head, token,
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

import contextlib
import gc
import hashlib
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar, TypeVarTuple

import numpy as np
import pandas as pd
import streamlit as st
import torch
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

import tformer_core as tc
from tformer_core.bundled import BUNDLED_MODELS
from tformer_core.capture import matching
from tformer_core.checkpoints import BUNDLED_TEXT, gguf
from tformer_core.checkpoints.sources import looks_like_path
from tformer_core.interventions import Head
from tformer_core.lens import LogitLens
from tformer_core.patching import ResidualPatching
from tformer_core.trace import lean
from tformer_views import detection as dv
from tformer_views import distance, overview, pictures, samples, search
from tformer_views import generation as gen
from tformer_views import head_matters as hm
from tformer_views import induction as iv
from tformer_views import inductive_bias as ib
from tformer_views import mae as mv
from tformer_views import seq2seq as sv
from tformer_views import vision as vv
from tformer_views.lessons import block as lb

from . import gpu, logs, memory, session_models, sessions
from .budget import MB, ByteBudgetCache, CacheStats
from .markdown import escape
from .settings import server_settings
from .slots import PassGate
from .work import POLL_S, Busy, Job, WorkQueue

Progress = Callable[[float, str], None]
ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)
ViewT = TypeVar("ViewT")
Args = TypeVarTuple("Args")
PROGRESS_AFTER_S = 0.5  # `result`'s bar: drawn once a computation has taken this long
BAR_EVERY_S = 0.1  # and redrawn at most this often
_REPORT: ContextVar[Progress | None] = ContextVar("tformer_report", default=None)  # `reporting`
RETRY_AFTER_S = 300.0  # a failed load is not tried again for this long (an unreachable hub costs seconds a try)
# Freed memory the process may keep for reuse before it is handed back to the OS: more saves page faults on the
# next pass (a few percent of a BERT-base pass), less keeps the resident size closer to what the caches hold.
SLACK = 32 * 2**20

SETTINGS = server_settings()

# Once per server process (this module is imported once; app.py runs on every rerun). Traces allocate and
# free hundreds of MB per request: keep that memory for reuse, in few heaps, and give it back when the
# caches drop entries (`_GiveBack`). See tformer_app/memory.py.
memory.limit_malloc_arenas(2)
memory.retain_freed_memory()
DEVICE = gpu.server_device()  # where this process runs its models
gpu.limit_gpu_memory(SETTINGS.gpu_bytes, DEVICE)  # TFORMER_GPU_MB: this replica's share of a shared GPU


# ---- memory given back ---------------------------------------------------------------------------
class _GiveBack:
    """Keeps the process's resident memory close to what it holds.

    What a request frees (a forward pass's activations, a decoded photo) and what the caches evict stays in
    glibc's heaps for reuse (`retain_freed_memory`: it saves page faults on the next trace). After each
    computation, eviction and sweep, the process's RSS beyond what the caches and sessions hold is compared
    with its level: the lowest it has been since the last sweep. Once it is more than SLACK above, the freed
    memory goes back to the OS (malloc_trim, a few milliseconds).

    Why the lowest: any reading is the process's own memory plus what was freed and kept plus objects alive
    only for the moment (a pass's activations in another session, a picture being drawn). A level read once,
    right after a hand-back, kept such a moment's objects as the level, and the memory they later freed
    stayed (175 MB after 80 photos). A level that only goes down between sweeps misses nothing freed; the
    sweeps (every 30 s) start it afresh, so memory the process keeps for good (a model's tokenizer) costs
    extra hand-backs for at most that long.

    What the hand-back cannot return still counts: freed memory scattered in pages that live objects share
    (glibc returns whole free pages only). A class uploading photos left 60 to 210 MB of it, run to run, beyond
    TFORMER_CACHE_MB (benchmarks/memory.py). Each full sweep compares its interval's level with the floor: the
    lowest level of any interval since the models last changed (a model brings memory of its own that it keeps:
    its tokenizer, its tables). The difference, `kept`, is counted in the results' budget beside the sessions'
    uploads, so the results make room for it and the resident size stays within the budget the operator set.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.level: int | None = None  # the lowest RSS minus held bytes since the last sweep
        self.floor: int | None = None  # the lowest level of a sweep's interval since the models last changed
        self.kept = 0  # the last interval's level above the floor: kept by the process, held by nobody
        self.logged = 0  # `kept` when the log last said it (it says it again once it has moved by SLACK)
        self.models_bytes: int | None = None  # the models' bytes when the floor was started

    def check(self, _evicted: int = 0) -> None:
        rss = rss_bytes()
        if rss is None:
            return
        with self.lock:
            beyond = rss - _held()
            if self.level is not None and beyond <= self.level + SLACK:
                self.level = min(self.level, beyond)
                return
            memory.release_freed_memory()
            after = rss_bytes()
            measured = (after if after is not None else rss) - _held()
            self.level = measured if self.level is None else min(self.level, measured)

    def swept(self, models_bytes: int) -> None:
        """At a full sweep: the interval's level against the floor (the class's docstring), then a new interval,
        everything freed handed back. `models_bytes`: what the models hold now; a change starts the floor anew."""
        with self.lock:
            if models_bytes != self.models_bytes:
                self.floor, self.kept, self.models_bytes = None, 0, models_bytes
            elif self.level is not None:
                self.floor = self.level if self.floor is None else min(self.floor, self.level)
                self.kept = self.level - self.floor
                if abs(self.kept - self.logged) >= SLACK:
                    logs.log.info(
                        "freed memory not given back: %.0f MB (was %.0f MB), counted in the results' budget",
                        self.kept / MB,
                        self.logged / MB,
                    )
                    self.logged = self.kept
            self.level = None
        self.check()


def _held() -> int:
    return _results.stats().used_bytes + _models.stats().used_bytes + sessions.held_bytes()


_give_back = _GiveBack()


# ---- models ------------------------------------------------------------------------------------
def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


_models = ByteBudgetCache("models", SETTINGS.models_bytes, weigh=model_bytes, on_evict=_give_back.check)


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
        return _models.get_or_compute(source, lambda: tc.load_model(source, progress=progress))
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
    return sorted({model.source for model in _models.values()})


# ---- what a model computes for an input ----------------------------------------------------------
_UNREAD = (".mlp.hidden", ".mlp.out", ".attn.out", ".resid_after_attn", ".resid_after_cross", ".resid_post")


def views_read(name: str) -> bool:
    """What the attention, vision and lesson views read from a trace: no [heads, n, n] parts (recomputed
    from Q and K when read), no FFN internals, no residual stream after the attention."""
    return lean(name) and not name.endswith(_UNREAD) and ".cross_attn.out" not in name


def _text_model(model: tc.TracedModel) -> tc.EncoderModel | tc.CausalLM:
    if not isinstance(model, (tc.EncoderModel, tc.CausalLM)):
        raise tc.InputError(f"this reads text with an encoder or a decoder-only model, not a {model.kind} model")
    return model


def _trace_text(model: tc.TracedModel, text: str, pair: str | None) -> tc.Trace:
    reader = _text_model(model)
    if isinstance(reader, tc.EncoderModel):
        trace = reader.trace(text, pair=pair or None, keep=views_read)
    else:
        trace = reader.trace(text, keep=views_read)
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


def _token_distance(model: tc.TracedModel, text: str) -> tuple[np.ndarray, float]:
    """(mean attention distance [layers, heads] in tokens, uniform baseline) of one sentence; the
    trace is dropped as soon as its figures are computed (a batch of 64 sentences keeps 64 small grids)."""
    trace = _text_model(model).trace(text, keep=matching("**.attn.q", "**.attn.k", "**.attn.mask"))
    return distance.token_distances(trace), distance.uniform_token_distance(trace)


def _small_trace(model: tc.TracedModel, text: str) -> tc.Trace:
    """The whole trace of a small model of attention before Transformers (a sentiment model, an RNN
    encoder-decoder): a few KB, no [heads, n, n] parts to drop."""
    if not isinstance(model, (tc.PoolingModel, tc.RecurrentSeq2Seq)):
        raise tc.InputError(f"this reads text with the small models before Transformers, not a {model.kind} model")
    return model.trace(text)


def _shift_sweep(model: tc.TracedModel, data: bytes, name: str, shifts: tuple[int, ...]) -> pd.DataFrame:
    return ib.sweep(model, data, name, list(shifts))


def _head_ablation(
    model: tc.TracedModel, kind: str, output: int | None, stack: str, layer: int, head: int, *inputs: Any
) -> hm.Ablation:
    """One head ablated (hm.ablation), reading the clean trace of the input's study when this server holds it (the
    page that asks has drawn its grid from it): a click on the grid costs one pass, not two. Its progress goes to
    the page that asked (`reporting`)."""
    study = _results.peek(_study_key(kind, model.source, inputs))
    clean = study.trace if isinstance(study, hm.HeadStudy) and study.output == output else None
    return hm.ablation(model, kind, inputs, output, Head(stack, layer, head), clean=clean, progress=reporting())


def _head_lens(model: tc.TracedModel, kind: str, output: int, *inputs: Any) -> LogitLens:
    return hm.lens_of(kind, model, inputs, output)


# The sessions' uploads and the pictures they were sent share this budget: while a class holds many photos,
# fewer results are kept (tformer_app.sessions); so does the freed memory the process cannot hand back
# (_GiveBack.kept). Results on a GPU are bounded apart, in its bytes.
_results = ByteBudgetCache(
    "results",
    SETTINGS.cache_bytes,
    on_evict=_give_back.check,
    device_budget_bytes=SETTINGS.results_gpu_bytes,
    shared=lambda: sessions.held_bytes() + _give_back.kept,
    after_compute=_give_back.check,  # a pass's activations are free then, and its result is counted as held
)
# Per GPU across processes when the models run on one; the pages' passes go before long work's (slots.PassGate).
_passes = PassGate(gpu.pass_slots(SETTINGS.passes, DEVICE))
WORK = WorkQueue(
    _passes,
    workers=SETTINGS.studies,
    on_done=lambda key, value: _results.put(key, value),
    on_bug=lambda what, error: logs.bug(what, error),
)


@dataclass(frozen=True)
class Request(Generic[ResultT_co]):
    """One cached computation, typed by what it gives: compute(the model for `source`, *args).

    Pages build one with the functions below (`text_trace(...)`, `picture(...)`, ...), read it with `result`,
    and hand it to the derived views (`overview_picture`, `query_rows`, ...), so the type checker knows what each
    returns. `kind` names the computation in the cache's keys, one name per computation: equal requests (same
    kind, source and args) share one cached result for the whole server."""

    kind: str
    source: str
    args: tuple[Any, ...]
    compute: Callable[..., ResultT_co] = field(compare=False, repr=False)

    @staticmethod
    def of(
        kind: str, compute: Callable[[tc.TracedModel, *Args], ResultT], source: str, *args: *Args
    ) -> Request[ResultT]:
        """compute(the model for `source`, *args), its arguments checked against `compute`'s by the type checker."""
        return Request(kind, source, args, compute)


def text_trace(source: str, text: str, pair: str | None = None) -> Request[tc.Trace]:
    return Request.of("text", _trace_text, source, text, pair)


def translation(source: str, sentence: str, max_new_tokens: int) -> Request[sv.Translation]:
    """A greedy translation, every step traced."""
    return Request.of("translate", _translate, source, sentence, int(max_new_tokens))


def teacher_forced(source: str, sentence: str, target: str) -> Request[sv.Translation]:
    return Request.of("teacher", _teacher, source, sentence, target)


def continuation(
    source: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None, seed: int
) -> Request[gen.Continuation]:
    """A decoder-only model continuing a text (temperature 0: greedy): each step's attention rows and top-k,
    not its trace."""
    return Request.of("generate", _generate, source, prompt, max_new_tokens, temperature, top_k, seed)


def picture(source: str, data: bytes, name: str) -> Request[vv.VisionResult]:
    return Request.of("image", _analyse_image, source, data, name)


def token_distance(source: str, text: str) -> Request[tuple[np.ndarray, float]]:
    return Request.of("token_distance", _token_distance, source, text)


# Inside a block: the residual stream, norms and sub-layer outputs (lb.block_read), no attention internals.
def block_text(source: str, text: str) -> Request[tc.Trace]:
    """An encoder's or decoder-only model's trace."""
    return Request.of("block_text", lb.trace_text, source, text)


def block_translation(source: str, sentence: str) -> Request[sv.Translation]:
    """A greedy translation, no step traces."""
    return Request.of("block_translation", lb.trace_translation, source, sentence)


def block_image(source: str, data: bytes, name: str) -> Request[vv.VisionResult]:
    return Request.of("block_image", lb.trace_image, source, data, name)


def small_trace(source: str, text: str) -> Request[tc.Trace]:
    return Request.of("small_trace", _small_trace, source, text)


def shift(source: str, data: bytes, name: str, k: int) -> Request[ib.ShiftStudy]:
    return Request.of("shift", ib.shift_study, source, data, name, int(k))


def shift_sweep(source: str, data: bytes, name: str, shifts: tuple[int, ...]) -> Request[pd.DataFrame]:
    return Request.of("shift_sweep", _shift_sweep, source, data, name, tuple(shifts))


def mae(source: str, data: bytes, name: str, seed: int) -> Request[mv.MAEResult]:
    return Request.of("mae", mv.analyse, source, data, name, int(seed))


def detr(source: str, data: bytes, name: str) -> Request[dv.DetrResult]:
    return Request.of("detr", dv.analyse, source, data, name)


def relevancy(source: str, data: bytes, name: str, class_id: int) -> Request[np.ndarray]:
    """A picture's gradient-weighted relevancy [rows, cols] for class `class_id` (Chefer et al. 2021)."""
    return Request.of("relevancy", vv.relevancy_map, source, data, name, int(class_id))


def head_ablation(source: str, study: hm.HeadStudy, stack: str, layer: int, head: int) -> Request[hm.Ablation]:
    """`study`'s input with one head ablated: the number measured, the prediction and the attention that changed."""
    return view_ablation(source, study.kind, study.inputs, study.output, stack, layer, head)


def view_ablation(
    source: str, kind: str, inputs: tuple, output: int | None, stack: str, layer: int, head: int
) -> Request[hm.Ablation]:
    """One head ablated in an input a study would read (`head_matters.study(kind, model, *inputs)`): the same
    request, and so the same cached result, as /heads's `head_ablation` of that input's study."""
    return Request.of("heads_ablation", _head_ablation, source, kind, output, stack, int(layer), int(head), *inputs)


def view_lens(source: str, kind: str, inputs: tuple, output: int) -> Request[LogitLens]:
    """The logit lens of an input a study would read, following `output` (one traced pass, cached)."""
    return Request.of("heads_lens", _head_lens, source, kind, int(output), *inputs)


def result(request: Request[ResultT], label: str | None = None) -> ResultT:
    """What `request` computes, once per request for the whole server (a pass waits for a free slot).

    label: while this page computes it, a progress bar saying so once it has taken PROGRESS_AFTER_S (a quicker
    one draws nothing), moved by what the computation reports (`reporting`: a head ablation, layer by layer)."""
    if label is None or _results.peek(_request_key(request)) is not None:
        return _cached(request)
    with progress_bar(after_s=PROGRESS_AFTER_S) as progress:
        token = _REPORT.set(lambda fraction, message: progress(fraction, f"{label} {message}".strip()))
        try:
            progress(0.0, "")  # said once the bar shows: the work may wait for a pass slot first
            return _cached(request)
        finally:
            _REPORT.reset(token)


def reporting() -> Progress | None:
    """Where a computation that `result(request, label)` runs reports (fraction, message): the page's bar; None
    when nobody shows its progress (another caller, a test)."""
    return _REPORT.get()


def _request_key(request: Request[Any]) -> tuple:
    return ("result", request.kind, request.source, *_key(request.args))


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


def in_turn(compute: Callable[[], ResultT]) -> ResultT:
    """compute() when a forward-pass slot is free: at most TFORMER_PASSES passes run at once, so a burst of
    requests queues instead of sharing the cores (and the memory of their activations) all at once."""
    with _passes:
        return compute()


def _cached(request: Request[ResultT]) -> ResultT:
    """request.compute(the model for its source, *its args), computed once per (kind, source, args)."""
    _owned(request.source)

    def compute() -> ResultT:
        model = cached_model(request.source)  # a load waits for no pass slot
        return in_turn(lambda: request.compute(model, *request.args))

    return _results.get_or_compute(_request_key(request), compute)


# ---- what a view derives from a computed result --------------------------------------------------------
Traced = tc.Trace | sv.Translation | vv.VisionResult  # a result that holds a trace


def trace_of(result: Traced) -> tc.Trace:
    """The trace inside a cached result (a translation's teacher-forced pass, a picture's trace)."""
    return result if isinstance(result, tc.Trace) else result.trace


def derived(name: str, request: Request[ResultT], view: Callable[[ResultT, *Args], ViewT], *args: *Args) -> ViewT:
    """view(what `request` computes, *args), once per (name, request, args) for the whole server. `name` names the
    view in the cache's keys, one name per view."""
    _owned(request.source)
    key = ("derived", name, _key((request.kind, request.source, *request.args)), *_key(args))
    return _results.get_or_compute(key, lambda: view(_cached(request), *args))


def _overview(result: Traced, stack: str, hide: bool) -> overview.Overview:
    return overview.overview(trace_of(result), stack, hide_special=hide)


def overview_picture(request: Request[Traced], stack: str, hide: bool) -> overview.Overview:
    """All layers x heads as one picture (tformer_views.overview) of the trace in `request`'s result."""
    return derived("overview", request, _overview, stack, hide)


def _token_distances(result: Traced, stack: str, hide: bool) -> np.ndarray:
    return distance.token_distances(trace_of(result), stack, hide)


def token_distances(request: Request[Traced], stack: str, hide: bool) -> np.ndarray:
    """Mean attention distance [layers, heads] in tokens."""
    return derived("token_distances", request, _token_distances, stack, hide)


def _uniform_token_distance(result: Traced, stack: str, hide: bool) -> float:
    return distance.uniform_token_distance(trace_of(result), stack, hide)


def uniform_token_distance(request: Request[Traced], stack: str, hide: bool) -> float:
    return derived("uniform_token_distance", request, _uniform_token_distance, stack, hide)


def _query_rows(result: Traced, stack: str, query: int) -> np.ndarray:
    return search.query_rows(trace_of(result), query, stack)


def query_rows(request: Request[Traced], stack: str, query: int) -> np.ndarray:
    """One query's weights in every layer and head: [layers, heads, keys], for the head search."""
    return derived("query_rows", request, _query_rows, stack, query)


def teacher_agreement(request: Request[sv.Translation]) -> int:
    return derived("teacher_agreement", request, sv.teacher_agreement)


def _grid_picture(result: vv.VisionResult) -> bytes:
    return pictures.to_png(pictures.grid_picture(result.image, result.patch_size))


def grid_picture(request: Request[vv.VisionResult]) -> bytes:
    """The picture cut into its patches, as PNG."""
    return derived("grid_picture", request, _grid_picture)


def _patch_sequence(result: vv.VisionResult) -> bytes:
    return pictures.to_png(pictures.patch_sequence(result.image, result.patch_size))


def patch_sequence(request: Request[vv.VisionResult]) -> bytes:
    """The patches in a row, as the model reads them, as PNG."""
    return derived("patch_sequence", request, _patch_sequence)


def _image_distances(result: vv.VisionResult) -> np.ndarray:
    return distance.image_distances(result.trace)


def image_distances(request: Request[vv.VisionResult]) -> np.ndarray:
    """Mean attention distance [layers, heads] in pixels."""
    return derived("image_distances", request, _image_distances)


def _rollout(result: vv.VisionResult, fusion: str, discard: float) -> np.ndarray:
    return vv.rollout_map(result.trace, fusion, discard)


def rollout(request: Request[vv.VisionResult], fusion: str, discard: float) -> np.ndarray:
    """Attention rollout to the class token over the patch grid [rows, cols]: the same for every layer, head and
    patch."""
    return derived("rollout", request, _rollout, fusion, float(discard))


def _stream_norms(result: Traced, stack: str) -> lb.StreamNorms:
    return lb.stream_norms(trace_of(result), stack)


def stream_norms(request: Request[Traced], stack: str) -> lb.StreamNorms:
    """The residual stream's size per layer and token."""
    return derived("stream_norms", request, _stream_norms, stack)


def from_model(name: str, source: str, view: Callable[[tc.TracedModel, *Args], ViewT], *args: *Args) -> ViewT:
    """view(the model for `source`, *args), once per (name, source, args) for the whole server."""
    _owned(source)
    return _results.get_or_compute(("model-view", name, source, *_key(args)), lambda: view(cached_model(source), *args))


def _figure_7(model: tc.TracedModel) -> tuple[bytes, list[float], bytes]:
    pcs, variance = vv.embedding_filter_pcs(model)
    return pictures.to_png(pcs), [float(v) for v in variance], pictures.to_png(vv.position_similarity_maps(model))


def figure_7(source: str) -> tuple[bytes, list[float], bytes]:
    """A ViT's patch-embedding filters' principal components (PNG), their variance shares, and its position
    embeddings' similarity maps (PNG): the ViT paper's Fig. 7, once per model."""
    return from_model("figure_7", source, _figure_7)


def sample_pictures() -> dict[str, bytes]:
    """The sample pictures (tformer_views.samples), read once per set of configured image folders."""
    dirs = tuple(str(d) for d in samples.image_dirs())
    return _results.get_or_compute(("samples", dirs), samples.samples)


def digit_pictures() -> dict[str, bytes]:
    """A test picture of each digit (tformer_views.samples.digit_samples), made once per server."""
    return _results.get_or_compute(("digit-samples",), samples.digit_samples)


# ---- long work, in its own queue, with a progress bar ------------------------------------------------
SESSION_ID = "_tformer.session_id"  # session state: this browser session's id (its long work, its training)


def session_id() -> str:
    """An id of the browser session this script runs for, the same on every run of it (made on its first)."""
    session: str = st.session_state.setdefault(SESSION_ID, uuid.uuid4().hex)
    return session


def computed(
    key: tuple,
    compute: Callable[[Progress], ResultT],
    label: str,
    cost: Callable[[], tuple[tc.Workload, str]] | None = None,
) -> ResultT:
    """compute(progress) once per `key` for the whole server, as long work (tformer_app.work: its own queue, its
    passes behind the pages' passes, stopped when nobody waits for it), with a progress bar in the page that
    waits for it (sessions asking for the same key meanwhile wait for the same job). For work too long to wait
    for without one: a study of every head, a patching grid, many pictures.

    cost() -> (the work estimated before it runs (tformer_core.workload), what would fit): asked only when the
    result is not cached (it tokenizes the input); above TFORMER_REQUEST_GFLOP the work is refused with
    tformer_core.workload.TooMuchWork (an InputError: the page says it, and what would fit).

    The bar is drawn outside any Streamlit cache: Streamlit replays elements drawn inside a cached
    function on later hits, and the bar belongs to the page that asked.
    """
    cache_key = ("computed", *_key(key))
    done = _results.get(cache_key)
    if done is not None:
        return done
    if cost is not None:
        work, fits = cost()
        tc.check_workload(work, SETTINGS.request_flops, "TFORMER_REQUEST_GFLOP", fits)
    session = session_id()
    return _waited(WORK.submit(cache_key, session, label, compute), session, label)


def head_study(source: str, model: tc.TracedModel, kind: str, inputs: tuple) -> hm.HeadStudy:
    """Every head of `model` ablated on one input (tformer_views.head_matters.study), as long work: refused before
    it runs when it would compute more than TFORMER_REQUEST_GFLOP (a 120-word text on SmolLM2: 4.9 TFLOP).

    Once per (kind, model, input) for the whole server: a class opening the lecturer's link runs one study, and
    every student after the first gets it at once, from the results' cache."""
    cost = lambda: hm.study_cost(kind, model, inputs, SETTINGS.request_flops)  # noqa: E731
    compute = lambda progress: hm.study(kind, model, *inputs, progress=progress)  # noqa: E731
    label = "Ablating every head, one batch row each…"
    return computed(_study_key(kind, source, inputs)[1:], compute, label, cost)


def _study_key(kind: str, source: str, inputs: tuple) -> tuple:
    """The results cache's key of a head study (`computed`'s)."""
    return ("computed", "heads", kind, source, *_key(inputs))


def head_patching(source: str, model: tc.TracedModel, a: str, b: str) -> ResidualPatching:
    """B's residual stream patched into A at every layer x position (tformer_views.head_matters.patching), as long
    work, refused before it runs above TFORMER_REQUEST_GFLOP (its rows grow with layers x tokens)."""
    cost = lambda: hm.patching_cost(model, a, b, SETTINGS.request_flops)  # noqa: E731
    compute = lambda progress: hm.patching(model, a, b, progress)  # noqa: E731
    return computed(("heads_patching", source, a, b), compute, "Patching every layer × position…", cost)


def induction_study(source: str, model: tc.TracedModel, length: int, seed: int) -> iv.InductionStudy:
    """`length` random tokens (seeded) twice: induction scores and each repeat's loss, as long work."""
    compute = lambda progress: iv.study(model, int(length), int(seed))  # noqa: E731
    return computed(("induction", source, int(length), int(seed)), compute, "Repeating random tokens…")


def induction_tested(source: str, model: tc.TracedModel, found: iv.InductionStudy, k: int) -> iv.InductionAblation:
    """`found`'s k heads of highest induction score ablated together, and k random heads, as long work."""
    top = tuple(found.top(int(k)))
    compute = lambda progress: iv.ablation(model, found.seq.length, found.seq.seed, top)  # noqa: E731
    key = ("induction_ablation", source, found.seq.length, found.seq.seed, top)
    return computed(key, compute, "Ablating the top heads and random ones…")


def long_result(request: Request[ResultT], label: str) -> ResultT:
    """What `request` computes, as long work (`computed`: its own queue, its passes behind the pages'), for a
    computation of many passes that a page does not show at once (a continuation: a pass per token written)."""
    _owned(request.source)
    model = cached_model(request.source)
    compute = lambda progress: request.compute(model, *request.args)  # noqa: E731
    return computed((request.kind, request.source, *request.args), compute, label)


def _waited(job: Job, session: str, label: str) -> Any:
    """job's result once it is done, the page showing its place in line and its progress meanwhile. A rerun of
    the page (a click) or its end leaves at once: the job goes on while the page asks for it again (within
    work.STALE_S), and stops at its next step otherwise."""
    slot, shown, sent = st.empty(), None, 0.0
    while not job.done.wait(POLL_S):
        WORK.watch(job, session)
        place = WORK.position(job)
        if place > 1:
            line = f"{label} Waiting: {place - 1} long computation(s) of other users before yours."
        elif place == 1:
            line = f"{label} Next in line."
        elif job.message.startswith(label.rstrip("…. ")):  # the work says what the label says, and more
            line = job.message
        else:
            line = f"{label} {job.message}".strip()
        # Sent when the bar moved, else twice a second: a rerun the student asked for meanwhile (a click) is raised
        # by Streamlit only where the script sends something, and it leaves this loop at once.
        if (job.fraction, line) != shown or time.monotonic() - sent >= 2 * POLL_S:
            shown, sent = (job.fraction, line), time.monotonic()
            slot.progress(job.fraction, text=escape(line))
    slot.empty()
    if job.state == "done":
        return job.value
    if job.state == "cancelled":
        raise Busy(f"{label.rstrip('…. ')} was stopped: the page waiting for it had moved on. Ask again.")
    if job.bug is not None:  # logged with its traceback once, by the worker; its id is what the page shows
        raise logs.ReportedBug(job.bug)
    assert job.error is not None
    raise type(job.error)(str(job.error))  # a new exception each time: a shared one would grow its traceback


# ---- for the server page and the tests --------------------------------------------------------------
@dataclass(frozen=True)
class MemoryReport:
    results: CacheStats
    models: CacheStats
    rss_bytes: int | None
    sessions_bytes: int = 0  # the sessions' uploads and media (counted in the results' budget)
    session_counts: sessions.SessionCounts | None = None  # connected, resumable, ended but still in memory
    gpu_bytes: int | None = None  # what this process's tensors hold on its GPU; None without one
    kept_bytes: int = 0  # freed memory the process could not hand back (counted in the results' budget)


def rss_bytes() -> int | None:
    """This process's resident memory (Linux), or None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def memory_report() -> MemoryReport:
    on_gpu = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else None
    return MemoryReport(
        _results.stats(),
        _models.stats(),
        rss_bytes(),
        sessions_bytes=sessions.held_bytes(),
        session_counts=sessions.counts(),
        gpu_bytes=on_gpu,
        kept_bytes=_give_back.kept,
    )


def clear_results() -> int:
    """Drop every cached result (models stay loaded), release what ended sessions still hold, and give the
    memory back; returns the bytes of results dropped."""
    freed = _results.clear()
    sessions.release_ended()
    collect_ended_sessions()  # whatever sessions ended before, the operator asked for everything back
    _give_back.level = None  # hand everything back now
    _give_back.check()
    return freed


def collect_ended_sessions() -> None:
    """Free what ended sessions leave in reference cycles, now: a full garbage collection.

    Why: an ended session's state (its widgets, their callbacks and serializers) is a web of reference cycles,
    freed only by Python's full collection. That one runs when the objects that survived earlier collections
    have grown by a quarter, and a server with its models and a class's sessions keeps about 385,000: it can
    wait for hours. Meanwhile every ended session's widget values stay, each uploaded photo's bytes with them
    (4.5 MB for a 12-megapixel JPEG), counted by no budget: 490 MB after a class of 160 photos had ended and
    been cleared, 160 MB while the class was still uploading (benchmarks/memory.py). A full collection takes
    0.2 to 0.4 s on such a server (2 CPUs), so it runs only when sessions ended, at most once a look of the
    sweeper (every 10 s)."""
    started = time.perf_counter()
    found = gc.collect()
    logs.log.info("collected %d unreachable objects in %.0f ms", found, (time.perf_counter() - started) * 1000)


def swept(ended: int, full: bool = True) -> None:
    """After each look of tformer_app.sessions' sweeper (every 10 s; `ended` the sessions that ended since the
    one before, released by the sweeper or dropped by Streamlit): free what they left in reference cycles. After
    a full sweep (every 30 s), besides: count what the process kept and could not hand back (`_GiveBack.kept`),
    start `_give_back`'s level afresh (the lowest reading from now on), so that memory the process has come to
    keep for good (a new model's tokenizer) stops causing hand-backs, fit the results beside what the sessions
    hold and what the process kept, and hand back every freed byte."""
    if ended:
        collect_ended_sessions()
    if not full:
        return
    _give_back.swept(_models.stats().used_bytes)
    _results.trim()  # what ended sessions held makes room; what live ones uploaded since takes it
    _give_back.check()


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


def start() -> None:
    """What a server process starts once (app.py calls it on every run): the sweeper of ended sessions, and the
    conversion of SmolLM2 when it is missing (`warm_up`). And on every run: results dropped until they fit beside
    what the sessions hold now (uploads and the pictures pages sent grow between computations, which are what
    trims the results otherwise)."""
    sessions.start_sweeper(after=swept)
    warm_up()
    if _results.trim():
        _give_back.check()


def run_ended() -> None:
    """After every run of a page (app.py): hand back what it freed as it drew, once beyond SLACK. Drawing frees
    as much as a pass (a photo's pictures encoded, its charts' specs), and the next check would come only with
    the next computation: 210 MB stayed after a class's 160 photos."""
    _give_back.check()


def clear_models() -> None:
    """Drop every model (tests: a fresh server) and every remembered failure."""
    _models.clear()
    with _failures_lock:
        _failures.clear()
