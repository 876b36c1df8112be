"""Head importance for every head in one request: our batched, branched passes vs one pass per head, same run.

    python benchmarks/head_importance.py [--device cpu] [--repeats 3] [--threads N]

Rows: MiniLM (72 heads; the cosine similarity of two sentences' embeddings), DeiT-Tiny (36 heads; the top class of
../shared/images/plane.png, skipped when ../shared/models is absent), SmolLM2 (270 heads; the next token after a
16-token prompt). Ours: `probes.head_importance(probe)` (every head zero-ablated in its own batch row, the rows of
layer l branched at layer l's input, passes bounded by probes.ROW_TOKENS). Baseline: one forward pass per head
under `model.intervene(ablate_heads([head]))`, the probe's own run (so both read the prediction the same way), plus
the clean pass. Both give the same numbers (checked here, and in tests/core/test_probes.py).
Goals (CPU): <= 3 s for MiniLM and DeiT-Tiny, <= 10 s for SmolLM2. Medians of --repeats, interleaved; the load
average before and after is printed (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tformer_core as tc
from tformer_core import probes
from tformer_core.interventions import Head, ablate_heads

SHARED = ROOT.parent / "shared"
DEIT = SHARED / "models" / "deit-tiny-patch16-224"
PLANE = SHARED / "images" / "plane.png"
GOALS = {"MiniLM": 3.0, "DeiT-Tiny": 3.0, "SmolLM2": 10.0}


def one_pass_per_head(probe: probes.Probe) -> tuple[float, dict[str, np.ndarray], int]:
    """The baseline: the clean pass, then one pass per head with that head ablated."""
    clean = float(probe.measure()[0])
    scores = {}
    for stack, (layers, heads) in probe.heads.items():
        scores[stack] = np.array(
            [[probe.measure(ablate_heads([Head(stack, l, h)]))[0] for h in range(heads)] for l in range(layers)]
        )
    return clean, scores, 1 + sum(layers * heads for layers, heads in probe.heads.values())


def build_probes(device: str) -> list[tuple[str, str, probes.Probe]]:
    cases = []
    minilm = tc.load_model("minilm", device=device)
    a, b = "The cat sat on the mat.", "A kitten was sitting on the rug."
    cases.append(("MiniLM", "cos of two sentences", probes.similarity_probe(minilm, a, b)))
    if DEIT.is_dir() and PLANE.is_file():
        from PIL import Image

        deit = tc.load_model(str(DEIT), device=device, model_dirs=[DEIT.parent])
        pixels = deit.preprocessing(Image.open(PLANE))
        cases.append(("DeiT-Tiny", "plane.png, top class", probes.class_probe(deit, pixels)))
    smol = tc.load_model("smollm2", device=device)
    ids = smol.tokenizer.encode("The capital of France is Paris, and the capital of Italy is the city of")[:16]
    cases.append(("SmolLM2", f"{len(ids)} tokens, next token", probes.next_token_probe(smol, ids)))
    return cases


def run(device: str, repeats: int) -> None:
    cases = build_probes(device)
    load_before = os.getloadavg()[0]
    rows = []
    for name, what, probe in cases:
        ours_t, base_t = [], []
        probes.head_importance(probe)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            ours = probes.head_importance(probe)
            ours_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            _, scores, base_passes = one_pass_per_head(probe)
            base_t.append(time.perf_counter() - start)
        for stack in scores:
            np.testing.assert_allclose(ours.scores[stack], scores[stack], rtol=1e-3, atol=1e-5)
        heads = sum(layers * h for layers, h in probe.heads.values())
        rows.append((name, what, heads, statistics.median(ours_t), ours.passes, statistics.median(base_t), base_passes))
    load_after = os.getloadavg()[0]
    print(
        f"\nhead importance, every head zero-ablated; {device}, torch threads {torch.get_num_threads()}, medians of "
        f"{repeats}; load average {load_before:.1f} before, {load_after:.1f} after\n"
    )
    print("| model | input | heads | ours s (passes) | one pass per head s (passes) | ratio | goal | verdict |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, what, heads, ours_s, ours_p, base_s, base_p in rows:
        goal = GOALS[name]
        verdict = "within" if ours_s <= goal else "OVER"
        print(
            f"| {name} | {what} | {heads} | {ours_s:.2f} ({ours_p}) | {base_s:.2f} ({base_p}) | "
            f"{ours_s / base_s:.2f}x | <= {goal:.0f} s | {verdict} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args.device, args.repeats)


if __name__ == "__main__":
    main()
