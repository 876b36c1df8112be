"""Shared by the benchmarks: interleaved timing and a printed table (ours, baseline, ratio)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(
    ours: Callable[[], object], baseline: Callable[[], object], repeats: int, device: torch.device, warmup: int = 2
) -> tuple[float, float]:
    """Median seconds of ours() and baseline(), run alternately so drift in machine speed hits both alike."""
    for _ in range(warmup):
        ours(), sync(device), baseline(), sync(device)
    t_ours, t_base = [], []
    for _ in range(repeats):
        for fn, times in ((ours, t_ours), (baseline, t_base)):
            start = time.perf_counter()
            result = fn()
            sync(device)
            times.append(time.perf_counter() - start)
            del result
    return statistics.median(t_ours), statistics.median(t_base)


def median_time(fn: Callable[[], object], repeats: int, device: torch.device, warmup: int = 1) -> float:
    """Median seconds of fn() (the device's queued work waited for), after `warmup` runs."""
    for _ in range(warmup):
        fn()
        sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times)


def print_table(rows: list[tuple[str, str, float, float]], ours_label: str, base_label: str, goal: float) -> None:
    """rows: (model, input, our seconds, baseline seconds)."""
    w_name = max([26, *(len(r[0]) for r in rows)])
    w_what = max([20, *(len(r[1]) for r in rows)])
    header = f"| {'model':<{w_name}} | {'input':<{w_what}} | {ours_label:>16} | {base_label:>16} | {'ratio':>6} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for name, what, ours, base in rows:
        ratio = ours / base
        flag = "" if ratio <= goal else "  (over goal)"
        print(
            f"| {name:<{w_name}} | {what:<{w_what}} | {ours * 1e3:>13.1f} ms | {base * 1e3:>13.1f} ms "
            f"| {ratio:>5.2f}x |{flag}"
        )


def run_each_allocator(script: str) -> bool:
    """Without --allocator in argv, rerun `script` in fresh processes, as the app runs (glibc keeps freed
    memory) and with allocator defaults; returns True when it did (the caller then stops)."""
    if "--allocator" in sys.argv:
        return False
    for allocator in ("retain", "default"):
        subprocess.run([sys.executable, script, "--allocator", allocator, *sys.argv[1:]], check=True)
        print()
    return True
