"""Reading checkpoint tensors safely and copying them into the core's modules.

`read_tensors` looks at a checkpoint folder's weights without loading them: the safetensors headers
(names, number formats, shapes, where each tensor lies in the file), checked against the file's real
length, or, for `pytorch_model.bin`, the pickle through `torch.load(weights_only=True)` (which refuses
anything but tensors, so a pickle's code never runs) with the data memory-mapped. The result can be
viewed as tensors on PyTorch's "meta" device (shapes only, no memory), which lets the loader build the
model and match every tensor's shape against the config before a single weight is allocated.

`read_tensors(folder, mapped=True)` is for folders whose files are never rewritten in place (the converted
cache of a bundled model: a new conversion is written beside it and renamed into place): its tensors are
views of a private, copy-on-write memory map of each file, and `assign` makes them the model's parameters as
they are. Nothing is copied, so a cold load costs no more than reading the file once (the finiteness check);
on a 2-core virtual machine, faulting in 540 MB of fresh memory for a copy took 2 to 5 seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import re
import sys
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from .errors import CheckpointError
from .hfconfig import read_json
from .limits import BYTES_PER_PARAM, count, max_params, megabytes

__all__ = ["CheckpointError", "CheckpointTensors", "Weights", "assign", "read_tensors"]

MAX_HEADER_BYTES = 16_000_000  # a 400-tensor checkpoint's header is about 40 kB
BIN_SLACK = 1.25  # a .bin may hold a little more than the model uses (a pooler, a second head)

# safetensors' names for number formats; anything else is reported by name.
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# How torch's weights-only unpickler words a refusal (torch 2.13: "Trying to load unsupported GLOBAL posix.system
# whose module posix is blocked", "Unsupported global: GLOBAL x was not an allowed global by default", ...).
_REFUSED_PICKLE = ("is blocked", "unsupported global", "not an allowed global", "can only", "allowlist")
_PLAIN_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a file name in the folder, never a path


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of `shape`, in elements."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor is and what it holds, known without reading its data."""

    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    end: int = 0  # where its data ends in a safetensors file's data section (bytes)
    start: int = -1  # where its data starts in the file (bytes from the file's beginning; -1: not known)


def _numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


def _short(name: str) -> str:
    """A tensor's name as a message shows it (a damaged header may hold any text there)."""
    return name if len(name) <= 80 else name[:77] + "..."


def safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Names, number formats and shapes in a safetensors file, checked against the file's length.

    The format: 8 bytes (little-endian length n), n bytes of JSON {name: {dtype, shape, data_offsets}},
    then the data. A damaged or truncated file fails here, before anything is allocated for it.
    """
    name = path.name
    raw, size = _header_bytes(path)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise CheckpointError(
            f"{name} is damaged or is not a safetensors file: its header is not valid JSON"
        ) from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{name} is damaged: its header is not a table of tensors")
    data_bytes = size - 8 - len(raw)
    infos = {
        key: _tensor_info(name, key, entry, 8 + len(raw)) for key, entry in header.items() if key != "__metadata__"
    }
    needed = max((info.end for info in infos.values()), default=0)
    if needed > data_bytes:
        raise CheckpointError(
            f"{name} is truncated: its tensors need {needed:,} bytes of data, the file holds {max(data_bytes, 0):,} "
            "(was a download or a copy interrupted?)"
        )
    return infos


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """(the JSON header's bytes, the file's size), checked against each other."""
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{name} is damaged: {size} bytes is too short for a safetensors file")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(  # the number is not shown: it is the file's own bytes
                    f"{name} is damaged or is not a safetensors file: its first 8 bytes should give the length of "
                    f"its header, and give more than a header takes ({MAX_HEADER_BYTES / 1e6:.0f} MB at most)"
                )
            if 8 + n > size:
                raise CheckpointError(
                    f"{name} is damaged or truncated: its header should take {n:,} bytes, the file has {size:,}"
                )
            return f.read(n), size
    except OSError as error:
        raise CheckpointError(f"{name} cannot be read ({error.strerror or type(error).__name__})") from error


def _tensor_info(name: str, key: str, entry: object, data_start: int = 0) -> TensorInfo:
    """One entry of a safetensors header ({dtype, shape, data_offsets}), checked; `data_start`: where the file's
    data section begins."""
    try:
        dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]  # type: ignore[index]  # untrusted JSON: a TypeError is caught below
        shape = tuple(shape)
        valid = len(shape) <= 8 and all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
        valid = valid and all(type(o) is int for o in (begin, end))
    except (TypeError, KeyError, ValueError):
        valid = False
    if not valid:
        raise CheckpointError(f"{name} is damaged: the header's entry for {_short(key)!r} is not a tensor description")
    dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise CheckpointError(
            f"{name}: the tensor {_short(key)} is stored as {str(dtype_name)[:20]!r}, a number format tformer "
            "cannot read"
        )
    if not 0 <= begin <= end or end - begin != _numel(shape) * dtype.itemsize:
        raise CheckpointError(
            f"{name} is damaged: the tensor {_short(key)}'s place in the file does not match its shape"
        )
    return TensorInfo(name, dtype, shape, end, data_start + begin)


def _plain_name(index: str, value: object) -> str:
    """A shard's name from an index file: a file in the model folder, never a path (which is not echoed)."""
    if not isinstance(value, str) or not _PLAIN_FILE.match(value):
        shown = re.split(r"[/\\]", str(value))[-1][:60]
        raise CheckpointError(f"{index}: the shard {shown!r} is not named as a file in the model folder")
    return value


def _sharded_files(folder: Path, index: str, suffix: str) -> tuple[list[str], dict[str, str]]:
    """(the shard files an index json names, its tensor -> file table); each file must be present."""
    table = read_json(folder / index).get("weight_map")
    if not isinstance(table, dict) or not table:
        raise CheckpointError(f"{index} has no weight_map (the table of which file holds each tensor)")
    weight_map = {str(k): _plain_name(index, v) for k, v in table.items()}
    files = sorted(set(weight_map.values()))
    for file in files:
        if not file.endswith(suffix):
            raise CheckpointError(f"{index} names {file}, which is not a {suffix} file")
        if not (folder / file).is_file():
            raise CheckpointError(
                f"{index} names {file}, which is not in the model folder (was a download interrupted?)"
            )
    return files, weight_map


def _check_index(index: str, weight_map: dict[str, str], infos: dict[str, TensorInfo]) -> None:
    for tensor, file in weight_map.items():
        if tensor not in infos or infos[tensor].file != file:
            raise CheckpointError(f"{index} says {file} holds the tensor {_short(tensor)}, but it does not")


def _load_pickled(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a pytorch_model*.bin, through the weights-only unpickler; data memory-mapped when it can be."""
    name = path.name
    # torch.save's zip format can be memory-mapped (no copy of the data); the legacy format is read whole,
    # which is why the file's size is checked before this.
    memory_mapped = zipfile.is_zipfile(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=memory_mapped)
    except pickle.UnpicklingError as error:
        if any(words in str(error).lower() for words in _REFUSED_PICKLE):
            raise CheckpointError(
                f"{name} holds Python objects besides tensors. tformer never unpickles those (a pickle can run "
                "code on the server): use the model's model.safetensors, or save it with safetensors"
            ) from error
        raise CheckpointError(f"{name} is damaged or is not a PyTorch weights file") from error
    except MemoryError as error:
        raise CheckpointError(f"{name}: there is not enough memory on the server to read it") from error
    except Exception as error:  # zip errors, EOF, storage size mismatches: all mean a broken file
        raise CheckpointError(f"{name} is damaged or truncated: PyTorch cannot read it") from error
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{name} does not hold a table of named tensors (the Hugging Face layout)")
    tensors = {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{name} holds no named tensors (the Hugging Face layout has one per weight)")
    return tensors


def _check_bin_size(folder: Path, files: list[str]) -> None:
    """A .bin must be unpickled to be read: refuse one far larger than an admitted model before opening it."""
    total = sum((folder / f).stat().st_size for f in files)
    limit = max_params()
    allowed = limit * BYTES_PER_PARAM * BIN_SLACK
    if total > allowed:
        shown = f"{files[0]} is" if len(files) == 1 else f"the {len(files)} pytorch_model files are"
        raise CheckpointError(
            f"{shown} {megabytes(total)}: more than a model within this server's limit of {count(limit)} "
            f"parameters takes ({megabytes(allowed)} as float32; the setting TFORMER_MAX_PARAMS)"
        )


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors by name. Safetensors data is read (memory-mapped) only when a tensor is asked for;
    `meta()` gives the same names and shapes on the meta device, with no data at all.

    `mapped`: safetensors tensors are views of a private (copy-on-write) memory map of their file, which the
    model may keep as its parameters (`assign` does); only for files nobody rewrites in place.
    """

    def __init__(
        self,
        folder: Path,
        infos: dict[str, TensorInfo],
        pickled: dict[str, torch.Tensor] | None = None,
        meta: bool = False,
        mapped: bool = False,
    ) -> None:
        self.folder, self.infos, self.pickled, self.is_meta = folder, infos, pickled, meta
        self.mapped = mapped and pickled is None and not meta
        self._handles: dict[str, object] = {}
        self._maps: dict[str, torch.UntypedStorage] = {}
        self._stack = contextlib.ExitStack()

    def __getitem__(self, name: str) -> torch.Tensor:
        info = self.infos[name]
        if self.is_meta:
            return torch.empty(info.shape, dtype=info.dtype, device="meta")
        if self.pickled is not None:
            return self.pickled[name]
        try:
            if self.mapped:
                return self._mapped(name, info)
            return self._open(info.file).get_tensor(name)
        except CheckpointError:
            raise
        except MemoryError as error:
            raise CheckpointError(f"{info.file}: there is not enough memory on the server to read it") from error
        except Exception as error:  # SafetensorError and I/O errors: the file changed or is damaged
            raise CheckpointError(f"{info.file} is damaged: the tensor {name} cannot be read") from error

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def __contains__(self, name: object) -> bool:
        return name in self.infos

    def _mapped(self, name: str, info: TensorInfo) -> torch.Tensor:
        """The tensor as a view of its file's private memory map (a copy when its bytes cannot be viewed as
        they are: misaligned, or a big-endian machine)."""
        itemsize = info.dtype.itemsize
        if info.start < 0 or info.start % itemsize or sys.byteorder != "little":
            return self._open(info.file).get_tensor(name).clone()
        if info.file not in self._maps:
            path = self.folder / info.file
            # shared=False: MAP_PRIVATE, so a parameter changed in place never writes to the file.
            storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)
            self._maps[info.file] = cast(torch.UntypedStorage, storage)  # from_file on UntypedStorage gives one
        view = torch.empty(0, dtype=info.dtype)
        return view.set_(self._maps[info.file], info.start // itemsize, info.shape, _contiguous_strides(info.shape))

    def _open(self, file: str):
        """safe_open's handle for `file` (it validates the header too); kept until close()."""
        if file not in self._handles:
            from safetensors import safe_open

            try:
                self._handles[file] = self._stack.enter_context(
                    safe_open(str(self.folder / file), framework="pt", device="cpu")
                )
            except Exception as error:
                raise CheckpointError(f"{file} is damaged or is not a safetensors file") from error
        return self._handles[file]

    def open_all(self) -> None:
        """Let safetensors check every file's header now (it is stricter about offsets than a reader must be)."""
        if self.pickled is None:
            for file in dict.fromkeys(i.file for i in self.infos.values()):
                self._open(file)

    def meta(self) -> CheckpointTensors:
        return CheckpointTensors(self.folder, self.infos, self.pickled, meta=True)

    def file_of(self, name: str) -> str:
        return self.infos[name].file if name in self.infos else self.describe()

    def describe(self) -> str:
        files = list(dict.fromkeys(i.file for i in self.infos.values()))
        if len(files) == 1:
            return files[0]
        return f"the weights files ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()
        self._maps.clear()  # the tensors handed out keep their file's map for as long as they live


def read_tensors(folder: Path, mapped: bool = False) -> CheckpointTensors:
    """What a checkpoint folder's weights hold, without loading them: safetensors (single, sharded with
    model.safetensors.index.json, or several model*.safetensors) first, else pytorch_model*.bin.

    mapped=True (only for a folder whose files are never rewritten in place): safetensors tensors are views of
    the files' private memory maps, which the model keeps as its parameters (see `CheckpointTensors`).
    Raises CheckpointError naming the file when one is missing, damaged, truncated or refused.
    """
    if (folder / "model.safetensors.index.json").is_file():
        files, weight_map = _sharded_files(folder, "model.safetensors.index.json", ".safetensors")
        infos = {k: v for file in files for k, v in safetensors_header(folder / file).items()}
        _check_index("model.safetensors.index.json", weight_map, infos)
        tensors = CheckpointTensors(folder, infos, mapped=mapped)
    elif files := sorted(p.name for p in folder.glob("model*.safetensors") if p.is_file()):
        infos = {k: v for file in files for k, v in safetensors_header(folder / file).items()}
        tensors = CheckpointTensors(folder, infos, mapped=mapped)
    else:
        index = "pytorch_model.bin.index.json"
        weight_map = None
        if (folder / index).is_file():
            files, weight_map = _sharded_files(folder, index, ".bin")
        else:
            files = sorted(p.name for p in folder.glob("pytorch_model*.bin") if p.is_file())
        if not files:
            raise CheckpointError("no weights: the folder has neither model.safetensors nor pytorch_model.bin")
        _check_bin_size(folder, files)
        pickled: dict[str, torch.Tensor] = {}
        infos = {}
        for file in files:
            for key, t in _load_pickled(folder / file).items():
                pickled[key], infos[key] = t, TensorInfo(file, t.dtype, tuple(t.shape))
        if weight_map is not None:
            _check_index(index, weight_map, infos)
        tensors = CheckpointTensors(folder, infos, pickled)
    if not tensors.infos:
        raise CheckpointError(f"{', '.join(files)} {'holds' if len(files) == 1 else 'hold'} no tensors")
    tensors.open_all()
    return tensors


class Weights:
    """A checkpoint's tensors, looked up by name with or without the architecture's prefix.

    Every tensor handed out is checked: it must hold floating-point numbers (an int or bool tensor where a
    weight belongs means the file is not what its name says), and, when it has data, finite ones.
    `shareable`: the tensors may become the model's parameters as they are (`assign` then copies nothing).
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], prefixes: Iterable[str] = ()) -> None:
        self.tensors = tensors
        self.prefixes = ("", *prefixes)
        self.shareable = bool(getattr(tensors, "mapped", False))
        # id of each tensor handed out -> (its name in the file, the tensor, kept so that the id stays its own)
        self.handed: dict[int, tuple[str, torch.Tensor]] = {}

    def has(self, name: str) -> bool:
        return any(p + name in self.tensors for p in self.prefixes)

    def file_of(self, name: str) -> str:
        file_of = getattr(self.tensors, "file_of", None)
        return file_of(name) if file_of is not None else "the weights file"

    def describe(self) -> str:
        describe = getattr(self.tensors, "describe", None)
        return describe() if describe is not None else "the weights file"

    def __getitem__(self, name: str) -> torch.Tensor:
        for prefix in self.prefixes:
            if prefix + name in self.tensors:
                key = prefix + name
                tensor = self.tensors[key]
                if not tensor.is_floating_point():
                    raise CheckpointError(
                        f"{self.file_of(key)}: the tensor {key} holds {str(tensor.dtype).removeprefix('torch.')} "
                        "values; a weight must hold floating-point numbers"
                    )
                if not tensor.is_meta and not all_finite(tensor):
                    raise CheckpointError(f"{self.file_of(key)}: the tensor {key} holds NaN or infinite values")
                self.handed[id(tensor)] = (key, tensor)
                return tensor
        raise CheckpointError(
            f"{self.describe()} has no tensor {name!r}: is it the architecture config.json says (model_type)?"
        )


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every number of a floating-point tensor is finite (no NaN, no infinity).

    The sum first: one pass, no [numel] table of booleans. A NaN or an infinity makes the sum NaN or infinite,
    so a finite sum means finite numbers; a sum that is not finite (which finite numbers may give by
    overflowing) is settled number by number. On the CPU, numpy sums (one thread): PyTorch's threaded sum
    took 2 to 9 ms a tensor on a busy 2-core machine, whatever its size (the threads wait for each other).
    """
    if tensor.device.type == "cpu" and tensor.dtype in (torch.float16, torch.float32, torch.float64):
        accumulate = np.float64 if tensor.dtype == torch.float64 else np.float32
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(tensor.detach().numpy().sum(dtype=accumulate)):
                return True
    elif tensor.dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        wide = torch.float64 if tensor.dtype == torch.float64 else torch.float32
        if bool(torch.isfinite(tensor.sum(dtype=wide))):
            return True
    return bool(torch.isfinite(tensor).all())


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same numbers (a tied output layer saved twice).

    Meta tensors have no numbers: they count as different, so the dry run's parameter count is an upper
    bound (an untied output layer is a matrix of its own).
    """
    if a.is_meta or b.is_meta or tuple(a.shape) != tuple(b.shape):
        return False
    return bool(torch.equal(a, b))


def assign(model: nn.Module, mapping: dict[str, torch.Tensor], weights: Weights | None = None) -> None:
    """Copy checkpoint tensors into `model` by core parameter name; every parameter must be covered.

    Tied parameters (one tensor under two names) need only one of their names in `mapping`. Works on the
    meta device too: there, only names and shapes are compared. `weights` (where the tensors came from)
    lets a message name the file and the tensor as the file calls it. When its tensors are `shareable`, one of
    the parameter's own dtype, device and layout becomes the parameter's data as it is (no copy; never the same
    memory for two parameters).
    """
    expected = model.state_dict(keep_vars=True)  # the parameters themselves: tied ones are one object
    unknown = sorted(set(mapping) - set(expected))
    if unknown:
        raise CheckpointError(f"internal mapping names unknown parameters: {unknown[:5]}")
    source = weights.describe() if weights is not None else "the weights file"
    share = weights is not None and weights.shareable
    covered, shared = set(), set()
    with torch.no_grad():
        for name, tensor in mapping.items():
            target = expected[name]
            if tuple(target.shape) != tuple(tensor.shape):
                key = weights.handed.get(id(tensor), (None,))[0] if weights is not None else None
                where = f"{weights.file_of(key)}: the tensor {key}" if key and weights else f"{source}: {name}"
                raise CheckpointError(
                    f"{where} is {tuple(tensor.shape)}, but config.json implies {tuple(target.shape)}: "
                    "the weights and the config do not belong together"
                )
            if share and _can_share(target, tensor) and tensor.data_ptr() not in shared:
                target.data = tensor  # the same Parameter object: tied parameters stay tied
                shared.add(tensor.data_ptr())
            else:
                target.copy_(tensor)
            covered.add(id(target))
    missing = [name for name, t in expected.items() if id(t) not in covered]
    if missing:
        raise CheckpointError(f"{source} does not provide {missing[:5]}")


def _can_share(target: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `tensor` can be the data of parameter `target` as it is."""
    return (
        not target.is_meta
        and tensor.dtype == target.dtype
        and tensor.device == target.device
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and tensor.numel() > 0
    )
