"""The server's settings, from environment variables, each checked: a bad value is reported once in the
server's log and its default is used (a typo must not take a class's server down).

    TFORMER_CACHE_MB    results kept for reuse (traces, translations, pictures, derived views): 768
    TFORMER_MODELS_MB   models kept loaded, by the bytes of their weights: 1536
    TFORMER_PASSES      forward passes run at once (others wait their turn): 1; on a GPU, counted across every
                        server process that uses that GPU (the replicas of deploy/)
    TFORMER_GPU_MB      GPU memory this process may use (its allocator is capped there; cached results keep at
                        most half of it on the GPU): unset, no cap, and cached results keep TFORMER_CACHE_MB there

The defaults fit a 4 GB server: about 0.8 GB for Python, torch and Streamlit, 1.5 GB of models (MiniLM,
DeiT-Tiny, the translator and a GPT-2 or BERT-base together), 0.75 GB of results, and room for the
passes under way and Streamlit's own per-session memory (see the README's "Running for a class").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("tformer")

MB = 2**20


def _positive(name: str, default: float, cast: Callable[[str], float] = float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        value = -1
    if not value > 0:
        log.warning("%s=%r is not a positive number; using %s", name, raw, default)
        return default
    return value


GPU_RESULTS_SHARE = 0.5  # of TFORMER_GPU_MB, what cached results may hold on the GPU (models and passes: the rest)


@dataclass(frozen=True)
class ServerSettings:
    cache_bytes: int
    models_bytes: int
    passes: int
    gpu_bytes: int | None = None  # TFORMER_GPU_MB: this process's GPU memory, None when unset (no cap)

    @property
    def results_gpu_bytes(self) -> int:
        """What cached results may hold on a GPU: GPU_RESULTS_SHARE of TFORMER_GPU_MB, else TFORMER_CACHE_MB."""
        return self.cache_bytes if self.gpu_bytes is None else int(self.gpu_bytes * GPU_RESULTS_SHARE)


def server_settings() -> ServerSettings:
    """The settings as the environment gives them now (read once by `caches` when the server starts)."""
    gpu_mb = _positive("TFORMER_GPU_MB", 0.0)  # 0: unset
    return ServerSettings(
        cache_bytes=int(_positive("TFORMER_CACHE_MB", 768) * MB),
        models_bytes=int(_positive("TFORMER_MODELS_MB", 1536) * MB),
        passes=int(_positive("TFORMER_PASSES", 1, int)),
        gpu_bytes=int(gpu_mb * MB) if gpu_mb else None,
    )
