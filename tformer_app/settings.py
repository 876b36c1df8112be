"""The server's memory settings, as the app's caches use them (read and checked in tformer_core.settings, like
every TFORMER_* variable: a bad value is logged once and its default used).

    TFORMER_CACHE_MB    results kept for reuse (traces, translations, pictures, derived views) and what the
                        sessions hold (their uploads, the pictures they were sent): 768
    TFORMER_MODELS_MB   models kept loaded, by the bytes of their weights: 1536
    TFORMER_PASSES      forward passes run at once (others wait their turn): 1; on a GPU, counted across every
                        server process that uses that GPU (the replicas of deploy/)
    TFORMER_GPU_MB      GPU memory this process may use (its allocator is capped there; cached results keep at
                        most half of it on the GPU): unset, no cap, and cached results keep TFORMER_CACHE_MB there

The defaults fit a 4 GB server: about 0.5 GB for Python, torch and Streamlit, 1.5 GB of models (MiniLM,
DeiT-Tiny, the translator and a GPT-2 or BERT-base together), 0.75 GB of results, and the working memory of
the passes under way (WORKING_MB each; see the README's "Running for a class").
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer_core import settings

MB = 2**20
# The most one request holds while it runs, beyond the caches: a traced BERT-base at 512 tokens keeps every
# intermediate (about 230 MB) until it is compacted, a 56-megapixel PNG decodes to 225 MB (Pillow keeps RGB in
# 4 bytes a pixel) and is reduced through a 56 MB copy: 340 MB for the distance page's 20 such pictures in one
# process. In the server, the peaks of benchmarks/memory.py's steps over what the caches held were 405-657 MB
# in six runs (the picture steps highest); the part above 340 MB is not explained yet.
WORKING_MB = 672
GPU_RESULTS_SHARE = 0.5  # of TFORMER_GPU_MB, what cached results may hold on the GPU (models and passes: the rest)


@dataclass(frozen=True)
class ServerSettings:
    cache_bytes: int
    models_bytes: int
    passes: int
    gpu_bytes: int | None = None  # TFORMER_GPU_MB: this process's GPU memory, None when unset (no cap)
    studies: int = 1  # TFORMER_STUDIES: long computations run at once (tformer_app.work)
    request_flops: float = 1e12  # TFORMER_REQUEST_GFLOP in operations: the most one request may compute
    pass_bytes: int = WORKING_MB * MB  # TFORMER_PASS_MB: the working memory a loaded model's pass may take

    @property
    def results_gpu_bytes(self) -> int:
        """What cached results may hold on a GPU: GPU_RESULTS_SHARE of TFORMER_GPU_MB, else TFORMER_CACHE_MB."""
        return self.cache_bytes if self.gpu_bytes is None else int(self.gpu_bytes * GPU_RESULTS_SHARE)

    @property
    def working_bytes(self) -> int:
        """Memory the passes under way may take beyond the caches: WORKING_MB each, or TFORMER_PASS_MB where an
        operator raised it (the loaders admit models whose pass takes up to that)."""
        return self.passes * max(WORKING_MB * MB, self.pass_bytes)


def server_settings() -> ServerSettings:
    """The settings as the environment gives them now (read once by tformer_app.models when the server starts)."""
    return ServerSettings(
        cache_bytes=settings.megabytes("TFORMER_CACHE_MB"),
        models_bytes=settings.megabytes("TFORMER_MODELS_MB"),
        passes=int(settings.value("TFORMER_PASSES")),
        gpu_bytes=settings.gpu_bytes(),
        studies=int(settings.value("TFORMER_STUDIES")),
        request_flops=settings.request_flops(),
        pass_bytes=settings.megabytes("TFORMER_PASS_MB"),
    )
