"""How large a model this server agrees to load, and to download: settings read from the environment.

TFORMER_MAX_PARAMS (default 250e6): the most parameters a model may have. The course server has 4 GB
of memory. A float32 parameter takes 4 bytes, so a model at the limit holds 1 GB while it is cached;
checkpoint files are memory-mapped while they are copied in (their pages are the file's cache, given
back under pressure), so loading does not need a second gigabyte. The server process itself (Python,
PyTorch, transformers, Streamlit and the bundled models: 0.4 GB measured, more with the pages' caches)
takes up to about 1 GB, and a class may keep a second model of that size loaded: 250 million leaves
room for both. It admits every model the pages are made
for (BERT-base 110 M, GPT-2 124 M, BART-base 140 M, T5-base 223 M, flan-T5-base 248 M, ViT-base 86 M,
opus-mt about 75 M) and refuses the "large" sizes (BERT-large 335 M, GPT-2 medium 355 M, BART-large 406 M).

TFORMER_PASS_MB (default 672): the most working memory one forward pass may take, beyond the weights. The
parameter limit bounds what a model holds; a pass over a large input holds more (a ViT whose config asks for
1536-pixel pictures: 9,217 tokens, a 340 MB attention matrix per head and layer). 672 MB is what the server's
memory budget reserves per pass (tformer_app.settings.WORKING_MB, docs/settings.md's TFORMER_PASSES). It admits
the pages' models at their own inputs: a default trace of BERT-base at 512 tokens took 512 MB, GPT-2 575 MB,
ViT-B/16 at 384 pixels 517 MB, DETR-R50 at 832 x 1386 pixels 463 MB (benchmarks/memory.py --largest-configs).
`check_pass` answers for a pass estimated from the config (`passes.check`) before any weight is read.

TFORMER_HUB_MAX_MB (default 2000): the most a model's files may take, summed, before a download from the
hub starts. Twice the float32 size of a model at the default parameter limit: a model the limit admits is
never refused for its download, and nothing is fetched for hours only to be refused afterwards.

TFORMER_HUB_DISK_MB (default 10000): the most all downloaded hub models may take on disk together; the least
recently used are removed first to make room (`sources.make_room`), so a class typing model ids cannot fill
the server's disk.

All accept plain or scientific notation ("400e6", "400000000", "1500"); they are read and checked in
tformer_core.settings (a bad value is logged once and the default used).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import pass_memory, settings
from .errors import CheckpointError

log = logging.getLogger("tformer_core")

BYTES_PER_PARAM = 4  # float32, how the core holds every model on the CPU
MIN_PASS_TOKENS = 64  # a text model that cannot read this many tokens in one pass is of no use on the pages


def max_params() -> int:
    """TFORMER_MAX_PARAMS: the most parameters (weights and fixed tables) a loaded model may have."""
    return int(settings.value("TFORMER_MAX_PARAMS"))


def pass_bytes() -> int:
    """TFORMER_PASS_MB, in bytes: the most working memory one forward pass of a loaded model may take."""
    return settings.megabytes("TFORMER_PASS_MB")


def hub_max_bytes() -> int:
    """TFORMER_HUB_MAX_MB, in bytes: the most a model's files may take, summed, before a hub download starts."""
    return settings.megabytes("TFORMER_HUB_MAX_MB")


def hub_disk_bytes() -> int:
    """TFORMER_HUB_DISK_MB, in bytes: the most all downloaded hub models may take together on disk."""
    return settings.megabytes("TFORMER_HUB_DISK_MB")


def count(n: float) -> str:
    """A parameter count for people: 124.4 million, 1.5 billion, 52,000."""
    if n >= 1e9:
        return f"{n / 1e9:,.1f}".removesuffix(".0") + " billion"
    if n >= 1e6:
        return f"{n / 1e6:,.1f}".removesuffix(".0") + " million"
    return f"{int(n):,}"


def megabytes(n_bytes: float) -> str:
    """A size for people: 40 kB, 2,500 MB, 28.0 GB."""
    if n_bytes >= 1e10:
        return f"{n_bytes / 1e9:,.1f} GB"
    return f"{n_bytes / 1e6:,.0f} MB" if n_bytes >= 1e6 else f"{n_bytes / 1e3:,.0f} kB"


def check_params(n: int, what: str = "this model") -> None:
    """CheckpointError when `n` parameters are more than TFORMER_MAX_PARAMS allows."""
    limit = max_params()
    if n > limit:
        raise CheckpointError(
            f"{what} has {count(n)} parameters ({megabytes(n * BYTES_PER_PARAM)} as float32), more than this "
            f"server loads: the limit is {count(limit)} (the setting TFORMER_MAX_PARAMS)"
        )


def check_pass(config: Any, preprocessing: Any, name: str) -> int | None:
    """The most tokens one pass of a text model with the core config `config` reads on this server (None for a
    picture model, whose `preprocessing` sets its input), after the estimate of its pass (tformer_core.pass_memory)
    against TFORMER_PASS_MB; CheckpointError naming the setting when a picture model's pass, or a text model's
    over MIN_PASS_TOKENS tokens, would take more."""
    budget = pass_bytes()
    if pass_memory.reads_text(config):
        tokens = pass_memory.tokens_within(config, budget)
        most = pass_memory.text_tokens(getattr(config, "max_positions", None))
        if tokens >= min(MIN_PASS_TOKENS, most):
            if tokens < most:
                log.info("%s reads at most %d tokens in one pass (TFORMER_PASS_MB)", name, tokens)
            return tokens
        cost = pass_memory.pass_cost(config, tokens=min(MIN_PASS_TOKENS, most))
        raise CheckpointError(_too_big(name, cost, budget, "as few as "))
    cost = pass_memory.pass_cost(config, preprocessing)
    if cost.total > budget:
        raise CheckpointError(_too_big(name, cost, budget))
    return None


def _too_big(name: str, cost: pass_memory.PassCost, budget: int, few: str = "") -> str:
    return (
        f"{name}: one pass over {few}{cost.input} would take about {_mb(cost.total)} of working memory (one "
        f"layer's attention alone {_mb(cost.attention)}), more than this server gives a pass: the limit is "
        f"{_mb(budget)} (the setting TFORMER_PASS_MB)"
    )


def _mb(n_bytes: int) -> str:
    """Memory in MB of 2**20 bytes, as TFORMER_PASS_MB counts it (GB of 2**30 from 10 GB)."""
    if n_bytes >= 10 * 2**30:
        return f"{n_bytes / 2**30:,.0f} GB"
    return f"{n_bytes / 2**20:,.0f} MB" if n_bytes >= 2**20 else f"{n_bytes / 2**20:.1f} MB"
