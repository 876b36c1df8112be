"""Every TFORMER_* setting, read from the environment and checked in this one module.

A bad value is written to the server's log once (logger "tformer_core": the setting, the value, why it was
refused, the default used instead) and its default is used: a typo must not take a class's server down. A
name that starts with TFORMER_ and is not a setting is reported too (`check_environment`, when the app starts).

The settings are read when asked for, so a notebook or a test that changes the environment sees the change:

    settings.device()          # TFORMER_DEVICE: torch.device, CUDA when there is one
    settings.value("TFORMER_CACHE_MB")
    settings.SETTINGS          # name -> Setting (default, meaning): the README's table

The core uses some of them (devices, model folders, limits, caches on disk); the app reads its own (memory
budgets, the admin page) here too, so that every one is validated the same way and in one place.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "MIN_TOKEN_CHARS",
    "REPO_ROOT",
    "SETTINGS",
    "Setting",
    "cache_dir",
    "check_environment",
    "device",
    "gpu_bytes",
    "image_dirs",
    "megabytes",
    "model_dirs",
    "request_flops",
    "value",
]

log = logging.getLogger("tformer_core")

REPO_ROOT = Path(__file__).resolve().parents[1]
MIN_TOKEN_CHARS = 16  # an admin token shorter than this is refused (it could be guessed)


# ---- parsers: text -> value, ValueError with the reason ------------------------------------------------
def _positive(text: str) -> float:
    """A positive finite number, plain or scientific ("400e6", "1_500")."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("not a positive number")
    return value


def _whole(text: str) -> int:
    value = _positive(text)
    if not value.is_integer():
        raise ValueError("not a whole number")
    return int(value)


def _folders(text: str) -> tuple[Path, ...]:
    """os.pathsep-separated folders, absolute and normalised by the string alone (links are followed where a
    path is checked against them)."""
    parts = [p.strip() for p in text.split(os.pathsep) if p.strip()]
    if not parts:
        raise ValueError("no folder given")
    if any("\0" in p for p in parts):
        raise ValueError("a folder's name holds a NUL character")
    return tuple(dict.fromkeys(Path(os.path.normpath(os.path.abspath(os.path.expanduser(p)))) for p in parts))


def _folder(text: str) -> Path:
    if os.pathsep in text:
        raise ValueError("one folder, not a list")
    return _folders(text)[0]


_DEVICE = re.compile(r"^(cpu|cuda|mps)(:(\d{1,2}))?$")


def _device(text: str) -> torch.device:
    """cpu, cuda, cuda:N or mps, and only where this torch and this machine have it."""
    match = _DEVICE.match(text.lower())
    if not match:
        raise ValueError("use cpu, cuda, cuda:N or mps")
    kind, index = match.group(1), match.group(3)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("this torch has no CUDA or this machine has no GPU")
        if index is not None and int(index) >= torch.cuda.device_count():
            raise ValueError(f"this machine has {torch.cuda.device_count()} GPU(s)")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("this machine has no Apple GPU (MPS)")
    if kind == "cpu" and index is not None:
        raise ValueError("the CPU has no index")
    return torch.device(text.lower())


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
    days = _positive(text)
    if days > 3650:
        raise ValueError("a number of days in (0, 3650]")
    return days


# ---- the settings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One environment variable: its default (None: unset means "none" or "automatic"), how its text is read,
    and what it means (one line, as the README's table says it)."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    meaning: str
    secret: bool = False  # its value is never written to the log
    default_text: str = ""  # the default in words, when it is not a value ("a GPU if there is one")


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("TFORMER_MODEL_DIRS", (REPO_ROOT / "models",), _folders, "folders local models are read from"),
        Setting("TFORMER_IMAGE_DIRS", (), _folders, "folders whose pictures are offered as samples"),
        Setting(
            "TFORMER_DEVICE",
            None,
            _device,
            "where models run: cpu, cuda, cuda:N or mps",
            default_text="a GPU if there is one, else the CPU",
        ),
        Setting("TFORMER_CACHE_MB", 768.0, _positive, "MB of results kept for reuse, and what sessions hold"),
        Setting("TFORMER_MODELS_MB", 1536.0, _positive, "MB of model weights kept loaded"),
        Setting("TFORMER_PASSES", 1, _whole, "forward passes run at once (on a GPU: counted for all its processes)"),
        Setting(
            "TFORMER_GPU_MB",
            None,
            _positive,
            "MB of GPU memory one server process may use (deploy/: 90 % of the GPU / replicas)",
            default_text="no cap",
        ),
        Setting("TFORMER_MAX_PARAMS", 250e6, _positive, "the most parameters a model may have"),
        Setting("TFORMER_PASS_MB", 672.0, _positive, "MB of working memory one forward pass of a model may take"),
        Setting(
            "TFORMER_REQUEST_GFLOP",
            1000.0,
            _positive,
            "GFLOP one request may compute (a study, a patching grid), estimated before it runs",
        ),
        Setting("TFORMER_STUDIES", 1, _whole, "long computations (studies, grids, many pictures) run at once"),
        Setting("TFORMER_HUB_MAX_MB", 2000.0, _positive, "MB a hub model's files may take"),
        Setting("TFORMER_HUB_DISK_MB", 10000.0, _positive, "MB all downloaded hub models may take on disk"),
        Setting("TFORMER_CACHE_DIR", Path.home() / ".cache" / "tformer", _folder, "where smollm2 is converted to"),
        Setting("TFORMER_ADMIN", False, _flag, "1: serve the Memory and caches page (with TFORMER_ADMIN_TOKEN)"),
        Setting(
            "TFORMER_ADMIN_TOKEN",
            None,
            _token,
            "the secret the Memory and caches page asks for",
            secret=True,
            default_text="none (the page is not served)",
        ),
        Setting("TFORMER_LOG_LEVEL", logging.INFO, _log_level, "the server log's level (DEBUG adds tracebacks)"),
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
            _folder,
            "the folder lecturers' decks are saved in (files; it wins over TFORMER_REDIS_URL)",
            default_text="Redis when TFORMER_REDIS_URL is set, else TFORMER_CACHE_DIR/decks",
        ),
        Setting("TFORMER_DECK_DAYS", 30.0, _days, "a saved deck is deleted this many days after its last change"),
        Setting("TFORMER_DECKS", 2000, _whole, "the most decks the server keeps (a new one past them is refused)"),
        Setting(
            "TFORMER_CLASS_PER_ADDRESS",
            150,
            _whole,
            "new students one client address may add to a class a minute (and answers it may send in 10 s)",
        ),
        # Read by deploy/run.sh (a shell script), listed here so that setting it is not reported as a typo.
        Setting(
            "TFORMER_PYTHON",
            None,
            str,
            "the Python deploy/run.sh runs the replicas with",
            default_text=".venv/bin/python",
        ),
    )
}

_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def _report_once(key: tuple[str, str], message: str, *args: Any) -> None:
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)
    log.warning(message, *args)


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The setting `name` as the environment gives it now (or `environ`, standing for it), checked; its default
    when unset or bad (a bad value is logged once)."""
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError as why:
        shown = "(hidden)" if setting.secret else repr(raw[:80])
        default = setting.default_text or ("none" if setting.default in (None, ()) else _shown(setting))
        _report_once((name, raw), "%s=%s is refused (%s); using %s", name, shown, why, default)
        return setting.default


def _shown(setting: Setting) -> str:
    """A setting's default as it would be written in the environment."""
    default = setting.default
    if setting.parse is _log_level:
        return logging.getLevelName(default)
    if isinstance(default, tuple):
        return os.pathsep.join(str(p) for p in default)
    if isinstance(default, bool):
        return "1" if default else "0"
    return f"{default:g}" if isinstance(default, float) else str(default)


def check_environment() -> None:
    """Read every setting once (bad values are logged), and log any TFORMER_ name that is not a setting (a typo:
    its value would otherwise be ignored without a word)."""
    for name in SETTINGS:
        value(name)
    for name in sorted(os.environ):
        if name.startswith("TFORMER_") and name not in SETTINGS:
            _report_once((name, "?"), "%s is not a tformer setting (a typo?); it is ignored", name)


# ---- typed accessors ----------------------------------------------------------------------------------
def device() -> torch.device:
    """TFORMER_DEVICE, else CUDA when there is one, else the CPU."""
    chosen = value("TFORMER_DEVICE")
    return chosen if chosen is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_dirs() -> list[Path]:
    """TFORMER_MODEL_DIRS: the folders local models may be loaded from (default: the repository's ./models)."""
    return list(value("TFORMER_MODEL_DIRS"))


def image_dirs() -> list[Path]:
    """TFORMER_IMAGE_DIRS: folders of extra sample pictures (none by default)."""
    return list(value("TFORMER_IMAGE_DIRS"))


def cache_dir() -> Path:
    """TFORMER_CACHE_DIR: where converted models are kept (default ~/.cache/tformer)."""
    return value("TFORMER_CACHE_DIR")


def megabytes(name: str) -> int:
    """A *_MB setting in bytes (MB = 2**20 bytes for memory, 10**6 for files on disk, as their meanings say)."""
    scale = 10**6 if name.startswith("TFORMER_HUB") else 2**20
    return int(value(name) * scale)


def gpu_bytes() -> int | None:
    """TFORMER_GPU_MB in bytes: the GPU memory this process may use; None when unset (no cap)."""
    mb = value("TFORMER_GPU_MB")
    return None if mb is None else int(mb * 2**20)


def request_flops() -> float:
    """TFORMER_REQUEST_GFLOP in floating-point operations: what one request may compute (tformer_core.workload)."""
    return float(value("TFORMER_REQUEST_GFLOP")) * 1e9
