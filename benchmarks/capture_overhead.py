"""Capture overhead: a traced forward pass (every activation captured and turned into a numpy Trace)
against a plain forward pass of the same model on the same input.

    python benchmarks/capture_overhead.py [--device cuda] [--repeats 9] [--allocator retain|default]

Without --allocator it runs twice, in fresh processes: first as the app runs (glibc told to keep
freed memory, `tc.retain_freed_memory()`), then with the allocator's defaults.

Models are full-size with random weights (speed does not depend on the values): a BERT-base-sized
encoder (12 layers, 12 heads, d_model 768, FFN 3072) at 128 and 512 tokens, and a ViT-B/16-sized
model at 224 px. Times are medians over interleaved repeats after warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tformer_core as tc  # noqa: E402

GOAL = 1.15


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model: tc.TracedModel, plain, traced, repeats: int) -> tuple[float, float, float]:
    """Median seconds of plain() and traced(), and the MB a trace holds."""
    device = model.device
    with torch.inference_mode():
        for _ in range(2):
            plain()
            _sync(device)
    trace = traced()
    captured_mb = sum(a.nbytes for a in trace.activations.values()) / 2**20
    del trace
    t_plain, t_traced = [], []
    for _ in range(repeats):  # interleaved, so drift in machine speed hits both alike
        with torch.inference_mode():
            start = time.perf_counter()
            plain()
            _sync(device)
            t_plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        trace = traced()  # ends with the copy to CPU numpy, so it is synchronous
        t_traced.append(time.perf_counter() - start)
        del trace
    return statistics.median(t_plain), statistics.median(t_traced), captured_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--allocator", choices=["retain", "default"], default=None)
    args = parser.parse_args()
    if args.allocator is None:
        for allocator in ("retain", "default"):
            subprocess.run([sys.executable, __file__, "--allocator", allocator, *sys.argv[1:]], check=True)
            print()
        return
    retained = tc.retain_freed_memory() if args.allocator == "retain" else False
    device = torch.device(args.device) if args.device else tc.default_device()
    torch.manual_seed(0)

    bert = tc.Encoder(tc.EncoderConfig(
        vocab_size=30522, max_positions=512, n_layers=12, d_model=768, n_heads=12, d_ff=3072,
        n_token_types=2, ln_eps=1e-12,
    )).place(device, args.dtype)  # fmt: skip
    vit = tc.ViT(tc.ViTConfig(
        image_size=224, patch_size=16, n_layers=12, d_model=768, n_heads=12, d_ff=3072, n_classes=1000,
    )).place(device, args.dtype)  # fmt: skip

    rows = []
    for n in (128, 512):
        ids = torch.randint(0, 30522, (1, n), device=device)
        ids_list = ids[0].tolist()
        rows.append(("BERT-base-sized encoder", f"{n} tokens", *measure(bert, lambda: bert(ids), lambda: bert.trace(ids_list), args.repeats)))
    image = torch.randn(3, 224, 224)
    batch = image[None].to(device=device, dtype=vit.dtype)
    rows.append(("ViT-B/16-sized", "224 px, 197 tokens", *measure(vit, lambda: vit(batch), lambda: vit.trace(image), args.repeats)))

    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    allocator = "glibc keeps freed memory (as the app runs)" if retained else "allocator defaults"
    print(f"Capture overhead on {device.type.upper()} ({args.dtype}, torch {torch.__version__}, CPU threads {threads}),")
    print(f"{allocator}; median of {args.repeats} interleaved runs.")
    print(f"Baseline: the same model's plain forward pass. Goal: ratio <= {GOAL}x.\n")
    header = f"| {'model':<24} | {'input':<18} | {'plain forward':>13} | {'traced forward':>14} | {'ratio':>6} | {'captured':>9} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, what, plain_s, traced_s, mb in rows:
        ratio = traced_s / plain_s
        print(
            f"| {name:<24} | {what:<18} | {plain_s * 1e3:>10.1f} ms | {traced_s * 1e3:>11.1f} ms | "
            f"{ratio:>5.2f}x | {mb:>6.0f} MB |"
        )


if __name__ == "__main__":
    main()
