"""Half precision at full size: our traced forward in bfloat16 against transformers' eager forward in bfloat16, same
checkpoint, same input; the logits and every layer's attention weights, their largest difference beside the bound
that tests/core/test_half_precision.py holds the tiny models to (4 roundings of the dtype at the reference's
largest magnitude).

    python benchmarks/half_precision.py [--device cuda] [--dtype bfloat16] [--folder DIR] [--tiny] [--json PATH]

Models: the decoders of vs_transformers.py's large preset, from the same checkpoints (--folder shares them):
the Llama-style model (16 layers, d_model 2048, 32 query and 8 key/value heads) at 512 tokens and SmolLM2-135M's
architecture (30 layers, d_model 576, 9 and 3 heads, tied embeddings) at 256 tokens. Random weights, with the
queries and keys scaled so that attention is as sharp as a trained model's (vs_transformers.SCORE_SPREAD; the
table gives the mean of each attention row's largest weight): where a last bit apart in the scores shows most.
SmolLM2's own weights (a 98 MB GGUF file) are not used: they do not travel to a GPU machine with the rest of the
check (benchmarks/gpu/README.md). --tiny: two layers of width 64 or 96 (a dry run's; no figure to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from vs_transformers import TINY, Sizes, checkpoint, pair, title

import tformer_core as tc
from tests.core.test_half_precision import rounding_bound


def largest_difference(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(max |ours - theirs|, the bound for it), computed where the tensors are."""
    reference = theirs.detach().float()
    diff = float((ours.float() - reference).abs().max())
    return diff, rounding_bound(np.array([float(reference.abs().max())]), dtype)


def compare(name: str, n: int, sizes: Sizes, folder: Path, device: torch.device, dtype: str) -> dict:
    ours, theirs = pair(checkpoint(name, folder, sizes, device), name, device, dtype)
    torch_dtype = ours.dtype
    high = theirs.config.vocab_size
    ids = torch.randint(min(100, high // 2), high, (1, n), generator=torch.Generator().manual_seed(n))
    with torch.inference_mode():
        trace = ours.trace(ids[0].tolist())
        out = theirs(ids.to(device), output_attentions=True)
    logits, logits_bound = largest_difference(trace.tensor("head.logits"), out.logits[0], torch_dtype)
    worst = (0.0, 1.0, -1)  # (difference, its bound, layer) of the layer whose attention is furthest off its bound
    sharpness = []
    for layer, weights in enumerate(out.attentions):
        diff, bound = largest_difference(trace.block_tensor("weights", layer), weights[0], torch_dtype)
        if diff / bound >= worst[0] / worst[1]:
            worst = (diff, bound, layer)
        sharpness.append(float(weights[0].float().amax(-1).mean()))
    return {
        "model": title(name, sizes),
        "tokens": n,
        "dtype": dtype,
        "logits_max_diff": logits,
        "logits_bound": logits_bound,
        "attention_max_diff": worst[0],
        "attention_bound": worst[1],
        "attention_worst_layer": worst[2],
        "layers": len(out.attentions),
        "attention_row_max_mean": float(np.mean(sharpness)),
        "within": logits <= logits_bound and worst[0] <= worst[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when there is one)")
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 or float16: both sides load in it")
    parser.add_argument("--tiny", action="store_true", help="two layers of width 64 or 96 (a dry run)")
    parser.add_argument("--folder", type=Path, help="the checkpoints' folder (vs_transformers.py --folder)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    device = torch.device(args.device) if args.device else tc.default_device()
    sizes = TINY if args.tiny else Sizes()
    with tempfile.TemporaryDirectory(prefix="tformer-half-") as temporary:
        folder = args.folder or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TFORMER_MAX_PARAMS", "2e9")  # the Llama-style model has about 0.9 billion
        # a research pass, not a shared server's: the Llama-style model at 512 tokens takes more than the 672 MB default
        os.environ.setdefault("TFORMER_PASS_MB", "65536")
        rows = [
            compare("llama", sizes.llama_tokens, sizes, folder, device, args.dtype),
            compare("smollm2", sizes.smollm2_tokens, sizes, folder, device, args.dtype),
        ]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"Ours vs transformers {T.__version__}, both in {args.dtype}, on {where} (torch {torch.__version__}):\n")
    print("| model | tokens | logits max diff (bound) | attention max diff (bound), layer | row max (mean) | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['tokens']} | {r['logits_max_diff']:.3g} ({r['logits_bound']:.3g}) "
            f"| {r['attention_max_diff']:.3g} ({r['attention_bound']:.3g}), {r['attention_worst_layer']} "
            f"| {r['attention_row_max_mean']:.2f} | {'within' if r['within'] else 'OVER'} |"
        )
    if args.json:
        report = {"device": where, "torch": torch.__version__, "transformers": T.__version__, "rows": rows}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
