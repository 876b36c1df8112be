"""A server's replicas sharing one GPU: forward-pass slots counted across processes (tested with real processes on
the CPU), GPU bytes weighed apart from the host's in the results budget, TFORMER_GPU_MB read and applied."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import tformer_core as tc
from tests.core.tiny_models import tiny_encoder
from tformer_app import gpu
from tformer_app.budget import ByteBudgetCache, device_size_of, size_of
from tformer_app.settings import server_settings
from tformer_app.slots import DeviceSlots

ROOT = Path(__file__).resolve().parents[2]
MB = 2**20

# A process that takes a slot, says so in a file, and holds it until told to let go (or until it is killed).
HOLDER = """
import sys, time
from pathlib import Path
from tformer_app.slots import DeviceSlots
folder, n, name = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
(folder / f"{name}.waiting").touch()
with DeviceSlots(folder, n):
    (folder / f"{name}.held").touch()
    while not (folder / f"{name}.release").exists():
        time.sleep(0.01)
"""


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polling interval of the condition above


def _holder(folder: Path, n: int, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(n), name], cwd=ROOT)


def test_slots_are_counted_across_processes_and_a_killed_holder_frees_its_slot(tmp_path):
    slots = DeviceSlots(tmp_path, 2)
    a, b = _holder(tmp_path, 2, "a"), _holder(tmp_path, 2, "b")
    c = None
    try:
        _wait_for(lambda: (tmp_path / "a.held").exists() and (tmp_path / "b.held").exists(), "two holders")
        assert slots.held() == 2  # both slots taken, by two other processes
        c = _holder(tmp_path, 2, "c")
        _wait_for(lambda: (tmp_path / "c.waiting").exists(), "the third process to ask")
        time.sleep(0.3)  # were the count per process, c would hold a slot by now
        assert not (tmp_path / "c.held").exists() and slots.held() == 2
        (tmp_path / "a.release").touch()  # a lets go: c gets its slot
        _wait_for(lambda: (tmp_path / "c.held").exists(), "the third process to get the freed slot")
        assert a.wait(30) == 0 and slots.held() == 2
        b.send_signal(signal.SIGKILL)  # killed in the middle of its pass: the kernel drops its lock
        b.wait(30)
        _wait_for(lambda: slots.held() == 1, "the killed holder's slot to be free")
        with slots:  # and this process can take it
            assert slots.held() == 2
        (tmp_path / "c.release").touch()
        assert c.wait(30) == 0 and slots.held() == 0
    finally:
        for process in (a, b, c):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)


def test_threads_of_one_process_count_as_holders_too(tmp_path):
    slots, lock = DeviceSlots(tmp_path, 2), threading.Lock()
    inside, most, errors = [0], [0], []

    def work() -> None:
        try:
            for _ in range(20):
                with slots:
                    with lock:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    time.sleep(0.001)
                    with lock:
                        inside[0] -= 1
        except Exception as error:  # reported below: an exception in a thread would pass silently
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and most[0] <= 2 and inside[0] == 0 and slots.held() == 0
    with slots, slots:  # nested blocks of one thread hold two slots
        assert slots.held() == 2


def test_a_lock_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu.os, "getuid", lambda: 12345)  # the folder (ours) now looks like someone else's
    monkeypatch.setattr("tformer_app.slots.os.getuid", lambda: 12345)
    with pytest.raises(PermissionError, match="another user"):
        DeviceSlots(tmp_path, 1)


def test_passes_are_counted_per_gpu_on_cuda_and_per_process_on_the_cpu(tmp_path, monkeypatch):
    assert isinstance(gpu.pass_slots(2, torch.device("cpu")), threading.BoundedSemaphore)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(gpu, "gpu_name", lambda device: "gpu-test-uuid")
    slots = gpu.pass_slots(3, torch.device("cuda", 0))
    assert isinstance(slots, DeviceSlots) and slots.n == 3
    assert slots.folder == tmp_path / f"tformer-{gpu.os.getuid()}" / "passes" / "gpu-test-uuid"


def test_gpu_memory_is_capped_at_tformer_gpu_mb(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 80 * 2**30}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i)))
    assert gpu.limit_gpu_memory(10 * 2**30, torch.device("cuda", 0)) == 0.125 and calls == [(0.125, 0)]
    assert gpu.limit_gpu_memory(None, torch.device("cuda", 0)) is None  # unset: no cap
    assert gpu.limit_gpu_memory(2**30, torch.device("cpu")) is None and len(calls) == 1


def test_tformer_gpu_mb_is_read_with_the_other_settings(monkeypatch):
    monkeypatch.setenv("TFORMER_GPU_MB", "4096")
    monkeypatch.setenv("TFORMER_CACHE_MB", "300")
    settings = server_settings()
    assert settings.gpu_bytes == 4096 * MB and settings.results_gpu_bytes == 2048 * MB  # half for cached results
    monkeypatch.setenv("TFORMER_GPU_MB", "lots")  # refused (logged): no cap, results keep TFORMER_CACHE_MB there
    settings = server_settings()
    assert settings.gpu_bytes is None and settings.results_gpu_bytes == 300 * MB


def _on_device(trace: tc.Trace) -> tc.Trace:
    """The trace with its tensors on the meta device: bytes that are not the host's, as a GPU's are."""
    return replace(trace, activations={name: t.to("meta") for name, t in trace.activations.items()})


def test_the_results_budget_counts_gpu_bytes_apart_from_the_hosts():
    host_trace = tiny_encoder().trace([1, 2, 3, 4, 5]).compact()
    device_trace = _on_device(host_trace)
    unit = device_trace.nbytes  # each tensor on its own (a copy to the device shares nothing)
    assert device_trace.device.type == "meta" and unit >= host_trace.nbytes
    assert size_of(host_trace) >= host_trace.nbytes and device_size_of(host_trace) == 0
    assert device_size_of(device_trace) == unit and size_of(device_trace) < unit / 4  # tokens and meta only
    assert device_size_of({"a": [device_trace], "b": torch.zeros(10, device="meta")}) == unit + 40
    # Three traces fit the host budget; on the "GPU", only two fit its own budget: the oldest goes.
    cache = ByteBudgetCache("results", 64 * MB, device_budget_bytes=int(2.5 * unit))
    for key in "abc":
        cache.get_or_compute(key, lambda: _on_device(host_trace))
    stats = cache.stats()
    assert cache.peek("a") is None and cache.peek("b") is not None and cache.peek("c") is not None
    assert stats.device_bytes == 2 * unit and stats.evicted == 1
    cache.get_or_compute("host", lambda: np.zeros(MB, dtype=np.uint8))  # host bytes do not count on the GPU
    assert cache.stats().device_bytes == 2 * unit and cache.peek("b") is not None
    cache.discard("b")
    assert cache.stats().device_bytes == unit
    huge = [_on_device(host_trace) for _ in range(3)]  # more than the GPU budget: used once, not kept
    assert cache.get_or_compute("huge", lambda: huge) is huge and cache.peek("huge") is None
    cache.clear()
    assert cache.stats().device_bytes == 0


def test_a_device_the_machine_cannot_use_leaves_the_server_on_its_default(monkeypatch, caplog):
    monkeypatch.setenv("TFORMER_DEVICE", "gpu-please")
    with caplog.at_level("WARNING", logger="tformer_core"):
        device = gpu.server_device()  # the server starts, on the device it would use without the setting
    assert device == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert any("TFORMER_DEVICE='gpu-please' is refused" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("TFORMER_GPU_MB", "0")  # not a positive number: no cap, logged
    with caplog.at_level("WARNING", logger="tformer_core"):
        assert server_settings().gpu_bytes is None
    assert any(
        "TFORMER_GPU_MB='0' is refused (not a positive number); using no cap" in r.getMessage() for r in caplog.records
    )
