"""Why this weight: one cell's softmax input split into its sources (tformer_core.score_sources), against the plain
trace of the same input, on the bundled SmolLM2 (30 layers, RoPE, grouped-query attention) at 16 tokens.

    TFORMER_CACHE_DIR=... python benchmarks/score_sources.py [--repeats 7] [--threads 2]

Rows: the split of one cell from a trace already held (what a click on a heatmap cell costs when the trace is
cached), for a cell of layer 1, 15 and 29 (the later the layer, the more sources: 1 + 10 per earlier layer), and
the whole request the app runs (a pass keeping what the split reads, then the split). Baseline: the plain trace of
the same sentence (`model.trace(text)`, every default activation), measured interleaved in the same run. Goal (issue
38): one cell <= 0.5 s on 2 CPU cores; the ratio column reads against the trace, not against the goal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import interleaved_medians, print_table

import tformer_core as tc
from tformer_core.score_sources import SOURCES_KEPT, Cell, score_sources

TEXT = "The quick brown fox jumps over the lazy dog because then it was very hungry and"  # 16 tokens in SmolLM2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="torch's CPU threads (the issue's 2 cores)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = tc.load_model("smollm2", device="cpu")
    held = model.trace(TEXT, keep=SOURCES_KEPT)
    n = len(held.tokens)
    rows = []
    for layer in (1, 15, 29):
        cell = Cell("decoder", layer, 8, n - 1, 0)
        ours, base = interleaved_medians(
            lambda cell=cell: score_sources(model, held, cell), lambda: model.trace(TEXT), args.repeats, model.device
        )
        rows.append((f"smollm2, layer {layer}", f"{n} tokens, held trace", ours, base))
    cell = Cell("decoder", 29, 8, n - 1, 0)
    ours, base = interleaved_medians(
        lambda: score_sources(model, model.trace(TEXT, keep=SOURCES_KEPT), cell),
        lambda: model.trace(TEXT),
        args.repeats,
        model.device,
    )
    rows.append(("smollm2, layer 29", f"{n} tokens, pass + split", ours, base))
    print(f"one cell split into sources vs the plain trace; {args.threads} threads, median of {args.repeats}")
    print_table(rows, "split", "plain trace", goal=float("inf"))
    check = score_sources(model, held, cell)
    print(f"\nlayer 29: {len(check.query_sources)} x {len(check.key_sources)} terms; |sum - score| = {check.error:.1e}")


if __name__ == "__main__":
    main()
