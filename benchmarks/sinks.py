"""Attention sinks and massive activations on SmolLM2 at 16 tokens, beside the plain trace they are read from.

    python benchmarks/sinks.py [--device cpu] [--repeats 20] [--threads N]

Rows, each against the plain trace (`model.trace(ids)`, the pass Text attention caches), timed interleaved with it:
- sink share: `sinks.sink_share` of that trace (30 layers x 9 heads, the first token), from the stored weights;
- sink share, compact trace: the same from the trace the app caches (`trace.compact()`: weights recomputed from Q
  and K);
- massive activations: `sinks.massive_activations` (every layer's median and top 3 of the residual stream);
- one knockout: `sinks.knock_out_activation` of layer 12, position 0, dimension 507 (two passes: before, after);
- one knockout, held trace: the same with the compact trace given as `held` (one pass: the page's cached trace is
  the one before, as Text attention's button runs it);
- all three together, as Text attention's expander and its button ask them.
Goal: the knockout well under a second (the app's button); the reading of the trace a small fraction of its pass.
Medians of --repeats; the load average before and after is printed (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer_core as tc
from benchmarks.timing import interleaved_medians, print_table
from tformer_core import sinks

PROMPT = "The capital of France is Paris, and the capital of Italy is the city of Rome, which"
GOAL = 5.0  # the knockout is two passes and their reading: at most ~2.5x the plain trace; the readings far less


def run(device: str, repeats: int) -> None:
    model = tc.load_model("smollm2", device=device)
    ids = model.tokenizer.encode(PROMPT)[:16]
    trace = model.trace(ids)
    compact = trace.compact()
    plain = lambda: model.trace(ids)  # noqa: E731 - the baseline, named as the table names it
    cases = {
        "sink share": lambda: sinks.sink_share(trace),
        "sink share, compact trace": lambda: sinks.sink_share(compact),
        "massive activations": lambda: sinks.massive_activations(trace),
        "one knockout (2 passes)": lambda: sinks.knock_out_activation(model, ids, (12, 0, 507)),
        "one knockout, held trace (1 pass)": lambda: sinks.knock_out_activation(model, ids, (12, 0, 507), held=compact),
        "all three": lambda: (
            sinks.sink_share(compact),
            sinks.massive_activations(compact),
            sinks.knock_out_activation(model, ids, (12, 0, 507), held=compact),
        ),
    }
    load_before = os.getloadavg()[0]
    rows = []
    for name, ours in cases.items():
        t_ours, t_base = interleaved_medians(ours, plain, repeats, torch.device(device))
        rows.append((f"SmolLM2: {name}", f"{len(ids)} tokens, {device}", t_ours, t_base))
    print_table(rows, "ours", "plain trace", GOAL)
    print(
        f"\nload average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; torch threads "
        f"{torch.get_num_threads()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args.device, args.repeats)


if __name__ == "__main__":
    main()
