"""The app's own TFORMER_* settings, declared here into the core's one registry (tformer_core.settings reads and
checks them like the core's: a bad value is logged once and its default used; a TFORMER_ name nobody declared is
reported), and the server's memory settings as the app's caches use them. The app reads every setting through
this module (`settings.value(name)`, re-exported), so that importing it is what declares the app's.

    TFORMER_CACHE_MB    results kept for reuse (traces, translations, pictures, derived views) and what the
                        sessions hold (their uploads, the pictures they were sent): 768
    TFORMER_MODELS_MB   models kept loaded, by the bytes of their weights: 1536
    TFORMER_PASSES      forward passes run at once (others wait their turn): 1; on a GPU, counted across every
                        server process that uses that GPU (the replicas of deploy/)
    TFORMER_GPU_MB      GPU memory this process may use (its allocator is capped there; cached results keep at
                        most half of it on the GPU): unset, no cap, and cached results keep TFORMER_CACHE_MB there

The defaults fit a 4 GB server: about 0.5 GB for Python, torch and Streamlit, 1.5 GB of models (MiniLM,
DeiT-Tiny, the translator and a GPT-2 or BERT-base together), 0.75 GB of results, and the working memory of
the passes under way (WORKING_MB each; see docs/in-class.md, "Running for a class"). TFORMER_PASS_MB, what one
pass may take, is the core's (its loaders refuse a model whose pass would take more).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tformer_core.settings import (
    Setting,
    cache_dir,
    check_environment,
    declare,
    device,
    folder,
    megabytes,
    positive,
    value,
    whole,
)

__all__ = [
    "GPU_RESULTS_SHARE",
    "MB",
    "MIN_TOKEN_CHARS",
    "WORKING_MB",
    "ServerSettings",
    "cache_dir",
    "check_environment",
    "device",
    "gpu_bytes",
    "megabytes",
    "request_flops",
    "server_settings",
    "value",
]

MIN_TOKEN_CHARS = 16  # an admin token shorter than this is refused (it could be guessed)


# ---- parsers of the app's settings: text -> value, ValueError with the reason ------------------------------
def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError("use 1 or 0")
    return lowered in ("1", "true", "yes", "on")


def _token(text: str) -> str:
    if len(text) < MIN_TOKEN_CHARS:
        raise ValueError(f"shorter than {MIN_TOKEN_CHARS} characters: easy to guess")
    return text


def _log_level(text: str) -> int:
    level = logging.getLevelName(text.upper())
    if not isinstance(level, int):
        raise ValueError("use DEBUG, INFO, WARNING or ERROR")
    return level


def _redis_url(text: str) -> str:
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("not a redis://, rediss:// or unix:// address")
    return text


def _hours(text: str) -> float:
    hours = float(text)
    if not 0 < hours <= 7 * 24:
        raise ValueError("a number of hours in (0, 168]")
    return hours


def _days(text: str) -> float:
    days = positive(text)
    if days > 3650:
        raise ValueError("a number of days in (0, 3650]")
    return days


# ---- the app's settings: the server's memory and work, class sessions, decks, the admin page, the log ------
declare(
    Setting("TFORMER_CACHE_MB", 768.0, positive, "MB of results kept for reuse, and what sessions hold"),
    Setting("TFORMER_MODELS_MB", 1536.0, positive, "MB of model weights kept loaded"),
    Setting("TFORMER_PASSES", 1, whole, "forward passes run at once (on a GPU: counted for all its processes)"),
    Setting(
        "TFORMER_GPU_MB",
        None,
        positive,
        "MB of GPU memory one server process may use (deploy/: 90 % of the GPU / replicas)",
        default_text="no cap",
    ),
    Setting(
        "TFORMER_REQUEST_GFLOP",
        1000.0,
        positive,
        "GFLOP one request may compute (a study, a patching grid), estimated before it runs",
    ),
    Setting("TFORMER_STUDIES", 1, whole, "long computations (studies, grids, many pictures) run at once"),
    Setting("TFORMER_ADMIN", False, _flag, "1: serve the Memory and caches page (with TFORMER_ADMIN_TOKEN)"),
    Setting(
        "TFORMER_ADMIN_TOKEN",
        None,
        _token,
        "the secret the Memory and caches page asks for",
        secret=True,
        default_text="none (the page is not served)",
    ),
    Setting(
        "TFORMER_LOG_LEVEL",
        logging.INFO,
        _log_level,
        "the server log's level (DEBUG adds tracebacks)",
        default_text="INFO",
    ),
    Setting(
        "TFORMER_REDIS_URL",
        None,
        _redis_url,
        "the Redis that class sessions live in, shared by replicas",
        secret=True,  # an address may carry a password
        default_text="none (class sessions in this process)",
    ),
    Setting("TFORMER_CLASS_HOURS", 6.0, _hours, "a class session ends this long after the lecturer's last change"),
    Setting(
        "TFORMER_DECK_DIR",
        None,
        folder,
        "the folder lecturers' decks are saved in (files; it wins over TFORMER_REDIS_URL)",
        default_text="Redis when TFORMER_REDIS_URL is set, else TFORMER_CACHE_DIR/decks",
    ),
    Setting("TFORMER_DECK_DAYS", 30.0, _days, "a saved deck is deleted this many days after its last change"),
    Setting("TFORMER_DECKS", 2000, whole, "the most decks the server keeps (a new one past them is refused)"),
    Setting(
        "TFORMER_CLASS_PER_ADDRESS",
        150,
        whole,
        "new students one client address may add to a class a minute (and answers it may send in 10 s)",
    ),
    # Read by deploy/run.sh (a shell script), declared here so that setting it is not reported as a typo.
    Setting(
        "TFORMER_PYTHON", None, str, "the Python deploy/run.sh runs the replicas with", default_text=".venv/bin/python"
    ),
)


def gpu_bytes() -> int | None:
    """TFORMER_GPU_MB in bytes: the GPU memory this process may use; None when unset (no cap)."""
    mb = value("TFORMER_GPU_MB")
    return None if mb is None else int(mb * 2**20)


def request_flops() -> float:
    """TFORMER_REQUEST_GFLOP in floating-point operations: what one request may compute (checked with
    tformer_core.workload before it runs)."""
    return float(value("TFORMER_REQUEST_GFLOP")) * 1e9


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
        cache_bytes=megabytes("TFORMER_CACHE_MB"),
        models_bytes=megabytes("TFORMER_MODELS_MB"),
        passes=int(value("TFORMER_PASSES")),
        gpu_bytes=gpu_bytes(),
        studies=int(value("TFORMER_STUDIES")),
        request_flops=request_flops(),
        pass_bytes=megabytes("TFORMER_PASS_MB"),
    )
