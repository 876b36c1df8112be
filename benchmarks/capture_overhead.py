"""Capture overhead: a traced forward pass (every activation captured into a Trace, kept on the model's device in
its dtype) against a plain forward pass of the same model on the same input.

    python benchmarks/capture_overhead.py [--device cuda] [--dtype bfloat16] [--repeats 9] [--allocator retain|default]
                                          [--tiny] [--json PATH]

Without --allocator it runs twice, in fresh processes: first as the app runs (glibc told to keep
freed memory, `tformer_app.memory.retain_freed_memory()`), then with the allocator's defaults.

Models are full-size with random weights (speed does not depend on the values): a BERT-base-sized
encoder (12 layers, 12 heads, d_model 768, FFN 3072) at 128 and 512 tokens, and a ViT-B/16-sized
model at 224 px. Times are medians over interleaved repeats after warm-up. --tiny: the same rows with two layers of
width 64 (benchmarks/gpu's dry run; no figure to quote). --json: the rows and the traces' sizes, also to that file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import interleaved_medians, print_table, run_each_allocator

import tformer_core as tc
from tformer_app.memory import retain_freed_memory

GOAL = 1.15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--allocator", choices=["retain", "default"], default=None)
    parser.add_argument("--tiny", action="store_true", help="two layers of width 64 (a dry run)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    if run_each_allocator(__file__):
        return
    retained = retain_freed_memory() if args.allocator == "retain" else False
    device = torch.device(args.device) if args.device else tc.default_device()
    torch.manual_seed(0)

    full = {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072}
    size = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 128} if args.tiny else full
    bert = tc.Encoder(
        tc.EncoderConfig(vocab_size=30522, max_positions=512, n_token_types=2, ln_eps=1e-12, **size)
    ).place(device, args.dtype)
    vit = tc.ViT(tc.ViTConfig(image_size=224, patch_size=16, n_classes=1000, **size)).place(device, args.dtype)
    bert_name, vit_name = (
        ("BERT-sized, tiny", "ViT-sized, tiny") if args.tiny else ("BERT-base-sized encoder", "ViT-B/16-sized")
    )

    def plain(model, *inputs):
        with torch.inference_mode():
            return model(*inputs)

    rows, sizes = [], []
    for n in (128, 512):
        ids = torch.randint(0, 30522, (1, n), device=device)
        id_list = ids[0].tolist()
        traced = lambda id_list=id_list: bert.trace(id_list)  # noqa: E731
        rows.append(
            (
                bert_name,
                f"{n} tokens",
                *interleaved_medians(traced, lambda ids=ids: plain(bert, ids), args.repeats, device),
            )
        )
        sizes.append(traced().nbytes / 2**20)
    batch = torch.randn(1, 3, 224, 224).to(device=device, dtype=vit.dtype)
    image = batch[0]  # on the device for both
    rows.append(
        (
            vit_name,
            "224 px, 197 tokens",
            *interleaved_medians(lambda: vit.trace(image), lambda: plain(vit, batch), args.repeats, device),
        )
    )
    sizes.append(vit.trace(image).nbytes / 2**20)

    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    allocator = "glibc keeps freed memory (as the app runs)" if retained else "allocator defaults"
    print(
        f"Capture overhead on {device.type.upper()} ({args.dtype}, torch {torch.__version__}, CPU threads {threads}),"
    )
    print(f"{allocator}; median of {args.repeats} interleaved runs.")
    print(f"Baseline: the same model's plain forward pass. Goal: ratio <= {GOAL}x.\n")
    print_table(rows, "traced forward", "plain forward", GOAL)
    where = "on the GPU" if device.type == "cuda" else "in memory"
    print(
        f"\nMemory a trace holds ({where}, {args.dtype}): "
        + ", ".join(f"{r[1]}: {mb:.0f} MB" for r, mb in zip(rows, sizes))
    )
    if args.json:
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
        report = {
            "device": where,
            "torch": torch.__version__,
            "dtype": args.dtype,
            "allocator": allocator,
            "repeats": args.repeats,
            "rows": [
                {
                    "model": r[0],
                    "input": r[1],
                    "ours_s": r[2],
                    "theirs_s": r[3],
                    "ratio": r[2] / r[3],
                    "goal": GOAL,
                    "trace_mb": mb,
                }
                for r, mb in zip(rows, sizes)
            ],
        }
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
