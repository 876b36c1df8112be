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
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tformer_core.bundled.loading import config_to_dict, preprocessing_from_meta
from tformer_core.bundled.tokenizer import WordTokenizer
from tformer_core.models.seq2seq import EncoderDecoder, Seq2SeqConfig
from tformer_core.models.vit import ViT, ViTConfig

from . import data as td
from .detr_tiny import train_detr
from .early_attention import TRAINERS as EARLY
from .evaluation import evaluate_translator, evaluate_vit, pad_batch
from .mae_tiny import train_mae
from .runs import (
    DEFAULT_OUT,
    Log,
    Recipe,
    RunResult,
    command_line,
    deterministic,
    environment_record,
    optimise,
    write_run,
)

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
VIT_PREPROCESSING = td.SCENE_PREPROCESSING


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
    command = command_line("translator", steps, seed, threads)

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

        final_loss = optimise(model, recipe, loss_of_batch, log, "translator")
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
            "environment": environment_record(threads),
        },
    }
    files = {"source_vocab.txt": td.SOURCE_VOCAB, "target_vocab.txt": td.TARGET_VOCAB}
    return write_run(model, out, meta, files, evaluate_translator if evaluate else None, log)


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
    command = command_line("vit-tiny", steps, seed, threads)
    preprocessing = preprocessing_from_meta(VIT_PREPROCESSING)

    with deterministic(seed, threads):
        start = time.perf_counter()
        model = ViT(VIT_CONFIG)
        stream = torch.Generator().manual_seed(td.TRAIN_STREAM_OFFSET + seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            scenes = td.make_scenes(recipe.batch_size, seed, generator=stream)
            logits = model(preprocessing.normalise(scenes.images))
            return F.cross_entropy(logits, scenes.labels)

        final_loss = optimise(model, recipe, loss_of_batch, log, "vit-tiny")
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
            "environment": environment_record(threads),
            "images_seen": recipe.steps * recipe.batch_size,
        },
    }
    return write_run(model, out, meta, {"labels.txt": td.SHAPE_CLASSES}, evaluate_vit if evaluate else None, log)


# ---- command line ----------------------------------------------------------------------------
TRAINERS = {"translator": train_translator, "vit-tiny": train_vit}


def all_trainers() -> dict[str, Callable[..., RunResult]]:
    """Every bundled model's training run: these two, the models of attention before Transformers, the masked
    autoencoder and the DETR."""
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
