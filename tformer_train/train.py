"""Train the bundled didactic models, reproducibly, on generated data.

    python -m tformer_train.train translator            # -> ./trained/translator/
    python -m tformer_train.train vit-tiny              # -> ./trained/vit-tiny/
    python -m tformer_train.train mae-tiny              # -> ./trained/mae-tiny/ (also detr-tiny)
    python -m tformer_train.train vit-tiny --steps 50 --seed 1 --out /tmp/vit

The shipped models in assets/ are never overwritten by default: to replace one deliberately, train
into its folder (`--out assets/vit-tiny`) and commit the new files with their model card.

Each run seeds python, numpy and torch, turns on torch's deterministic algorithms and fixes
the number of CPU threads, so the same command on the same machine writes byte-identical
weights (the SHA-256 of model.safetensors is printed and recorded in config.json). A
different thread count or CPU may change the last bits of floating-point sums, hence of the
weights. With the default steps a run takes a few minutes on 2 CPU cores.

The folder written holds config.json, model.safetensors, the vocabulary or label files and
MODEL_CARD.md, whose figures (held-out accuracy, attention measurements, training time) are
the ones this run measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from tformer_core.bundled.loading import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    config_to_dict,
    file_sha256,
    load_from_dir,
    preprocessing_from_meta,
    write_lines,
)
from tformer_core.bundled.tokenizer import WordTokenizer
from tformer_core.models.seq2seq import EncoderDecoder, Seq2SeqConfig
from tformer_core.models.vit import ViT, ViTConfig

from . import data as td
from .cards import write_card
from .evaluation import evaluate_translator, evaluate_vit, pad_batch

# Where a run writes by default (relative to the working directory): never the tracked assets/.
DEFAULT_OUT = Path("trained")

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Optimisation settings: AdamW, linear warm-up then cosine decay to `final_lr_ratio` * lr."""

    steps: int
    batch_size: int
    lr: float
    warmup: int
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    final_lr_ratio: float = 0.05
    grad_clip: float = 1.0

    def with_steps(self, steps: int | None) -> Recipe:
        """This recipe, or the same with another number of steps (a trainer's `steps` argument, None: as it is)."""
        return self if steps is None else replace(self, steps=steps)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.final_lr_ratio + (1 - self.final_lr_ratio) * cosine)


TRANSLATOR_CONFIG = Seq2SeqConfig(
    src_vocab_size=len(td.SOURCE_VOCAB),
    tgt_vocab_size=len(td.TARGET_VOCAB),
    max_positions=32,
    n_encoder_layers=2,
    n_decoder_layers=2,
    d_model=128,
    n_heads=4,
    d_ff=256,
    positional="sinusoidal",
    activation="relu",
    norm="post",
    embed_scale=True,
    tie_output=True,
)
TRANSLATOR_META = {  # config.json of the translator, without the run's own record
    "family": "encoder-decoder",
    "name": "translator",
    "config": config_to_dict(TRANSLATOR_CONFIG),
    "special_tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 3},
    "source_vocab": "source_vocab.txt",
    "target_vocab": "target_vocab.txt",
    "source_language": "English (toy, SVO, adjective before noun, prepositions)",
    "target_language": "Tarish (invented, SOV, noun before adjectives, postpositions, case particles)",
    "max_target_length": td.MAX_TARGET_WORDS + 3,  # a margin for a wrong prediction to show itself
}
TRANSLATOR_RECIPE = Recipe(steps=3000, batch_size=64, lr=1e-3, warmup=300)
TRANSLATOR_UNK_RATE = 0.03

VIT_CONFIG = ViTConfig(
    image_size=td.IMAGE_SIZE,
    patch_size=4,
    n_channels=3,
    n_layers=4,
    n_classes=len(td.SHAPE_CLASSES),
    d_model=64,
    n_heads=4,
    d_ff=128,
    norm="pre",
    activation="gelu",
)
# 3200 steps of 128 images: about 12 minutes on 2 CPU cores (each step ~0.23 s), inside the 15-minute budget.
VIT_RECIPE = Recipe(steps=3200, batch_size=128, lr=1.5e-3, warmup=250, weight_decay=0.05, betas=(0.9, 0.999))
# Channel mean / std of the generated scenes (measured on 20 000 of them, rounded): the
# normalisation the app applies before the model sees an image.
VIT_PREPROCESSING = {
    "image_size": [td.IMAGE_SIZE, td.IMAGE_SIZE],
    "value_range": [0.0, 1.0],
    "mean": [0.5, 0.5, 0.5],
    "std": [0.3, 0.3, 0.3],
    "formula": "pixel = (value / 255 - mean) / std, per channel, RGB, (3, H, W)",
}


@dataclass(frozen=True)
class RunResult:
    """What a training run wrote and measured."""

    name: str
    out: Path
    weights_sha256: str
    train_seconds: float
    metrics: dict


@contextlib.contextmanager
def deterministic(seed: int, threads: int) -> Iterator[None]:
    """Seed everything, fix the thread count, force deterministic kernels; restore on exit."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    previous_threads = torch.get_num_threads()
    previous_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_det)


def _optimise(
    model: torch.nn.Module, recipe: Recipe, loss_of_batch: Callable[[int], torch.Tensor], log: Log, label: str
) -> float:
    """Run `recipe.steps` AdamW steps; loss_of_batch(step) -> scalar loss. Returns the last smoothed loss."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        # Norm gains, biases, embeddings and the class token are not weight-decayed (as in ViT / BERT).
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=recipe.betas,
        foreach=False,
    )
    model.train()
    smooth, start = float("nan"), time.perf_counter()
    every = max(1, recipe.steps // 20)
    for step in range(recipe.steps):
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step)
        loss = loss_of_batch(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        value = float(loss.detach())
        smooth = value if math.isnan(smooth) else 0.95 * smooth + 0.05 * value
        if (step + 1) % every == 0 or step + 1 == recipe.steps:
            log(f"[{label}] step {step + 1}/{recipe.steps}  loss {smooth:.4f}  {time.perf_counter() - start:.0f}s")
    model.eval()
    return smooth


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with a tied matrix stored once, under its first name in module order.

    Not safetensors' save_model: it records the dropped names in metadata built from a set, so
    the file's bytes (and hash) changed from one save to the next with the same weights.
    safetensors' load_model restores the tie from the model itself.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if key not in seen:
            seen.add(key)
            out[name] = tensor.detach().contiguous()
    return out


def _save(model: torch.nn.Module, out: Path, meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    save_file(unique_state_dict(model), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    sha = file_sha256(out / WEIGHTS_FILE)
    meta = {**meta, "weights_sha256": sha}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return sha


def _environment(threads: int) -> dict:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "threads": threads,
    }


# ---- translator --------------------------------------------------------------------------------
def train_translator(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the toy SVO -> SOV translator and write it to `out` (default ./trained/translator)."""
    recipe = TRANSLATOR_RECIPE.with_steps(steps)
    out = Path(out) if out is not None else DEFAULT_OUT / "translator"
    src_tok = WordTokenizer(td.SOURCE_VOCAB)
    tgt_tok = WordTokenizer(td.TARGET_VOCAB, prepend_bos=True)
    command = _command("translator", steps, seed, threads)

    with deterministic(seed, threads):
        start = time.perf_counter()
        model = EncoderDecoder(TRANSLATOR_CONFIG)
        with torch.no_grad():
            # Transformer-paper scale: the shared embedding / output matrix at std d^-1/2, so the
            # embeddings times sqrt(d) have unit size like the sinusoids they are added to.
            for emb in (model.encoder.embed.tok, model.decoder.embed.tok):
                emb.weight.normal_(0.0, TRANSLATOR_CONFIG.d_model**-0.5)
        rng = np.random.default_rng(seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            pairs = td.sample_pairs(recipe.batch_size, seed, "train", TRANSLATOR_UNK_RATE, rng=rng)
            src, src_mask = pad_batch([src_tok.encode(p.source_text) for p in pairs], src_tok.pad_id)
            # Teacher forcing: input <bos> y1..yn, label y1..yn <eos>; padding labels are ignored.
            tgt_ids = [tgt_tok.encode(p.target_text) + [tgt_tok.eos_id] for p in pairs]
            full, full_mask = pad_batch(tgt_ids, tgt_tok.pad_id)
            tgt_in, labels = full[:, :-1], full[:, 1:].masked_fill(full_mask[:, 1:] == 0, -100)
            logits = model(src, tgt_in, src_mask)  # (B, T, V)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)

        final_loss = _optimise(model, recipe, loss_of_batch, log, "translator")
        train_seconds = time.perf_counter() - start

    meta = {
        **TRANSLATOR_META,
        "training": {
            "command": command,
            "seed": seed,
            "recipe": asdict(recipe),
            "unk_rate": TRANSLATOR_UNK_RATE,
            "final_train_loss": round(final_loss, 5),
            "train_seconds": round(train_seconds, 1),
            "environment": _environment(threads),
        },
    }
    files = {"source_vocab.txt": td.SOURCE_VOCAB, "target_vocab.txt": td.TARGET_VOCAB}
    return _write(model, out, meta, files, evaluate_translator if evaluate else None, log)


# ---- vit-tiny --------------------------------------------------------------------------------
def train_vit(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the tiny ViT on generated shape scenes and write it to `out` (default ./trained/vit-tiny)."""
    recipe = VIT_RECIPE.with_steps(steps)
    out = Path(out) if out is not None else DEFAULT_OUT / "vit-tiny"
    command = _command("vit-tiny", steps, seed, threads)
    preprocessing = preprocessing_from_meta(VIT_PREPROCESSING)

    with deterministic(seed, threads):
        start = time.perf_counter()
        model = ViT(VIT_CONFIG)
        stream = torch.Generator().manual_seed(td.TRAIN_STREAM_OFFSET + seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            scenes = td.make_scenes(recipe.batch_size, seed, generator=stream)
            logits = model(preprocessing.normalise(scenes.images))
            return F.cross_entropy(logits, scenes.labels)

        final_loss = _optimise(model, recipe, loss_of_batch, log, "vit-tiny")
        train_seconds = time.perf_counter() - start

    meta = {
        "family": "vit",
        "name": "vit-tiny",
        "config": config_to_dict(VIT_CONFIG),
        "labels": "labels.txt",
        "preprocessing": VIT_PREPROCESSING,
        "training": {
            "command": command,
            "seed": seed,
            "recipe": asdict(recipe),
            "final_train_loss": round(final_loss, 5),
            "train_seconds": round(train_seconds, 1),
            "environment": _environment(threads),
            "images_seen": recipe.steps * recipe.batch_size,
        },
    }
    return _write(model, out, meta, {"labels.txt": td.SHAPE_CLASSES}, evaluate_vit if evaluate else None, log)


def _write(
    model: torch.nn.Module,
    out: Path,
    meta: dict,
    files: Mapping[str, Sequence[str]],
    evaluate: Callable[[Any, Log], dict] | None,
    log: Log,
) -> RunResult:
    """Write the trained model (weights, config.json, vocabulary / label files) into `out`; with `evaluate`,
    measure the written model as it loads and record the figures in config.json and the model card."""
    name, seconds = meta["name"], meta["training"]["train_seconds"]
    out.mkdir(parents=True, exist_ok=True)
    for file_name, lines in files.items():
        write_lines(out / file_name, lines)
    sha = _save(model, out, meta)
    log(f"[{name}] trained in {seconds:.1f}s; weights sha256 {sha}")
    metrics: dict = {}
    if evaluate is not None:
        metrics = evaluate(load_from_dir(out, "cpu"), log)
        _save(model, out, {**meta, "evaluation": metrics})
        write_card(out)
    return RunResult(name, out, sha, seconds, metrics)


def _command(name: str, steps: int | None, seed: int, threads: int) -> str:
    parts = ["python -m tformer_train.train", name]
    if steps is not None:
        parts += ["--steps", str(steps)]
    if seed != 0:
        parts += ["--seed", str(seed)]
    if threads != 2:
        parts += ["--threads", str(threads)]
    return " ".join(parts)


# ---- command line ----------------------------------------------------------------------------
TRAINERS = {"translator": train_translator, "vit-tiny": train_vit}


def all_trainers() -> dict[str, Callable[..., RunResult]]:
    """Every bundled model's training run: these two, the models of attention before Transformers, the masked
    autoencoder and the DETR."""
    # These modules import this one: not at the top.
    from .detr_tiny import train_detr
    from .early_attention import TRAINERS as EARLY
    from .mae_tiny import train_mae

    return {**TRAINERS, **EARLY, "mae-tiny": train_mae, "detr-tiny": train_detr}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tformer_train.train", description=__doc__.split("\n\n")[0])
    trainers = all_trainers()
    parser.add_argument("name", choices=sorted(trainers), help="which bundled model to train")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data (default 0)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default ./trained/<name>; assets/<name> replaces the shipped model)",
    )
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2; part of reproducibility)")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation and the model card")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    result = trainers[args.name](
        steps=args.steps, seed=args.seed, out=args.out, threads=args.threads, evaluate=not args.no_eval
    )
    print(f"wrote {result.out} (weights sha256 {result.weights_sha256}, {result.train_seconds:.1f}s training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
