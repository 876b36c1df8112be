"""Reading checkpoint tensors safely and copying them into the core's modules."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn


class CheckpointError(ValueError):
    """A model could not be loaded; the message says why and what to do, for the user."""


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face checkpoint folder: safetensors (single or sharded) first, else
    pytorch_model.bin through `torch.load(weights_only=True)`, which refuses to run pickled code."""
    from safetensors.torch import load_file

    shards = sorted(folder.glob("model*.safetensors"))
    if shards:
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(load_file(str(shard)))
        return tensors
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if bins:
        tensors = {}
        for path in bins:
            tensors.update(torch.load(path, map_location="cpu", weights_only=True))
        return tensors
    raise CheckpointError(f"no weights in {folder.name}: expected model.safetensors or pytorch_model.bin")


class Weights:
    """A checkpoint's tensors, looked up by name with or without the architecture's prefix."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefixes: Iterable[str] = ()) -> None:
        self.tensors = tensors
        self.prefixes = ("", *prefixes)

    def has(self, name: str) -> bool:
        return any(p + name in self.tensors for p in self.prefixes)

    def __getitem__(self, name: str) -> torch.Tensor:
        for prefix in self.prefixes:
            if prefix + name in self.tensors:
                return self.tensors[prefix + name]
        raise CheckpointError(f"the checkpoint has no tensor {name!r} (is it the architecture its config says?)")


def assign(model: nn.Module, mapping: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint tensors into `model` by core parameter name; every parameter must be covered.

    Tied parameters (one tensor under two names) need only one of their names in `mapping`.
    """
    expected = model.state_dict()
    unknown = sorted(set(mapping) - set(expected))
    if unknown:
        raise CheckpointError(f"internal mapping names unknown parameters: {unknown[:5]}")
    covered = set()
    with torch.no_grad():
        for name, tensor in mapping.items():
            target = expected[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise CheckpointError(
                    f"{name}: the checkpoint has shape {tuple(tensor.shape)}, the config implies {tuple(target.shape)}"
                )
            target.copy_(tensor.to(target.dtype))
            covered.add(target.data_ptr())
    missing = [name for name, t in expected.items() if t.data_ptr() not in covered]
    if missing:
        raise CheckpointError(f"the checkpoint does not provide {missing[:5]}")
