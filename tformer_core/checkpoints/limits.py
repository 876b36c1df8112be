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

TFORMER_HUB_MAX_MB (default 2000): the most a model's files may take, summed, before a download from the
hub starts. Twice the float32 size of a model at the default parameter limit: a model the limit admits is
never refused for its download, and nothing is fetched for hours only to be refused afterwards.

Both accept plain or scientific notation ("400e6", "400000000", "1500"); a bad value is reported when a
model is loaded, naming the setting.
"""

from __future__ import annotations

import math
import os

from .errors import CheckpointError

DEFAULT_MAX_PARAMS = 250_000_000
DEFAULT_HUB_MAX_MB = 2000.0
BYTES_PER_PARAM = 4  # float32, how the core holds every model on the CPU


def _setting(name: str, default: float, example: str) -> float:
    text = os.environ.get(name, "").strip().replace("_", "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"the setting {name} must be a positive number such as {example}, got {text!r}")
    return value


def max_params() -> int:
    """TFORMER_MAX_PARAMS: the most parameters (weights and fixed tables) a loaded model may have."""
    return int(_setting("TFORMER_MAX_PARAMS", DEFAULT_MAX_PARAMS, "250e6"))


def hub_max_bytes() -> int:
    """TFORMER_HUB_MAX_MB, in bytes: the most a model's files may take, summed, before a hub download starts."""
    return int(_setting("TFORMER_HUB_MAX_MB", DEFAULT_HUB_MAX_MB, "2000") * 1e6)


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
