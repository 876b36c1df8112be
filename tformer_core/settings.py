"""Every TFORMER_* setting is a `Setting` in one registry, read from the environment and checked by this module.

A bad value is written to the server's log once (logger "tformer_core": the setting, the value, why it was
refused, the default used instead) and its default is used: a typo must not take a class's server down. A
name that starts with TFORMER_ and is not a setting is reported too (`check_environment`, when the app starts).

The settings are read when asked for, so a notebook or a test that changes the environment sees the change:

    settings.device()          # TFORMER_DEVICE: torch.device, CUDA when there is one
    settings.value("TFORMER_MAX_PARAMS")
    settings.SETTINGS          # name -> Setting (default, meaning): docs/settings.md's table

The core declares the settings it reads itself (devices, model and picture folders, model limits, caches on
disk); the app declares its own (memory budgets, class sessions, decks, the admin page, the log) in
tformer_app.settings, into this registry, so that every one is read, validated and reported the same way and a
notebook that imports only the core needs nothing of the app.
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
    "REPO_ROOT",
    "SETTINGS",
    "Setting",
    "cache_dir",
    "check_environment",
    "declare",
    "device",
    "folder",
    "image_dirs",
    "megabytes",
    "model_dirs",
    "positive",
    "value",
    "whole",
]

log = logging.getLogger("tformer_core")

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---- parsers: text -> value, ValueError with the reason (the app's declarations use the public ones) --------
def positive(text: str) -> float:
    """A positive finite number, plain or scientific ("400e6", "1_500")."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("not a positive number")
    return value


def whole(text: str) -> int:
    """A positive whole number (\"2\", \"1e3\")."""
    value = positive(text)
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


def folder(text: str) -> Path:
    """One folder, absolute and normalised (as `_folders`)."""
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


# ---- the settings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One environment variable: its default (None: unset means "none" or "automatic"), how its text is read,
    and what it means (one line, as docs/settings.md's table says it)."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    meaning: str
    secret: bool = False  # its value is never written to the log
    default_text: str = ""  # the default in words, when it is not a value ("a GPU if there is one")


SETTINGS: dict[str, Setting] = {}  # name -> Setting: the core's, declared below, and the app's (tformer_app.settings)


def declare(*settings: Setting) -> None:
    """Add settings to the registry: from then on `value` reads them and `check_environment` knows their names.
    The same declaration again changes nothing; a name declared twice with another declaration is a bug (two
    meanings for one variable): ValueError."""
    for setting in settings:
        declared = SETTINGS.setdefault(setting.name, setting)
        if declared != setting:
            raise ValueError(f"{setting.name} is declared twice, differently: {declared} and {setting}")


# The settings the core reads itself (the models' device, the model loaders' folders, limits and disk caches,
# the sample pictures' folders); the server's and the class's are the app's.
declare(
    Setting("TFORMER_MODEL_DIRS", (REPO_ROOT / "models",), _folders, "folders local models are read from"),
    Setting("TFORMER_IMAGE_DIRS", (), _folders, "folders whose pictures are offered as samples"),
    Setting(
        "TFORMER_DEVICE",
        None,
        _device,
        "where models run: cpu, cuda, cuda:N or mps",
        default_text="a GPU if there is one, else the CPU",
    ),
    Setting("TFORMER_MAX_PARAMS", 250e6, positive, "the most parameters a model may have"),
    Setting("TFORMER_PASS_MB", 672.0, positive, "MB of working memory one forward pass of a model may take"),
    Setting("TFORMER_HUB_MAX_MB", 2000.0, positive, "MB a hub model's files may take"),
    Setting("TFORMER_HUB_DISK_MB", 10000.0, positive, "MB all downloaded hub models may take on disk"),
    Setting("TFORMER_CACHE_DIR", Path.home() / ".cache" / "tformer", folder, "where smollm2 is converted to"),
)

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
    when unset or bad (a bad value is logged once). KeyError for a name nobody declared."""
    setting = SETTINGS.get(name)
    if setting is None:  # an app setting read before tformer_app.settings declared it, or a misspelt name
        raise KeyError(f"{name} is not a declared setting (the app's are declared by importing tformer_app.settings)")
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
