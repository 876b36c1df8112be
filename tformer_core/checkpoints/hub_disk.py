"""The disk that downloaded hub models take: at most TFORMER_HUB_DISK_MB together, least recently used removed first.

A class typing model ids could otherwise fill the server's disk, one 2 GB download at a time. The models this
server downloaded itself are listed by their folder in the hub's cache, with when each was last used, in
`hub-downloads.json` in TFORMER_CACHE_DIR; only those folders are ever removed (a model the operator put in the
hub's cache stays, and is not counted). Before a
download, `make_room` removes the least recently used listed models until the new one fits beside the others
and the downloads under way; a model larger than the whole cap is refused. Replicas sharing the folders take
turns through a lock file.

    make_room("owner/name", 500e6)   # CheckpointError when it cannot fit; returns once there is room
    used("owner/name")               # a load from the cache: now its most recent use
    finished("owner/name")           # its download ended (its files are counted from the disk from now on)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .. import settings
from .errors import CheckpointError
from .limits import hub_disk_bytes, megabytes

try:
    import fcntl
except ImportError:  # not on Windows: one process's downloads still take turns
    fcntl = None  # type: ignore[assignment]

REGISTRY = "hub-downloads.json"
log = logging.getLogger("tformer_core")
_lock = threading.Lock()
_reserved: dict[str, int] = {}  # downloads under way in this process: their folder -> bytes


def repo_folder(repo_id: str) -> Path:
    """The hub cache's folder of a model repository (models--owner--name)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))


def folder_bytes(folder: Path) -> int:
    """What a repository's files take on disk: its blobs (its snapshots are links to them)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                if not path.is_symlink():
                    total += path.stat().st_size
    return total


@contextlib.contextmanager
def _registry() -> Iterator[dict[str, float]]:
    """The list of downloaded models (folder -> last use, seconds since the epoch), read and written back under
    this process's lock and the lock file (replicas)."""
    folder = settings.cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / REGISTRY
    with _lock, open(folder / (REGISTRY + ".lock"), "a+") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            entries = {}  # a damaged list: start again (the models it listed are no longer removed)
        entries = {str(k): float(v) for k, v in entries.items() if isinstance(v, (int, float))}
        yield entries
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
        temporary.replace(path)


def make_room(repo_id: str, needed: int) -> None:
    """Make room for a download of `needed` bytes: remove the least recently used downloaded models until the
    listed ones, the downloads under way and this one fit in TFORMER_HUB_DISK_MB. CheckpointError when this one
    alone is larger than the cap."""
    cap = hub_disk_bytes()
    if needed > cap:
        raise CheckpointError(
            f"{repo_id}: its files take {megabytes(needed)}, more than this server keeps of downloaded models: "
            f"{megabytes(cap)} (the setting TFORMER_HUB_DISK_MB)"
        )
    try:
        with _registry() as entries:
            _evict(entries, repo_id, needed, cap)
            entries[str(repo_folder(repo_id))] = time.time()
            _reserved[str(repo_folder(repo_id))] = needed
    except OSError as error:  # TFORMER_CACHE_DIR not writable: download anyway, and say why nothing is counted
        log.warning("the disk cap of hub downloads is not kept (%s: %s)", type(error).__name__, error)


def _evict(entries: dict[str, float], repo_id: str, needed: int, cap: int) -> None:
    mine = str(repo_folder(repo_id))
    sizes = {folder: folder_bytes(Path(folder)) for folder in entries if folder != mine}
    under_way = sum(n for folder, n in _reserved.items() if folder != mine)
    total = sum(sizes.values()) + under_way + needed
    for folder in sorted(sizes, key=lambda folder: entries[folder]):  # least recently used first
        if total <= cap:
            break
        if folder in _reserved:
            continue  # being downloaded now (by this process)
        shutil.rmtree(folder, ignore_errors=True)
        del entries[folder]
        total -= sizes[folder]
        shown = Path(folder).name.removeprefix("models--").replace("--", "/")
        log.info("removed the downloaded model %s (%s) to make room for %s", shown, megabytes(sizes[folder]), repo_id)


def used(repo_id: str) -> None:
    """A downloaded model was used (loaded from the cache): it is now the most recently used."""
    with contextlib.suppress(OSError), _registry() as entries:
        if str(repo_folder(repo_id)) in entries:
            entries[str(repo_folder(repo_id))] = time.time()


def finished(repo_id: str) -> None:
    """A download ended, whether it succeeded or not: what it left on disk is counted from its files now."""
    with _lock:
        _reserved.pop(str(repo_folder(repo_id)), None)
