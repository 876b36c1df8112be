"""Training and measuring the bundled models of attention before Transformers.

    python -m tformer_train.train sentiment-attention   # attention pooling over word vectors
    python -m tformer_train.train sentiment-mean        # the same model with mean pooling (baseline)
    python -m tformer_train.train rnn-additive          # GRU encoder-decoder, Bahdanau's scores
    python -m tformer_train.train rnn-dot               # ... Luong's dot-product scores
    python -m tformer_train.train rnn-bilinear          # ... Luong's bilinear ("general") scores

The sentiment models learn from the movie snippets (`corpora.sentences`: real sentences, labelled by
people); the RNNs from the translator's generated sentence pairs (`data.sample_pairs`), so their alignment
can be set beside the Transformer translator's cross-attention on the same sentence. Both are measured on
data never trained on: the snippets' test split, and held-out sentence pairs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tformer_core.bundled.loading import config_to_dict
from tformer_core.bundled.sentence_tokenizer import SentenceTokenizer, build_vocabulary
from tformer_core.bundled.tokenizer import WordTokenizer
from tformer_core.capture import capture, matching
from tformer_core.errors import InputError
from tformer_core.models.kinds import WordTokenizing
from tformer_core.models.pooling import PoolingClassifier, PoolingConfig
from tformer_core.models.rnn import RNNConfig, RNNSeq2Seq

from . import corpora
from . import data as td
from .evaluation import EVAL_SEED, pad_batch
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

VOCAB_FILE, LABELS_FILE = "vocab.txt", "labels.txt"


# ---- sentiment: attention pooling vs mean pooling -----------------------------------------------
def sentiment_vocabulary() -> list[str]:
    """The words of the training split seen at least twice (plus the special tokens)."""
    return build_vocabulary(s.text for s in corpora.sentences("train"))


def sentiment_config(pooling: str, vocab_size: int) -> PoolingConfig:
    return PoolingConfig(
        vocab_size=vocab_size, d_embed=32, d_hidden=32, d_score=32, pooling=pooling, labels=corpora.SENTIMENT_LABELS
    )


def tokenizer_of(tokenizer: WordTokenizing | None) -> WordTokenizing:
    """A bundled model's word tokenizer (ValueError for a model built without one)."""
    if tokenizer is None:
        raise InputError("this model has no tokenizer: load it with its vocabulary (tc.load_model)")
    return tokenizer


def encode_sentences(tokenizer: WordTokenizing, texts: Sequence[str], max_words: int) -> tuple:
    """(ids (B, T), mask (B, T)) of sentences, each cut to `max_words`; an empty one reads as `<unk>`."""
    rows = [(tokenizer.encode(t) or [tokenizer.unk_id])[:max_words] for t in texts]
    return pad_batch(rows, tokenizer.pad_id)


def sentiment_batches(
    tokenizer: WordTokenizer, batch_size: int, seed: int, max_words: int
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """batch(step) -> (ids, mask, labels): the training split in a new seeded order every epoch."""
    train = corpora.sentences("train")
    encoded = [(tokenizer.encode(s.text) or [tokenizer.unk_id])[:max_words] for s in train]
    labels = torch.tensor([s.label for s in train])
    per_epoch = len(train) // batch_size
    orders: dict[int, np.ndarray] = {}

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        epoch, k = divmod(step, per_epoch)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(len(train))
        chosen = orders[epoch][k * batch_size : (k + 1) * batch_size]
        ids, mask = pad_batch([encoded[i] for i in chosen], tokenizer.pad_id)
        return ids, mask, labels[torch.as_tensor(chosen)]

    return batch


@torch.inference_mode()
def sentiment_predictions(model: PoolingClassifier, split: str, batch_size: int = 512) -> tuple:
    """(predicted labels, true labels, alpha rows) over one split of the movie snippets."""
    items = corpora.sentences(split)
    preds, alphas = [], []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        ids, mask = encode_sentences(tokenizer_of(model.tokenizer), [s.text for s in chunk], model.config.max_positions)
        with capture(matching("pool.weights")) as sink:
            logits = model(ids.to(model.device), mask.to(model.device))
        preds.append(logits.argmax(-1).cpu())
        weights = sink.tensors["pool.weights"].cpu()
        alphas += [weights[i, : int(mask[i].sum())].numpy() for i in range(len(chunk))]
    return torch.cat(preds).numpy(), np.array([s.label for s in items]), alphas


def evaluate_sentiment(model: PoolingClassifier, log: Log = print) -> dict:
    """Accuracy on the valid and test splits, per class, and what the weights over the words look like."""
    start = time.perf_counter()
    figures: dict = {}
    for split in ("valid", "test"):
        pred, gold, alphas = sentiment_predictions(model, split)
        figures[f"{split}_sentences"] = len(gold)
        figures[f"{split}_accuracy"] = float((pred == gold).mean())
    figures["test_per_class"] = {
        name: float((pred[gold == c] == c).mean()) for c, name in enumerate(corpora.SENTIMENT_LABELS)
    }
    figures["majority_baseline"] = float(max(gold.mean(), 1 - gold.mean()))
    figures["mean_words"] = float(np.mean([len(a) for a in alphas]))
    figures["mean_top_weight"] = float(np.mean([a.max() for a in alphas]))
    figures["mean_uniform_weight"] = float(np.mean([1 / len(a) for a in alphas]))
    tokenizer = tokenizer_of(model.tokenizer)
    tokens = [tokenizer.encode(s.text) or [tokenizer.unk_id] for s in corpora.sentences("test")]
    top = Counter(tokenizer.vocab[row[int(a.argmax())]] for row, a in zip(tokens, alphas))
    figures["most_often_top_word"] = [[w, n] for w, n in top.most_common(12)]
    figures["eval_seconds"] = round(time.perf_counter() - start, 1)
    log(f"[{model.config.pooling} pooling] test accuracy {figures['test_accuracy']:.4f} on {len(gold)} sentences")
    return figures


def sentiment_loss(model: PoolingClassifier, batch: Callable) -> Callable[[int], torch.Tensor]:
    def loss_of_batch(step: int) -> torch.Tensor:
        ids, mask, labels = batch(step)
        return F.cross_entropy(model(ids, mask), labels)

    return loss_of_batch


def sentiment_model(pooling: str) -> tuple[PoolingClassifier, SentenceTokenizer]:
    vocab = sentiment_vocabulary()
    model = PoolingClassifier(sentiment_config(pooling, len(vocab)))
    tokenizer = SentenceTokenizer(vocab)
    model.attach_tokenizer(tokenizer)
    return model, tokenizer


def sentiment_meta(pooling: str, model: PoolingClassifier) -> dict:
    return {
        "family": "pooling",
        "name": f"sentiment-{pooling}",
        "card": "sentiment",
        "config": config_to_dict(model.config),
        "vocab": VOCAB_FILE,
        "special_tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 3},
        "data": "assets/datasets/movie-snippets (vaderSentiment 3.3.2, MIT; see its README.md)",
    }


# ---- RNN encoder-decoders on the translator's sentences ----------------------------------------
def rnn_config(score: str) -> RNNConfig:
    return RNNConfig(src_vocab_size=len(td.SOURCE_VOCAB), tgt_vocab_size=len(td.TARGET_VOCAB), score=score)


def rnn_loss(model: RNNSeq2Seq, batch_size: int, seed: int, unk_rate: float) -> Callable[[int], torch.Tensor]:
    """loss(step): teacher-forced cross-entropy on a fresh batch of training pairs."""
    src_tok, tgt_tok = WordTokenizer(td.SOURCE_VOCAB), WordTokenizer(td.TARGET_VOCAB, prepend_bos=True)
    rng = np.random.default_rng(seed)

    def loss_of_batch(step: int) -> torch.Tensor:
        pairs = td.sample_pairs(batch_size, seed, "train", unk_rate, rng=rng)
        src, src_mask = pad_batch([src_tok.encode(p.source_text) for p in pairs], src_tok.pad_id)
        full, full_mask = pad_batch([tgt_tok.encode(p.target_text) + [tgt_tok.eos_id] for p in pairs], 0)
        tgt_in, labels = full[:, :-1], full[:, 1:].masked_fill(full_mask[:, 1:] == 0, -100)
        logits = model(src, tgt_in, src_mask)  # (B, M, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)

    return loss_of_batch


def rnn_translate(model: RNNSeq2Seq, sentences: Sequence[str]) -> list[list[str]]:
    """Greedy translations (target words, without <bos> / <eos>)."""
    src_tok, tgt_tok = tokenizer_of(model.tokenizer), tokenizer_of(model.target_tokenizer)
    src, mask = pad_batch([src_tok.encode(s) for s in sentences], src_tok.pad_id)
    out = model.greedy_batch(src.to(model.device), mask.to(model.device), tgt_tok.bos_id, tgt_tok.eos_id, 24)
    return [tgt_tok.convert_ids_to_tokens(ids) for ids in out]


def rnn_alignment_accuracy(model: RNNSeq2Seq, pairs: Sequence[td.Pair]) -> float:
    """Share of aligned target words whose alpha argmax (at the step that predicts the word) is their
    gold source word (teacher forcing: step m reads word m-1, <bos> first, and predicts word m)."""
    hits = total = 0
    for p in pairs:
        trace = model.trace(p.source_text, p.target_text, keep=matching("attn.weights"))
        alpha = trace["attn.weights"]  # [M, J]
        rows = [t for t, a in enumerate(p.alignment) if a is not None]
        hits += int((alpha[rows].argmax(-1) == np.array([p.alignment[t] for t in rows])).sum())
        total += len(rows)
    return hits / total


def evaluate_rnn(model: RNNSeq2Seq, log: Log = print, n: int = 2000, n_align: int = 300) -> dict:
    """Held-out exact match, alignment accuracy of alpha, and sample translations."""
    start = time.perf_counter()
    held_out = td.sample_pairs(n, EVAL_SEED, "held-out")
    correct = 0
    for k in range(0, n, 250):
        chunk = held_out[k : k + 250]
        outputs = rnn_translate(model, [p.source_text for p in chunk])
        correct += sum(list(o) == list(p.target) for o, p in zip(outputs, chunk))
    examples = held_out[:4]
    figures = {
        "held_out_sentences": n,
        "held_out_exact_match": correct / n,
        "alignment_sentences": n_align,
        "alignment_accuracy": rnn_alignment_accuracy(model, held_out[:n_align]),
        "examples": [
            {"source": p.source_text, "reference": p.target_text, "model": " ".join(o)}
            for p, o in zip(examples, rnn_translate(model, [p.source_text for p in examples]))
        ],
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"[rnn-{model.config.score}] exact match {figures['held_out_exact_match']:.4f}; alignment "
        f"{figures['alignment_accuracy']:.4f}"
    )
    return figures


def rnn_meta(score: str, model: RNNSeq2Seq) -> dict:
    return {
        "family": "rnn-seq2seq",
        "name": f"rnn-{score}",
        "card": "rnn",
        "config": config_to_dict(model.config),
        "special_tokens": {"pad": 0, "bos": 1, "eos": 2, "unk": 3},
        "source_vocab": "source_vocab.txt",
        "target_vocab": "target_vocab.txt",
        "data": "generated by tformer_train/data.py: the translator's toy English -> Tarish pairs",
    }


# ---- the training runs --------------------------------------------------------------------------
SENTIMENT_RECIPE = Recipe(steps=1200, batch_size=64, lr=3e-3, warmup=60, weight_decay=0.01, betas=(0.9, 0.999))
RNN_RECIPE = Recipe(steps=1500, batch_size=64, lr=3e-3, warmup=100)
RNN_UNK_RATE = 0.03


def _run(model, recipe: Recipe, loss: Callable, seed: int, threads: int, log: Log, name: str, command: str):
    """Optimise under `deterministic`; returns the meta record of the run."""
    start = time.perf_counter()
    final_loss = optimise(model, recipe, loss, log, name)
    return {
        "command": command,
        "seed": seed,
        "recipe": asdict(recipe),
        "final_train_loss": round(final_loss, 5),
        "train_seconds": round(time.perf_counter() - start, 1),
        "environment": environment_record(threads),
    }


def train_sentiment(
    pooling: str,
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the attention-pooling (or mean-pooling) sentiment classifier on the movie snippets."""
    name = f"sentiment-{pooling}"
    recipe = SENTIMENT_RECIPE.with_steps(steps)
    with deterministic(seed, threads):
        model, tokenizer = sentiment_model(pooling)
        batches = sentiment_batches(tokenizer, recipe.batch_size, seed, model.config.max_positions)
        training = _run(
            model,
            recipe,
            sentiment_loss(model, batches),
            seed,
            threads,
            log,
            name,
            command_line(name, steps, seed, threads),
        )
    meta = {**sentiment_meta(pooling, model), "training": training}
    files = {VOCAB_FILE: tokenizer.vocab}
    return write_run(
        model, Path(out) if out else DEFAULT_OUT / name, meta, files, evaluate_sentiment if evaluate else None, log
    )


def train_rnn(
    score: str,
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the GRU encoder-decoder with `score` attention on the translator's sentence pairs."""
    name = f"rnn-{score}"
    recipe = RNN_RECIPE.with_steps(steps)
    with deterministic(seed, threads):
        model = RNNSeq2Seq(rnn_config(score))
        loss = rnn_loss(model, recipe.batch_size, seed, RNN_UNK_RATE)
        training = _run(model, recipe, loss, seed, threads, log, name, command_line(name, steps, seed, threads))
    meta = {**rnn_meta(score, model), "training": {**training, "unk_rate": RNN_UNK_RATE}}
    files = {"source_vocab.txt": td.SOURCE_VOCAB, "target_vocab.txt": td.TARGET_VOCAB}
    return write_run(
        model, Path(out) if out else DEFAULT_OUT / name, meta, files, evaluate_rnn if evaluate else None, log
    )


TRAINERS = {
    "sentiment-attention": partial(train_sentiment, "attention"),
    "sentiment-mean": partial(train_sentiment, "mean"),
    **{f"rnn-{score}": partial(train_rnn, score) for score in ("additive", "dot", "bilinear")},
}
