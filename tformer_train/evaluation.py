"""Measuring the bundled models on held-out data: what their model cards report and the tests re-check.

translate(translator, "the big dog chases a small cat")   # ['varo', 'gros', 'ta', 'ga', ...]
translation_accuracy(translator, pairs)                    # exact match of greedy translation
alignment_accuracy(translator, pairs)                      # [layers, heads]: cross-attention finds the source word
classify(vit, images); foreground_figures(vit, scenes)    # accuracy; class-token attention on the shape
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tformer_core.bundled.tokenizer import WordTokenizer
from tformer_core.capture import capture, matching
from tformer_core.models.seq2seq import EncoderDecoder
from tformer_core.models.vit import ViT

from . import data as td

# Seed of the evaluation samples written into the model cards. The tests draw other seeds.
EVAL_SEED = 20_240_601

Log = Callable[[str], None]


# ---- translator ----------------------------------------------------------------------------
def _tokenizers(model: EncoderDecoder) -> tuple[WordTokenizer, WordTokenizer]:
    src, tgt = model.tokenizer, model.target_tokenizer
    if not isinstance(src, WordTokenizer) or not isinstance(tgt, WordTokenizer):
        raise ValueError("this needs the bundled translator (word-level source and target tokenizers)")
    return src, tgt


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged id lists -> (ids (B, L) long, mask (B, L) long: 1 real, 0 padding)."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every sequence needs at least one token")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def translate_batch(model: EncoderDecoder, sentences: Sequence[str]) -> list[list[str]]:
    """Greedy translations of source sentences, as target word lists (without <bos> / <eos>).

    The model's own generation rules (start, end, suppressed tokens, length limit), as in `generate`.
    """
    src_tok, tgt_tok = _tokenizers(model)
    rows = [src_tok.encode(s) for s in sentences]
    for s, r in zip(sentences, rows):
        if not r:
            raise ValueError(f"the sentence {s!r} has no words to translate")
        if len(r) > model.config.max_positions:
            limit = model.config.max_positions
            raise ValueError(f"the sentence {s!r} has {len(r)} words; the model reads at most {limit}")
    src, mask = pad_batch(rows, src_tok.pad_id)
    return [tgt_tok.convert_ids_to_tokens(r) for r in model.greedy_batch(src, mask)]


def translate(model: EncoderDecoder, sentence: str) -> list[str]:
    """Greedy translation of one source sentence: the target words (without <bos> / <eos>)."""
    return translate_batch(model, [sentence])[0]


def translation_accuracy(model: EncoderDecoder, pairs: Sequence[td.Pair], batch_size: int = 256) -> float:
    """Exact-match sentence accuracy of greedy translation over `pairs`."""
    if not pairs:
        raise ValueError("no pairs to evaluate")
    correct = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        outputs = translate_batch(model, [p.source_text for p in chunk])
        correct += sum(list(out) == list(p.target) for out, p in zip(outputs, chunk))
    return correct / len(pairs)


def cross_attention(model: EncoderDecoder, pair: td.Pair) -> np.ndarray:
    """Teacher-forced cross-attention of one pair: [layers, heads, T+1, S].

    Row t is the decoder position whose input is target word t-1 (row 0: <bos>) and which
    predicts target word t (the last row predicts <eos>).
    """
    src_tok, tgt_tok = _tokenizers(model)
    src = src_tok.encode(pair.source_text)
    tgt = tgt_tok.encode(pair.target_text)  # starts with <bos>
    trace = model.trace(src, tgt, keep=matching("**.cross_attn.weights"))
    return trace.all_attention("cross")


def alignment_accuracy(model: EncoderDecoder, pairs: Sequence[td.Pair]) -> np.ndarray:
    """For each (decoder layer, head): the share of aligned target words whose cross-attention
    argmax (at the position that predicts the word) is the gold source word. -> [layers, heads]."""
    hits: np.ndarray | None = None
    total = 0
    for p in pairs:
        w = cross_attention(model, p)  # (L, H, T+1, S)
        rows = [t for t, a in enumerate(p.alignment) if a is not None]
        gold = np.array([p.alignment[t] for t in rows])
        argmax = w[:, :, rows, :].argmax(-1)  # (L, H, n)
        h = (argmax == gold).sum(-1)
        hits = h if hits is None else hits + h
        total += len(rows)
    if hits is None or not total:
        raise ValueError("no aligned pair to score")
    return hits / total


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
        "unknown_word_example": {"source": unk_example, "model": " ".join(translate(model, unk_example))},
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"[translator] held-out exact match {accuracy:.4f} on {n} sentences; "
        f"best alignment head L{best[0]}H{best[1]} {per_head[best]:.3f}; {moved:.1%} of words move"
    )
    return metrics


# ---- vit-tiny ------------------------------------------------------------------------------
def _normalised(model: ViT, images: torch.Tensor) -> torch.Tensor:
    if model.preprocessing is None:
        raise ValueError("this ViT has no preprocessing")
    return model.preprocessing.normalise(images).to(model.device, model.dtype)


@torch.inference_mode()
def classify(model: ViT, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Predicted class per image: images (B, 3, H, W) in [0, 1] at the model's size -> (B,) long."""
    preds = []
    for start in range(0, images.shape[0], batch_size):
        preds.append(model(_normalised(model, images[start : start + batch_size])).argmax(-1).cpu())
    return torch.cat(preds)


@torch.inference_mode()
def class_token_attention(model: ViT, images: torch.Tensor, layer: int = -1, batch_size: int = 250) -> torch.Tensor:
    """The class token's attention over the patches in one layer, mean over heads: (B, N).

    Images (B, 3, H, W) in [0, 1]. Row 0 of the attention (the class token as query), keys 1..N
    (the patches, row-major); the mass the class token puts on itself is left out, so a row
    sums to 1 minus that mass.
    """
    layer = layer % model.config.n_layers
    name = f"encoder.{layer}.attn.weights"
    out = []
    for start in range(0, images.shape[0], batch_size):
        with capture(matching(name)) as sink:
            model(_normalised(model, images[start : start + batch_size]))
        w = sink.tensors[name]  # (b, heads, n, n)
        out.append(w[:, :, 0, model.config.n_prefix_tokens :].mean(1).float().cpu())
    return torch.cat(out)


def foreground_figures(model: ViT, scenes: td.Scenes, layer: int = -1) -> dict:
    """Class-token attention on the shape vs the shape's share of the patches, per image then averaged.

    A patch is foreground when any of its pixels is covered by the shape (the generous
    definition: it makes the share larger and the test harder); figures for patches at least
    half covered are given too. Mass: the class token's attention (mean over heads, `layer`) on
    those patches, as a fraction of its whole row (its attention on itself counts against it).
    """
    att = class_token_attention(model, scenes.images, layer)  # (B, N)
    cov = td.patch_coverage(scenes.coverage, model.config.patch_size)  # (B, N)
    figures: dict[str, Any] = {}
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
    """Held-out accuracy (overall and per class) and the class token's attention on the shape, per layer."""
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
