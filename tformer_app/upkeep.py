"""What the server process does besides answering pages: what it starts once (the sweeper of ended sessions, the
conversion of SmolLM2), the memory handed back after each page's run and each sweep, and the Server page's report
and its clearing of the results (tformer_app.models, tformer_app.results, tformer_app.memory, tformer_app.sessions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import memory, models, sessions
from .budget import CacheStats
from .models import DEVICE, MODELS
from .results import RESULTS


@dataclass(frozen=True)
class MemoryReport:
    results: CacheStats
    models: CacheStats
    rss_bytes: int | None
    sessions_bytes: int = 0  # the sessions' uploads and media (counted in the results' budget)
    session_counts: sessions.SessionCounts | None = None  # connected, resumable, ended but still in memory
    gpu_bytes: int | None = None  # what this process's tensors hold on its GPU; None without one
    kept_bytes: int = 0  # freed memory the process could not hand back (counted in the results' budget)


def memory_report() -> MemoryReport:
    on_gpu = torch.cuda.memory_allocated(DEVICE) if DEVICE.type == "cuda" else None
    return MemoryReport(
        RESULTS.stats(),
        MODELS.stats(),
        memory.rss_bytes(),
        sessions_bytes=sessions.held_bytes(),
        session_counts=sessions.counts(),
        gpu_bytes=on_gpu,
        kept_bytes=memory.GIVE_BACK.kept,
    )


def clear_results() -> int:
    """Drop every cached result (models stay loaded), release what ended sessions still hold, and give the
    memory back; returns the bytes of results dropped."""
    freed = RESULTS.clear()
    sessions.release_ended()
    memory.collect_ended_sessions()  # whatever sessions ended before, the operator asked for everything back
    memory.GIVE_BACK.level = None  # hand everything back now
    memory.GIVE_BACK.check()
    return freed


def swept(ended: int, full: bool = True) -> None:
    """After each look of tformer_app.sessions' sweeper (every 10 s; `ended` the sessions that ended since the
    one before, released by the sweeper or dropped by Streamlit): free what they left in reference cycles. After
    a full sweep (every 30 s), besides: count what the process kept and could not hand back (`_GiveBack.kept`),
    start `memory.GIVE_BACK`'s level afresh (the lowest reading from now on), so that memory the process has come to
    keep for good (a new model's tokenizer) stops causing hand-backs, fit the results beside what the sessions
    hold and what the process kept, and hand back every freed byte."""
    if ended:
        memory.collect_ended_sessions()
    if not full:
        return
    memory.GIVE_BACK.swept(MODELS.stats().used_bytes)
    RESULTS.trim()  # what ended sessions held makes room; what live ones uploaded since takes it
    memory.GIVE_BACK.check()


def start() -> None:
    """What a server process starts once (app.py calls it on every run): the sweeper of ended sessions, and the
    conversion of SmolLM2 when it is missing (`warm_up`). And on every run: results dropped until they fit beside
    what the sessions hold now (uploads and the pictures pages sent grow between computations, which are what
    trims the results otherwise)."""
    sessions.start_sweeper(after=swept)
    models.warm_up()
    if RESULTS.trim():
        memory.GIVE_BACK.check()


def run_ended() -> None:
    """After every run of a page (app.py): hand back what it freed as it drew, once beyond SLACK. Drawing frees
    as much as a pass (a photo's pictures encoded, its charts' specs), and the next check would come only with
    the next computation: 210 MB stayed after a class's 160 photos."""
    memory.GIVE_BACK.check()
