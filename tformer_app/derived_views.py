"""What a view derives once from a cached result (the overview picture, the distance grid, a picture's patch grid)
or from a model alone (a ViT's filters), and the sample pictures: computed once for the whole server and kept in
the results' budget (tformer_app.results), each read through a typed function of the request it derives from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple

import numpy as np

import tformer_core as tc
from tformer_core.score_sources import Cell, ScoreSources
from tformer_core.score_sources import score_sources as split_score
from tformer_views import distance, overview, pictures, samples, search
from tformer_views import seq2seq as sv
from tformer_views import sinks as sinks_view
from tformer_views import vision as vv
from tformer_views.lessons import block as lb

from . import models, results
from .results import RESULTS, Request, check_owned, key_of

ResultT = TypeVar("ResultT")
ViewT = TypeVar("ViewT")
Args = TypeVarTuple("Args")
Traced = tc.Trace | sv.Translation | vv.VisionResult  # a result that holds a trace


def trace_of(result: Traced) -> tc.Trace:
    """The trace inside a cached result (a translation's teacher-forced pass, a picture's trace)."""
    return result if isinstance(result, tc.Trace) else result.trace


def derived(name: str, request: Request[ResultT], view: Callable[[ResultT, *Args], ViewT], *args: *Args) -> ViewT:
    """view(what `request` computes, *args), once per (name, request, args) for the whole server. `name` names the
    view in the cache's keys, one name per view."""
    check_owned(request.source)
    key = ("derived", name, key_of((request.kind, request.source, *request.args)), *key_of(args))
    return RESULTS.get_or_compute(key, lambda: view(results.result(request), *args))


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


def _score_sources(result: Traced, source: str, cell: Cell) -> ScoreSources:
    return split_score(models.cached_model(source), trace_of(result), cell)


def score_sources(request: Request[Traced], cell: Cell) -> ScoreSources:
    """One cell's softmax input split into its sources, from the cached trace (it keeps what the split reads:
    tformer_app.results.views_read): no pass. ValueError when that trace lacks a part (see results.score_sources,
    which runs a pass keeping them)."""
    return derived("score_sources", request, _score_sources, request.source, cell)


def _sinks(result: Traced) -> sinks_view.SinksView:
    return sinks_view.sinks_of(trace_of(result))


def sinks(request: Request[Traced]) -> sinks_view.SinksView:
    """The attention sinks and massive activations of the cached trace (a few small arrays): computed once, not
    on every rerun of a page whose sinks expander is open."""
    return derived("sinks", request, _sinks)


def from_model(name: str, source: str, view: Callable[[tc.TracedModel, *Args], ViewT], *args: *Args) -> ViewT:
    """view(the model for `source`, *args), once per (name, source, args) for the whole server."""
    check_owned(source)
    return RESULTS.get_or_compute(
        ("model-view", name, source, *key_of(args)), lambda: view(models.cached_model(source), *args)
    )


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
    return RESULTS.get_or_compute(("samples", dirs), samples.samples)


def digit_pictures() -> dict[str, bytes]:
    """A test picture of each digit (tformer_views.samples.digit_samples), made once per server."""
    return RESULTS.get_or_compute(("digit-samples",), samples.digit_samples)
