"""The results cache: what a model computes for an input (a trace, a translation, a continuation, a picture's
trace), once per typed request for the whole server.

A page builds a `Request` with the functions here (`text_trace(...)`, `picture(...)`, ...) and reads it with
`result`: the request carries its computation, so the type checker knows what each gives. Results are stored
compactly (`Trace.compact`: attention weights recomputed from Q and K when read; only what the views read), so
changing only the view (layer, head, token, step, colours) reads the cached result and runs no model. What a view
derives from a result is in tformer_app.derived_views, long work of many passes in tformer_app.long_work; both keep
what they compute in this cache.

Results, derived views and long work share one budget, TFORMER_CACHE_MB, with least-recently-used eviction
(tformer_app.budget), beside what the sessions hold and the freed memory the process could not hand back
(tformer_app.memory); what they hold on a GPU (traces stay on their model's device) is bounded apart
(TFORMER_GPU_MB, tformer_app.settings). Forward passes run at most TFORMER_PASSES at a time, counted per GPU across
the server's processes when the models run on one (tformer_app.gpu). Every cached value is shared by all sessions
and read-only: pages must not modify them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, TypeVarTuple

import numpy as np
import pandas as pd
import torch

import tformer_core as tc
from tformer_core.capture import matching
from tformer_core.interventions import Head
from tformer_core.lens import LogitLens
from tformer_core.score_sources import Cell, Removal, ScoreSources
from tformer_core.trace import lean
from tformer_views import detection as dv
from tformer_views import distance
from tformer_views import generation as gen
from tformer_views import head_matters as hm
from tformer_views import inductive_bias as ib
from tformer_views import mae as mv
from tformer_views import seq2seq as sv
from tformer_views import vision as vv
from tformer_views import why_sources as ws
from tformer_views.lessons import block as lb
from tformer_views.lessons import why_here as wh

from . import gpu, memory, models, session_models, sessions
from .budget import ByteBudgetCache
from .models import DEVICE, SETTINGS, Progress, progress_bar
from .slots import PassGate

ResultT = TypeVar("ResultT")
ResultT_co = TypeVar("ResultT_co", covariant=True)
Args = TypeVarTuple("Args")
PROGRESS_AFTER_S = 0.5  # `result`'s bar: drawn once a computation has taken this long
_REPORT: ContextVar[Progress | None] = ContextVar("tformer_report", default=None)  # `reporting`


# ---- what a model computes for an input ----------------------------------------------------------
# The FFN's output stays: "Why this weight" splits a score into the parts that wrote the stream, each FFN's among
# them (tformer_core.score_sources), from the cached trace and without a pass of its own. It costs one [tokens,
# d_model] per layer, about a tenth of what a cached trace holds.
_UNREAD = (".mlp.hidden", ".attn.out", ".resid_after_attn", ".resid_after_cross", ".resid_post")


def views_read(name: str) -> bool:
    """What the attention, vision and lesson views read from a trace: no [heads, n, n] parts (recomputed
    from Q and K when read), of the FFN only its output, no residual stream after the attention."""
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
    study = RESULTS.peek(study_key(kind, model.source, inputs))
    clean = study.trace if isinstance(study, hm.HeadStudy) and study.output == output else None
    return hm.ablation(model, kind, inputs, output, Head(stack, layer, head), clean=clean, progress=reporting())


def _head_lens(model: tc.TracedModel, kind: str, output: int, *inputs: Any) -> LogitLens:
    return hm.lens_of(kind, model, inputs, output)


# The sessions' uploads and the pictures they were sent share this budget: while a class holds many photos,
# fewer results are kept (tformer_app.sessions); so does the freed memory the process cannot hand back
# (memory.GiveBack.kept). Results on a GPU are bounded apart, in its bytes.
RESULTS = ByteBudgetCache(
    "results",
    SETTINGS.cache_bytes,
    on_evict=memory.GIVE_BACK.check,
    device_budget_bytes=SETTINGS.results_gpu_bytes,
    shared=lambda: sessions.held_bytes() + memory.GIVE_BACK.kept,
    after_compute=memory.GIVE_BACK.check,  # a pass's activations are free then, and its result is counted as held
)
memory.GIVE_BACK.add_holder(lambda: RESULTS.stats().used_bytes)
memory.GIVE_BACK.add_holder(sessions.held_bytes)
# Per GPU across processes when the models run on one; the pages' passes go before long work's (slots.PassGate).
PASSES = PassGate(gpu.pass_slots(SETTINGS.passes, DEVICE))


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


def score_sources(source: str, inputs: tuple, options: tuple, cell: Cell) -> Request[ScoreSources]:
    """One attention cell's softmax input split into its sources (a pass keeping what the split reads).
    inputs: what model.trace takes; options: its keywords as (name, value) pairs."""
    return Request.of("score_sources", ws.cell_sources, source, inputs, options, cell)


def source_removal(source: str, inputs: tuple, options: tuple, cell: Cell, name: str) -> Request[Removal]:
    """Source `name` of `cell` removed from a real pass, beside the linear prediction."""
    return Request.of("source_removal", ws.cell_removal, source, inputs, options, cell, name)


def why_here(source: str) -> Request[wh.WhyHere]:
    """The "Why here?" lesson on the lecture's sentence (two passes: the split's and one source removed)."""
    return Request.of("why_here", wh.why_here, source)


def result(request: Request[ResultT], label: str | None = None) -> ResultT:
    """What `request` computes, once per request for the whole server (a pass waits for a free slot).

    label: while this page computes it, a progress bar saying so once it has taken PROGRESS_AFTER_S (a quicker
    one draws nothing), moved by what the computation reports (`reporting`: a head ablation, layer by layer)."""
    if label is None or RESULTS.peek(_request_key(request)) is not None:
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
    return ("result", request.kind, request.source, *key_of(request.args))


def key_of(args: tuple) -> tuple:
    """A cache key for `args`: file contents (bytes) and tensors (a picture's pixels, in the inputs of a model's
    trace) by their digest, so keys stay small, cheap to hash and equal for equal contents (a tensor hashes by
    its identity), also inside a plain tuple of arguments."""
    return tuple(_key_part(a) for a in args)


def _key_part(a: Any) -> Any:
    if isinstance(a, bytes):
        return ("blake2b", len(a), hashlib.blake2b(a, digest_size=16).hexdigest())
    if isinstance(a, torch.Tensor):
        data = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()  # any dtype, bit for bit
        return ("tensor", str(a.dtype), tuple(a.shape), hashlib.blake2b(data, digest_size=16).hexdigest())
    if type(a) is tuple:  # not a named tuple: its type is part of what it means
        return key_of(a)
    return a


def check_owned(source: object) -> None:
    """A trained model's results are this session's only: CheckpointError before any cache is read when
    `source` names another session's model (its results may be cached under that name)."""
    if isinstance(source, str) and session_models.is_session_name(source):
        session_models.get(source)


def in_turn(compute: Callable[[], ResultT]) -> ResultT:
    """compute() when a forward-pass slot is free: at most TFORMER_PASSES passes run at once, so a burst of
    requests queues instead of sharing the cores (and the memory of their activations) all at once."""
    with PASSES:
        return compute()


def _cached(request: Request[ResultT]) -> ResultT:
    """request.compute(the model for its source, *its args), computed once per (kind, source, args)."""
    check_owned(request.source)

    def compute() -> ResultT:
        model = models.cached_model(request.source)  # a load waits for no pass slot
        return in_turn(lambda: request.compute(model, *request.args))

    return RESULTS.get_or_compute(_request_key(request), compute)


def study_key(kind: str, source: str, inputs: tuple) -> tuple:
    """The results cache's key of a head study (tformer_app.long_work's `computed`)."""
    return ("computed", "heads", kind, source, *key_of(inputs))
