"""Train the bundled didactic models, reproducibly, on generated data.

    python -m tformer_core.bundled.train translator            # -> assets/translator/
    python -m tformer_core.bundled.train vit-tiny              # -> assets/vit-tiny/
    python -m tformer_core.bundled.train vit-tiny --steps 50 --seed 1 --out /tmp/vit

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from ..models.vit import ViT, ViTConfig
from . import data as td
from .loading import (
    ASSETS_DIR,
    BUNDLED_MODELS,
    CARD_FILE,
    CONFIG_FILE,
    WEIGHTS_FILE,
    WordTokenizer,
    alignment_accuracy,
    class_token_attention,
    classify,
    config_to_dict,
    file_sha256,
    load_from_dir,
    pad_batch,
    translate_batch,
    translation_accuracy,
    write_lines,
)

# Seeds of the evaluation samples written into the model cards. The tests draw other seeds.
EVAL_SEED = 20_240_601
# The training image stream is seeded far from the small seeds evaluation uses, so a training
# batch can never be an evaluation sample drawn with the same number.
TRAIN_STREAM_OFFSET = 2**40

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
TRANSLATOR_RECIPE = Recipe(steps=3000, batch_size=64, lr=1e-3, warmup=300)
TRANSLATOR_UNK_RATE = 0.03
TRANSLATOR_MAX_TARGET = td.MAX_TARGET_WORDS + 3  # a margin for a wrong prediction to show itself

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
VIT_MEAN = (0.5, 0.5, 0.5)
VIT_STD = (0.3, 0.3, 0.3)


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
    decay, no_decay = [], []
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


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once


# ---- translator --------------------------------------------------------------------------------
def train_translator(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the toy SVO -> SOV translator and write it to `out` (default assets/translator)."""
    recipe = TRANSLATOR_RECIPE if steps is None else Recipe(**{**asdict(TRANSLATOR_RECIPE), "steps": steps})
    out = Path(out) if out is not None else ASSETS_DIR / BUNDLED_MODELS["translator"]
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
        "family": "encoder-decoder",
        "name": "translator",
        "config": config_to_dict(TRANSLATOR_CONFIG),
        "special_tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 3},
        "source_vocab": "source_vocab.txt",
        "target_vocab": "target_vocab.txt",
        "source_language": "English (toy, SVO, adjective before noun, prepositions)",
        "target_language": "Tarish (invented, SOV, noun before adjectives, postpositions, case particles)",
        "max_target_length": TRANSLATOR_MAX_TARGET,
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
    out.mkdir(parents=True, exist_ok=True)
    write_lines(out / "source_vocab.txt", td.SOURCE_VOCAB)
    write_lines(out / "target_vocab.txt", td.TARGET_VOCAB)
    sha = _save(model, out, meta)
    log(f"[translator] trained in {train_seconds:.1f}s; weights sha256 {sha}")

    metrics: dict = {}
    if evaluate:
        metrics = evaluate_translator(load_from_dir(out, "cpu"), log)
        meta["evaluation"] = metrics
        _save(model, out, meta)
        (out / CARD_FILE).write_text(translator_card(meta, sha, _n_params(model), out, metrics), encoding="utf-8")
    return RunResult("translator", out, sha, train_seconds, metrics)


def evaluate_translator(model: EncoderDecoder, log: Log = print, n: int = 2000, n_align: int = 300) -> dict:
    """Held-out exact match, cross-attention alignment per head, and sample translations."""
    start = time.perf_counter()
    held_out = td.sample_pairs(n, EVAL_SEED, "held-out")
    accuracy = translation_accuracy(model, held_out)
    align_pairs = held_out[:n_align]
    per_head = alignment_accuracy(model, align_pairs)  # (layers, heads)
    aligned = [(t, a) for p in align_pairs for t, a in enumerate(p.alignment) if a is not None]
    moved = sum(t != a for t, a in aligned) / len(aligned)
    best = np.unravel_index(int(per_head.argmax()), per_head.shape)
    examples = held_out[:6]
    outputs = translate_batch(model, [p.source_text for p in examples])
    unk_example = "the big dog chases a purple cat"
    metrics = {
        "held_out_sentences": n,
        "held_out_unique_sentences": len({p.source_text for p in held_out}),
        "held_out_exact_match": accuracy,
        "alignment_sentences": len(align_pairs),
        "aligned_target_words": len(aligned),
        "share_of_words_that_move": moved,
        "alignment_accuracy_per_head": per_head.round(4).tolist(),
        "best_alignment_head": {"layer": int(best[0]), "head": int(best[1]), "accuracy": float(per_head[best])},
        "examples": [
            {"source": p.source_text, "reference": p.target_text, "model": " ".join(o)}
            for p, o in zip(examples, outputs)
        ],
        "unknown_word_example": {"source": unk_example, "model": " ".join(translate_batch(model, [unk_example])[0])},
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"[translator] held-out exact match {accuracy:.4f} on {n} sentences; "
        f"best alignment head L{best[0]}H{best[1]} {per_head[best]:.3f}; {moved:.1%} of words move"
    )
    return metrics


# ---- vit-tiny --------------------------------------------------------------------------------
def train_vit(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the tiny ViT on generated shape scenes and write it to `out` (default assets/vit-tiny)."""
    recipe = VIT_RECIPE if steps is None else Recipe(**{**asdict(VIT_RECIPE), "steps": steps})
    out = Path(out) if out is not None else ASSETS_DIR / BUNDLED_MODELS["vit-tiny"]
    command = _command("vit-tiny", steps, seed, threads)
    mean = torch.tensor(VIT_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(VIT_STD).view(1, 3, 1, 1)

    with deterministic(seed, threads):
        start = time.perf_counter()
        model = ViT(VIT_CONFIG)
        stream = torch.Generator().manual_seed(TRAIN_STREAM_OFFSET + seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            scenes = td.make_scenes(recipe.batch_size, seed, generator=stream)
            logits = model((scenes.images - mean) / std)
            return F.cross_entropy(logits, scenes.labels)

        final_loss = _optimise(model, recipe, loss_of_batch, log, "vit-tiny")
        train_seconds = time.perf_counter() - start

    meta = {
        "family": "vit",
        "name": "vit-tiny",
        "config": config_to_dict(VIT_CONFIG),
        "labels": "labels.txt",
        "preprocessing": {
            "image_size": [td.IMAGE_SIZE, td.IMAGE_SIZE],
            "value_range": [0.0, 1.0],
            "mean": list(VIT_MEAN),
            "std": list(VIT_STD),
            "formula": "pixel = (value / 255 - mean) / std, per channel, RGB, (3, H, W)",
        },
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
    out.mkdir(parents=True, exist_ok=True)
    write_lines(out / "labels.txt", td.SHAPE_CLASSES)
    sha = _save(model, out, meta)
    log(f"[vit-tiny] trained in {train_seconds:.1f}s; weights sha256 {sha}")

    metrics: dict = {}
    if evaluate:
        metrics = evaluate_vit(load_from_dir(out, "cpu"), log)
        meta["evaluation"] = metrics
        _save(model, out, meta)
        (out / CARD_FILE).write_text(vit_card(meta, sha, _n_params(model), out, metrics), encoding="utf-8")
    return RunResult("vit-tiny", out, sha, train_seconds, metrics)


def foreground_figures(model: ViT, scenes: td.Scenes, layer: int = -1) -> dict:
    """Class-token attention on the shape vs the shape's share of the patches, per image then averaged.

    A patch is foreground when any of its pixels is covered by the shape (the generous
    definition: it makes the share larger and the test harder); figures for patches at least
    half covered are given too. Mass: the class token's attention (mean over heads, `layer`) on
    those patches, as a fraction of its whole row (its attention on itself counts against it).
    """
    att = class_token_attention(model, scenes.images, layer)  # (B, N)
    cov = td.patch_coverage(scenes.coverage, model.config.patch_size)  # (B, N)
    figures = {}
    for key, fg in (("any_pixel", cov > 0), ("half_covered", cov >= 0.5)):
        fg = fg.float()
        share = fg.mean(1)  # (B,)
        mass = (att * fg).sum(1)  # (B,)
        figures[key] = {
            "foreground_share": float(share.mean()),
            "class_token_mass": float(mass.mean()),
            "ratio_of_means": float(mass.mean() / share.mean()),
            "images_with_mass_above_share": float((mass > share).float().mean()),
        }
    figures["class_token_mass_on_patches"] = float(att.sum(1).mean())  # the rest is on the class token itself
    return figures


def evaluate_vit(model: ViT, log: Log = print, n: int = 4000) -> dict:
    start = time.perf_counter()
    scenes = td.make_scenes(n, EVAL_SEED)
    preds = classify(model, scenes.images)
    accuracy = float((preds == scenes.labels).float().mean())
    per_class = {
        name: float((preds[scenes.labels == c] == c).float().mean()) for c, name in enumerate(td.SHAPE_CLASSES)
    }
    last = foreground_figures(model, scenes, -1)
    per_layer = [
        foreground_figures(model, scenes, layer)["any_pixel"]["ratio_of_means"]
        for layer in range(model.config.n_layers)
    ]
    metrics = {
        "held_out_images": n,
        "held_out_accuracy": accuracy,
        "per_class_accuracy": per_class,
        "last_layer_attention": last,
        "foreground_ratio_per_layer": per_layer,
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    a = last["any_pixel"]
    log(
        f"[vit-tiny] held-out accuracy {accuracy:.4f} on {n} images; last-layer class-token mass on foreground "
        f"{a['class_token_mass']:.3f} vs foreground share {a['foreground_share']:.3f} (x{a['ratio_of_means']:.2f})"
    )
    return metrics


# ---- model cards -----------------------------------------------------------------------------
def _command(name: str, steps: int | None, seed: int, threads: int) -> str:
    parts = ["python -m tformer_core.bundled.train", name]
    if steps is not None:
        parts += ["--steps", str(steps)]
    if seed != 0:
        parts += ["--seed", str(seed)]
    if threads != 2:
        parts += ["--threads", str(threads)]
    return " ".join(parts)


def _size_line(n_params: int, out: Path) -> str:
    size = (out / WEIGHTS_FILE).stat().st_size
    return f"{n_params:,} parameters; `{WEIGHTS_FILE}` is {size:,} bytes ({size / 2**20:.2f} MiB, float32)"


def _env_line(meta: dict) -> str:
    t = meta["training"]
    e = t["environment"]
    return (
        f"{t['train_seconds']:.0f} s wall time ({t['train_seconds'] / 60:.1f} min) on {e['threads']} CPU threads "
        f"({e['machine']}, torch {e['torch']}, Python {e['python']}), measured by the training script"
    )


def translator_card(meta: dict, sha: str, n_params: int, out: Path, m: dict) -> str:
    c, t = meta["config"], meta["training"]
    r = t["recipe"]
    best = m["best_alignment_head"]
    heads = "\n".join(
        f"| {layer} | " + " | ".join(f"{v:.1%}" for v in row) + " |"
        for layer, row in enumerate(m["alignment_accuracy_per_head"])
    )
    examples = "\n".join(f"| {e['source']} | {e['reference']} | {e['model']} |" for e in m["examples"])
    head_cols = " | ".join(f"head {h}" for h in range(c["n_heads"]))
    return f"""# translator: toy English -> Tarish, an encoder-decoder trained by this project

## Task
Translate sentences of a small English-like language (SVO, adjective before noun, prepositions)
into Tarish, an invented language with another word order: subject-object-verb, the noun first
then its adjectives in mirrored order then the determiner, postpositions, the place phrase
before the object, the adverb just before the verb, and two case particles with no source word
(`ga` after the subject, `wo` after the object). Each source word has one translation, so every
target word (but the particles) has exactly one source word, and most of them sit at another
index than their source word: {m["share_of_words_that_move"]:.0%} of aligned target words of held-out
sentences do. Cross-attention has to move across the sentence, which is what the app shows.

| English (source) | Tarish (reference) | model output |
|---|---|---|
{examples}

Unknown words are kept visible: the tokenizer maps them to `<unk>` and the model, trained with
{t["unk_rate"]:.0%} of nouns and adjectives replaced by `<unk>` on both sides, puts `<unk>` where the
word's translation belongs: "{m["unknown_word_example"]["source"]}" -> "{m["unknown_word_example"]["model"]}".

## Data
Generated by `tformer_core/toy_data.py` (no download): a grammar of determiners (5, plus "an"),
adjectives (12, 0-2 per noun phrase), nouns (20), transitive (12) and intransitive (6) verbs,
adverbs (6) and prepositional phrases (5 prepositions); 3 to 15 source words, 4 to 17 target
words. Source vocabulary {c["src_vocab_size"]} words, target vocabulary {c["tgt_vocab_size"]}, both with
`<pad>` `<bos>` `<eos>` `<unk>` at ids 0-3 (`source_vocab.txt`, `target_vocab.txt`).
Held-out split by sentence: a source sentence is held out when a BLAKE2b hash of its text falls in
{td.HELD_OUT_PERCENT} of 100 buckets (`toy_data.is_held_out`); training draws reject those sentences, so
no held-out sentence is ever trained on. Training draws fresh sentences at every step
({r["steps"]} steps x {r["batch_size"]} sentences).

## Model
`EncoderDecoder` as in the original Transformer: post-norm, ReLU, sinusoidal positions (base
{c["pe_base"]:g}), embeddings x sqrt(d_model), output layer tied to the target embedding.
{c["n_encoder_layers"]} encoder + {c["n_decoder_layers"]} decoder layers, d_model {c["d_model"]}, {c["n_heads"]} heads,
d_ff {c["d_ff"]}, at most {c["max_positions"]} positions. Size: {_size_line(n_params, out)}.
Greedy decoding (`tformer_core.bundled.translate`).

## Training
Command: `{t["command"]}` (seed {t["seed"]}).
AdamW (betas {tuple(r["betas"])}), learning rate {r["lr"]:g} with {r["warmup"]} warm-up steps and cosine decay
to {r["final_lr_ratio"]:g} x, gradient clipping {r["grad_clip"]:g}, cross-entropy with teacher forcing; final
training loss {t["final_train_loss"]:.4f}. Training time: {_env_line(meta)}.
The run is deterministic (seeded python / numpy / torch, deterministic algorithms, fixed thread
count): the same command on the same machine writes the same weights,
SHA-256 `{sha}`.

## Held-out accuracy
Exact-match sentence accuracy of greedy translation on {m["held_out_sentences"]} held-out sentences
({m["held_out_unique_sentences"]} distinct, none seen in training, seed {m["eval_seed"]}):
**{m["held_out_exact_match"]:.2%}**.

## Attention property: cross-attention aligns words across the reordering
For each decoder position that predicts an aligned target word, the argmax of the cross-attention
row over the source words, compared with the gold source word ({m["aligned_target_words"]} target
words of {m["alignment_sentences"]} held-out sentences, teacher forcing). Row t of the cross-attention
is the position whose input is target word t-1 (row 0: `<bos>`) and which predicts target word t.

| decoder layer | {head_cols} |
|---|{"---|" * c["n_heads"]}
{heads}

Best head: layer {best["layer"]}, head {best["head"]}: {best["accuracy"]:.1%} of target words attend most to their
source word, although {m["share_of_words_that_move"]:.0%} of them are at another index than that word.
"""


def vit_card(meta: dict, sha: str, n_params: int, out: Path, m: dict) -> str:
    c, t, p = meta["config"], meta["training"], meta["preprocessing"]
    r = t["recipe"]
    last = m["last_layer_attention"]
    a, h = last["any_pixel"], last["half_covered"]
    per_class = ", ".join(f"{k} {v:.1%}" for k, v in m["per_class_accuracy"].items())
    per_layer = ", ".join(f"layer {i}: x{v:.2f}" for i, v in enumerate(m["foreground_ratio_per_layer"]))
    return f"""# vit-tiny: a Vision Transformer trained by this project on generated shape scenes

## Task
Name the shape in a 32 x 32 RGB image: {", ".join(td.SHAPE_CLASSES)} (`labels.txt`, in class-index
order). One shape per image, at a random position, half-size 5 to 10 pixels, in a random colour at
least 0.45 (RGB distance) from the background colour; the background has its own colour gradient,
stripes at a random angle and frequency, and pixel noise, so the class can only be read from the shape.

## Data
Generated by `tformer_core.toy_data.make_scenes` (no download), with the exact (anti-aliased)
coverage of every pixel by the shape, used to measure attention on the foreground. Training draws
fresh images at every step ({r["steps"]} steps x {r["batch_size"]} = {t["images_seen"]:,} images from a stream seeded
{TRAIN_STREAM_OFFSET} + seed); evaluation images come from other seeds and were never trained on.

## Model
`ViT`: pre-norm, exact GELU, class token, learned position embeddings, patch {c["patch_size"]} ({c["image_size"]}/{c["patch_size"]} =
{c["image_size"] // c["patch_size"]} x {c["image_size"] // c["patch_size"]} = {(c["image_size"] // c["patch_size"]) ** 2} patches), {c["n_layers"]} layers, d_model {c["d_model"]}, {c["n_heads"]} heads, d_ff {c["d_ff"]}.
Size: {_size_line(n_params, out)}.
Preprocessing (`config.json` -> `preprocessing`, `tformer_core.bundled.prepare_image`): RGB values in
[0, 1], then (x - mean) / std per channel with mean {tuple(p["mean"])}, std {tuple(p["std"])}.

## Training
Command: `{t["command"]}` (seed {t["seed"]}).
AdamW (betas {tuple(r["betas"])}, weight decay {r["weight_decay"]:g} on matrices), learning rate {r["lr"]:g} with {r["warmup"]}
warm-up steps and cosine decay to {r["final_lr_ratio"]:g} x, gradient clipping {r["grad_clip"]:g}; final training loss
{t["final_train_loss"]:.4f}. Training time: {_env_line(meta)}.
The run is deterministic (seeded python / numpy / torch, deterministic algorithms, fixed thread
count): the same command on the same machine writes the same weights,
SHA-256 `{sha}`.

## Held-out accuracy
**{m["held_out_accuracy"]:.2%}** on {m["held_out_images"]} fresh images (seed {m["eval_seed"]}). Per class: {per_class}.

## Attention property: the class token looks at the shape
Last layer, class token as query, attention averaged over the heads, on the same {m["held_out_images"]} held-out images.
A patch is foreground when any of its pixels is covered by the shape.

| | foreground share of the patches | class-token attention mass on foreground patches | ratio |
|---|---|---|---|
| any pixel covered | {a["foreground_share"]:.3f} | {a["class_token_mass"]:.3f} | x{a["ratio_of_means"]:.2f} |
| at least half covered | {h["foreground_share"]:.3f} | {h["class_token_mass"]:.3f} | x{h["ratio_of_means"]:.2f} |

The mass is a share of the whole attention row: the class token also attends to itself
(on average {1 - last["class_token_mass_on_patches"]:.3f} of its row), which counts against the foreground.
On {a["images_with_mass_above_share"]:.1%} of the images the mass on the foreground exceeds the foreground share.
The same ratio (any pixel) in every layer: {per_layer}.
"""


# ---- command line ----------------------------------------------------------------------------
TRAINERS = {"translator": train_translator, "vit-tiny": train_vit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tformer_core.bundled.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(TRAINERS), help="which bundled model to train")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and data (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default assets/<name>)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2; part of reproducibility)")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation and the model card")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    result = TRAINERS[args.name](
        steps=args.steps, seed=args.seed, out=args.out, threads=args.threads, evaluate=not args.no_eval
    )
    print(f"wrote {result.out} (weights sha256 {result.weights_sha256}, {result.train_seconds:.1f}s training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
