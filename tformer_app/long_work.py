"""Long work, as the pages ask for it: a computation too long to wait for without a progress bar (a study of every
head, a patching grid, many pictures, a continuation of a pass per token), computed once per key for the whole
server in its own queue (tformer_app.work: its passes behind the pages' passes, stopped when nobody waits for it),
kept in the results' budget (tformer_app.results), with its place in line and its progress shown in the page that
waits for it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

import tformer_core as tc
from tformer_core.patching import ResidualPatching
from tformer_views import head_matters as hm
from tformer_views import induction as iv

from . import logs, models
from .markdown import escape
from .models import SETTINGS, Progress
from .results import PASSES, RESULTS, Request, check_owned, key_of, study_key
from .work import POLL_S, Busy, Job, WorkQueue

ResultT = TypeVar("ResultT")

SESSION_ID = "_tformer.session_id"  # session state: this browser session's id (its long work, its training)


WORK = WorkQueue(
    PASSES,
    workers=SETTINGS.studies,
    on_done=lambda key, value: RESULTS.put(key, value),
    on_bug=lambda what, error: logs.bug(what, error),
)


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
    cache_key = ("computed", *key_of(key))
    done = RESULTS.get(cache_key)
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
    return computed(study_key(kind, source, inputs)[1:], compute, label, cost)


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
    check_owned(request.source)
    model = models.cached_model(request.source)
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
