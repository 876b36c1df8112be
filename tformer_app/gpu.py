"""A server process that shares one GPU with others (deploy/'s replicas): forward passes counted per GPU across
the processes, and the process's GPU memory capped in bytes. No Streamlit here (tested on its own).

    passes = pass_slots(settings.passes, device)    # `with passes:` around every forward pass
    limit_gpu_memory(settings.gpu_bytes, device)     # once, when the server starts

Why across processes: a class's server runs one replica per CPU core (a Streamlit process runs its pages'
Python on one core), and on a GPU machine they all run their models on the same GPU. TFORMER_PASSES counted
in each process would let K replicas run K passes at once on it, each with its working memory; counted per
GPU, TFORMER_PASSES is what the GPU runs at once whatever the number of replicas.

How: `slots.DeviceSlots` (file locks) in a folder named after the GPU (its UUID), private to the user. On the
CPU, passes are counted in the process (each replica has its own cores).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

import torch

from . import settings
from .slots import DeviceSlots, Slots

log = logging.getLogger("tformer_app")


def server_device() -> torch.device:
    """Where this server process runs its models: TFORMER_DEVICE, else a GPU when there is one (read and checked
    in tformer_core.settings: a device this machine cannot use is logged and the default used)."""
    return settings.device()


def runtime_folder() -> Path:
    """This user's folder for the locks of the servers it runs: $XDG_RUNTIME_DIR or the temporary folder."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"tformer-{os.getuid()}"


def gpu_name(device: torch.device) -> str:
    """A name for the GPU `device` is, the same in every process: its UUID (indices change with
    CUDA_VISIBLE_DEVICES), else its index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"gpu-{uuid}" if uuid else f"cuda-{index}"


def pass_slots(n: int, device: torch.device) -> Slots:
    """TFORMER_PASSES as the server applies it: slots shared by every process using the same GPU when `device`
    is one (falling back to this process's own count, with a warning, where the lock folder cannot be used),
    else a semaphore of this process."""
    if device.type == "cuda":
        try:
            return DeviceSlots(runtime_folder() / "passes" / gpu_name(device), n)
        except OSError as error:
            log.warning("forward passes are counted in this process only: %s", error)
    return threading.BoundedSemaphore(n)


def limit_gpu_memory(gpu_bytes: int | None, device: torch.device) -> float | None:
    """Cap this process's GPU memory at `gpu_bytes` (TFORMER_GPU_MB): PyTorch's allocator refuses to go past it
    (an out-of-memory error in this replica, not in its neighbours). Returns the fraction of the GPU set, or
    None when there is nothing to cap (no GPU, no limit)."""
    if gpu_bytes is None or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = min(1.0, gpu_bytes / total)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    log.info("GPU %d: this process may use %.0f MB of %.0f MB", index, gpu_bytes / 2**20, total / 2**20)
    return fraction
