"""Training a small Transformer in class: a text classifier in the lectures' form, and a tiny ViT.

    job = TextJob(n_layers=2, n_heads=2, d_model=64, epochs=3, seed=0)
    result = train(job, report=print, cancelled=lambda: False)
    result.model.trace("a gorgeous, witty film")        # a core Encoder: every page can show it
    result.test_accuracy, result.history                 # measured on data never trained on

The text model is written as the lectures write it: nn.MultiheadAttention, a ReLU feed-forward network,
post-norm residual blocks with LayerNorm(eps=1e-6), learned positions, the label read from the first
token (`<bos>`, its [CLS]). It learns the movie snippets' sentiment (`corpora.sentences`); the
ViT learns the handwritten digits (`corpora.digits`, 8 x 8 pictures, patches of 2 or 4 pixels).
After training, the text model's weights are copied into the core's instrumented `Encoder`
(`to_core_encoder`; the same outputs) so the app's pages show it like any other model.

A run is deterministic for a seed: parameters are initialised and batches drawn from the job's own
generators, dropout is off, and it computes with one CPU thread (`TRAIN_THREADS`) whatever the machine.
Nothing global (torch's random state, other threads' thread counts) is touched, so a run in a server's
worker thread cannot disturb, or be disturbed by, other requests.
`report` gets a `Progress` every few steps and an `Epoch` (validation accuracy, the attention on a fixed
sentence or picture) after every epoch; `cancelled()` is asked between batches.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tformer_core.bundled.sentence_tokenizer import SentenceTokenizer, build_vocabulary
from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.inputs.preprocessing import ImagePreprocessing
from tformer_core.models.base import TracedModel, default_device
from tformer_core.models.encoder import Encoder, EncoderConfig
from tformer_core.models.vit import ViT, ViTConfig

from . import corpora

__all__ = [
    "DIGIT_PREPROCESSING",
    "D_MODELS",
    "FIXED_SENTENCE",
    "HEADS",
    "LIMITS",
    "LN_EPS",
    "MAX_WORDS",
    "TRAIN_THREADS",
    "Cancelled",
    "Epoch",
    "ImageJob",
    "Job",
    "LectureEncoderBlock",
    "LectureTextClassifier",
    "Progress",
    "Report",
    "Result",
    "TextJob",
    "Trainable",
    "digit_pixels",
    "initialise",
    "steps_per_epoch",
    "text_tokenizer",
    "thread_count",
    "to_core_encoder",
    "train",
]

LN_EPS = 1e-6  # the lectures' LayerNorm
# The training's matrices are small (64 sentences x 41 words x d_model 64): two threads gain little on a quiet
# CPU, and on a server whose other cores serve other sessions they spin against each other (benchmarks/train.py:
# an epoch took 47-51 s with two threads and 3-7 s with one, at load 6 on two cores). One thread also makes a
# run's numbers the same on every machine.
TRAIN_THREADS = 1
MAX_WORDS = corpora.MAX_WORDS
D_MODELS = (32, 64, 96, 128)
HEADS = (1, 2, 4)
LIMITS = {"n_layers": (1, 4), "text_epochs": (1, 10), "image_epochs": (1, 60)}
FIXED_SENTENCE = "A gorgeous, witty film, but the plot is thin and the ending falls flat."
DIGIT_PREPROCESSING = ImagePreprocessing(
    resize=("exact", (8, 8)), crop=None, resample=2, rescale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)
)


class Cancelled(Exception):
    """The run was cancelled (by its user, or because its session went away)."""


@dataclass(frozen=True, kw_only=True)
class Job:
    """What to train; sizes within `LIMITS`, `D_MODELS` and `HEADS` (checked: ValueError names the limit)."""

    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 64
    epochs: int = 3
    seed: int = 0
    batch_size: int = 64
    lr: float = 2e-3
    limit: int | None = None  # train on the first `limit` training items only (quick checks); None: all
    kind = "text"

    def __post_init__(self) -> None:
        lo, hi = LIMITS["n_layers"]
        if not lo <= self.n_layers <= hi:
            raise InputError(f"layers must be {lo} to {hi}, got {self.n_layers}")
        if self.d_model not in D_MODELS:
            raise InputError(f"d_model must be one of {D_MODELS}, got {self.d_model}")
        if self.n_heads not in HEADS or self.d_model % self.n_heads:
            raise InputError(f"heads must be one of {HEADS} and divide d_model={self.d_model}, got {self.n_heads}")
        lo, hi = LIMITS[f"{self.kind}_epochs"]
        if not lo <= self.epochs <= hi:
            raise InputError(f"epochs must be {lo} to {hi} for this model, got {self.epochs}")
        if not 0 <= self.seed < 2**31:
            raise InputError(f"the seed must be 0 to {2**31 - 1}, got {self.seed}")
        if self.limit is not None and self.limit < self.batch_size:
            raise InputError(f"limit must be at least one batch ({self.batch_size}), got {self.limit}")


@dataclass(frozen=True, kw_only=True)
class TextJob(Job):
    """The lectures' Transformer encoder classifier on the movie snippets (negative / positive)."""

    kind = "text"


@dataclass(frozen=True, kw_only=True)
class ImageJob(Job):
    """A tiny ViT on the handwritten digits (8 x 8 pictures)."""

    patch_size: int = 2
    epochs: int = 15
    kind = "image"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size not in (2, 4):
            raise InputError(f"the patch size must be 2 or 4 pixels (8 x 8 pictures), got {self.patch_size}")


@dataclass(frozen=True)
class Progress:
    step: int
    total_steps: int
    epoch: int
    loss: float  # this batch's


@dataclass(frozen=True)
class Epoch:
    """After an epoch: its mean training loss, the validation accuracy and the attention on the fixed input,
    [layers, heads, n, n] (float32), with its token labels."""

    epoch: int
    train_loss: float
    valid_accuracy: float
    attention: np.ndarray
    tokens: tuple[str, ...]
    seconds: float


@dataclass
class Result:
    """A finished run: the trained model (a core TracedModel), its test accuracy and the epochs' record."""

    job: Job
    model: TracedModel
    test_accuracy: float
    test_items: int
    history: list[Epoch] = field(default_factory=list)
    seconds: float = 0.0


Report = Callable[[Progress | Epoch], None]


# ---- the lectures' Transformer encoder classifier -----------------------------------------------
class LectureEncoderBlock(nn.Module):
    """x <- LN(x + MHA(x, x, x)); x <- LN(x + W2 ReLU(W1 x)), LayerNorm eps 1e-6 (post-norm)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.norm2 = nn.LayerNorm(d_model, eps=LN_EPS)

    def forward(
        self, x: torch.Tensor, padding: torch.Tensor | None, weights: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        out, w = self.attn(
            x, x, x, key_padding_mask=padding, need_weights=weights is not None, average_attn_weights=False
        )
        if weights is not None and w is not None:
            weights.append(w)  # (B, h, T, T)
        x = self.norm1(x + out)
        return self.norm2(x + self.ffn(x))


class LectureTextClassifier(nn.Module):
    """ids (B, T) with <bos> first, padding (B, T) True at padding -> logits (B, classes)."""

    def __init__(self, vocab_size: int, job: Job, n_classes: int = 2, max_positions: int = MAX_WORDS + 1) -> None:
        super().__init__()
        d = job.d_model
        self.embed = nn.Embedding(vocab_size, d)
        self.pos = nn.Parameter(torch.zeros(max_positions, d))
        blocks = [LectureEncoderBlock(d, job.n_heads, 2 * d) for _ in range(job.n_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.block_list = blocks  # the same modules, typed (a plain list registers nothing)
        self.pool = nn.Linear(d, d)  # tanh(h_[CLS] W_p + b_p), as BERT's pooler
        self.classify = nn.Linear(d, n_classes)

    def forward(
        self, ids: torch.Tensor, padding: torch.Tensor | None = None, weights: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.block_list:
            x = block(x, padding, weights)
        return self.classify(torch.tanh(self.pool(x[:, 0])))


def initialise(model: nn.Module, generator: torch.Generator) -> None:
    """Every parameter drawn from `generator` (not torch's global random state): Xavier-uniform matrices,
    N(0, 0.02) embeddings and positions, zero biases, LayerNorm at 1 and 0."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm gains
                p.fill_(1.0)
            elif name.endswith(("embed.weight", "pos", "cls_token", "dist_token")):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
            else:
                bound = math.sqrt(6.0 / (p.shape[-1] + p.shape[-2]))
                p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) * bound)


def _linear(module: nn.Module) -> nn.Linear:
    if not isinstance(module, nn.Linear):
        raise TypeError(f"expected a linear layer, got {type(module).__name__}")
    return module


def _parameters(module: nn.Linear | nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    return module.weight, module.bias


def _block_state(block: LectureEncoderBlock) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One lecture block's (weight, bias) pairs under the names of the core's block."""
    attn = block.attn
    if attn.in_proj_weight is None or attn.in_proj_bias is None:  # kdim = vdim = d_model: one packed projection
        raise TypeError("the lecture block's attention projects Q, K and V with one packed matrix")
    q, k, v = attn.in_proj_weight.chunk(3)
    bq, bk, bv = attn.in_proj_bias.chunk(3)
    return {
        "attn.W_q": (q, bq),
        "attn.W_k": (k, bk),
        "attn.W_v": (v, bv),
        "attn.W_o": _parameters(attn.out_proj),
        "ln_attn": _parameters(block.norm1),
        "mlp.W_in": _parameters(_linear(block.ffn[0])),
        "mlp.W_out": _parameters(_linear(block.ffn[2])),
        "ln_mlp": _parameters(block.norm2),
    }


def to_core_encoder(model: LectureTextClassifier, tokenizer: SentenceTokenizer) -> Encoder:
    """The same weights in the core's instrumented Encoder (post-norm, ReLU, eps 1e-6, no embedding
    LayerNorm, tanh pooler on the first token): the same logits, every intermediate traced."""
    first = model.block_list[0]
    d, n_layers = model.embed.embedding_dim, len(model.block_list)
    config = EncoderConfig(
        vocab_size=model.embed.num_embeddings,
        max_positions=model.pos.shape[0],
        n_layers=n_layers,
        d_model=d,
        n_heads=first.attn.num_heads,
        d_ff=_linear(first.ffn[0]).out_features,
        activation="relu",
        norm="post",
        ln_eps=LN_EPS,
        embed_norm=False,
        n_labels=model.classify.out_features,
        pool_activation="tanh",
        labels=corpora.SENTIMENT_LABELS,
        problem_type="single_label_classification",
    )
    core = Encoder(config)
    state = {"encoder.embed.tok.weight": model.embed.weight, "encoder.embed.pos.weight": model.pos}
    parts = {f"encoder.blocks.{i}.{n}": p for i, b in enumerate(model.block_list) for n, p in _block_state(b).items()}
    parts |= {"head.pool": _parameters(model.pool), "head.classify": _parameters(model.classify)}
    for name, (w, b) in parts.items():
        state[f"{name}.weight"], state[f"{name}.bias"] = w, b
    core.load_state_dict({k: t.detach().clone() for k, t in state.items()}, strict=True)
    core.attach_tokenizer(tokenizer)
    return core.eval()


# ---- data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Data:
    train: tuple[torch.Tensor, ...]  # text: (ids (N, T), padding (N, T), labels); image: (pixels, labels)
    valid: tuple[torch.Tensor, ...]
    test: tuple[torch.Tensor, ...]
    fixed: tuple[torch.Tensor, ...]  # the input whose attention is kept after every epoch
    fixed_tokens: tuple[str, ...]


def text_tokenizer() -> SentenceTokenizer:
    """The movie snippets' vocabulary (the bundled sentiment models'), `<bos>` first as the [CLS]."""
    return SentenceTokenizer(build_vocabulary(s.text for s in corpora.sentences("train")), prepend_bos=True)


def _text_rows(tokenizer: SentenceTokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer.encode(t)[: MAX_WORDS + 1] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, ids == tokenizer.pad_id


def _text_data(tokenizer: SentenceTokenizer) -> _Data:
    def split(name: str) -> tuple[torch.Tensor, ...]:
        items = corpora.sentences(name)
        return (*_text_rows(tokenizer, [s.text for s in items]), torch.tensor([s.label for s in items]))

    fixed = _text_rows(tokenizer, [FIXED_SENTENCE])
    tokens = tuple(tokenizer.convert_ids_to_tokens(fixed[0][0].tolist()))
    return _Data(split("train"), split("valid"), split("test"), fixed, tokens)


def digit_pixels(images: np.ndarray) -> torch.Tensor:
    """Digits (N, 8, 8), ink 0..16 -> (N, 3, 8, 8) floats as a picture's [0, 1] grey values, normalised as
    `DIGIT_PREPROCESSING` does a photo (three equal channels: the Vision page's pictures are RGB)."""
    grey = torch.as_tensor(np.asarray(images, dtype=np.float32) / 16.0)
    return DIGIT_PREPROCESSING.normalise(grey[:, None].expand(-1, 3, -1, -1).contiguous())


def _image_data(job: ImageJob) -> _Data:
    def split(name: str) -> tuple[torch.Tensor, ...]:
        images, labels = corpora.digits(name)
        return digit_pixels(images), torch.as_tensor(labels)

    test = split("test")
    rows = cols = 8 // job.patch_size
    tokens = ("[CLS]", *(f"r{r}c{c}" for r in range(rows) for c in range(cols)))
    return _Data(split("train"), split("valid"), test, (test[0][:1],), tokens)


# ---- training ------------------------------------------------------------------------------------
def _limited(data: _Data, limit: int | None) -> _Data:
    return data if limit is None else replace(data, train=tuple(t[:limit] for t in data.train))


Trainable = ViT | LectureTextClassifier


@dataclass(frozen=True)
class _Setup:
    model: Trainable
    data: _Data
    tokenizer: SentenceTokenizer | None  # the text classifier's


def _build(job: Job, generator: torch.Generator) -> _Setup:
    model: Trainable
    tokenizer = None
    if isinstance(job, ImageJob):
        config = ViTConfig(
            image_size=8,
            patch_size=job.patch_size,
            n_channels=3,
            n_layers=job.n_layers,
            d_model=job.d_model,
            n_heads=job.n_heads,
            d_ff=2 * job.d_model,
            n_classes=10,
        )
        model, data = ViT(config), _image_data(job)
    else:
        tokenizer = text_tokenizer()
        model, data = LectureTextClassifier(len(tokenizer), job), _text_data(tokenizer)
    initialise(model, generator)
    return _Setup(model, _limited(data, job.limit), tokenizer)


def _logits(
    model: Trainable, batch: tuple[torch.Tensor, ...], weights: list[torch.Tensor] | None = None
) -> torch.Tensor:
    if isinstance(model, ViT):
        return model(batch[0])
    return model(batch[0], batch[1], weights)


def _accuracy(model: Trainable, split: tuple[torch.Tensor, ...], device: torch.device, size: int = 512) -> float:
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(split[-1]), size):
            part = tuple(t[start : start + size].to(device) for t in split)
            correct += int((_logits(model, part[:-1]).argmax(-1) == part[-1]).sum())
    return correct / len(split[-1])


_QK = matching("**.attn.q", "**.attn.k")  # a ViT's trace recomputes its attention from them


def _snapshot(model: Trainable, data: _Data, device: torch.device) -> np.ndarray:
    """The attention on the fixed input: [layers, heads, n, n]."""
    model.eval()
    fixed = tuple(t.to(device) for t in data.fixed)
    with torch.inference_mode():
        if isinstance(model, ViT):
            return model.trace(fixed[0][0], keep=_QK).all_attention()
        weights: list[torch.Tensor] = []
        model(fixed[0], fixed[1], weights)
    return torch.stack([w[0] for w in weights]).float().cpu().numpy()


def _epoch(
    setup: _Setup,
    job: Job,
    device: torch.device,
    generator: torch.Generator,
    optimiser: torch.optim.Optimizer,
    state: dict[str, int],
    report: Report,
    cancelled: Callable[[], bool],
) -> float:
    """One pass over the training split in an order drawn from `generator`; returns the mean loss."""
    model, train_split = setup.model, setup.data.train
    model.train()
    order = torch.randperm(len(train_split[-1]), generator=generator)
    losses = []
    for start in range(0, len(order) - job.batch_size + 1, job.batch_size):
        if cancelled():
            raise Cancelled()
        chosen = order[start : start + job.batch_size]
        batch = tuple(t[chosen].to(device) for t in train_split)
        loss = F.cross_entropy(_logits(model, batch[:-1]), batch[-1])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        losses.append(float(loss.detach()))
        state["step"] += 1
        if state["step"] % 5 == 0 or state["step"] == state["total"]:
            report(Progress(state["step"], state["total"], state["epoch"], losses[-1]))
    return float(np.mean(losses))


def _finished(setup: _Setup, device: torch.device) -> TracedModel:
    """The trained model as the pages show it: the ViT itself, or the text classifier in the core's Encoder."""
    model = setup.model
    model.eval()
    if isinstance(model, ViT):
        model.class_names, model.preprocessing = list(corpora.DIGIT_LABELS), DIGIT_PREPROCESSING
        return model
    if setup.tokenizer is None:
        raise TypeError("a text classifier is built with its tokenizer")
    return to_core_encoder(model.cpu(), setup.tokenizer).to(device)


def steps_per_epoch(job: Job) -> int:
    items = len(corpora.digits("train")[1]) if isinstance(job, ImageJob) else len(corpora.sentences("train"))
    return min(items, job.limit or items) // job.batch_size


@contextlib.contextmanager
def thread_count(n: int) -> Iterator[None]:
    """torch computes with `n` CPU threads in the calling thread only, inside the `with` block.

    torch.set_num_threads sets the calling thread's count and a process-wide default that threads started
    later take on their first operation; the default is put back at once (from a short-lived thread, whose own
    count ends with it), so the server's other threads keep theirs."""
    previous = torch.get_num_threads()  # asking first sets this thread's count up, so later operations keep n

    def set_default(count: int) -> None:
        helper = threading.Thread(target=torch.set_num_threads, args=(count,), name="tformer-threads")
        helper.start()
        helper.join()

    torch.set_num_threads(n)
    set_default(previous)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train(
    job: Job,
    report: Report = lambda event: None,
    cancelled: Callable[[], bool] = lambda: False,
    device: str | torch.device | None = None,
    threads: int = TRAIN_THREADS,
) -> Result:
    """Train `job` (on CUDA when there is one) with `threads` CPU threads in the calling thread; raises
    `Cancelled` when `cancelled()` becomes true."""
    with thread_count(threads):
        return _train(job, report, cancelled, device)


def _train(job: Job, report: Report, cancelled: Callable[[], bool], device: str | torch.device | None) -> Result:
    start = time.perf_counter()
    device = torch.device(device) if device is not None else default_device()
    generator = torch.Generator().manual_seed(job.seed)
    setup = _build(job, generator)
    model, data = setup.model.to(device), setup.data
    optimiser = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=0.01, foreach=False)
    state = {"step": 0, "total": steps_per_epoch(job) * job.epochs, "epoch": 0}
    history = []
    for epoch in range(job.epochs):
        began, state["epoch"] = time.perf_counter(), epoch
        loss = _epoch(setup, job, device, generator, optimiser, state, report, cancelled)
        record = Epoch(
            epoch,
            loss,
            _accuracy(model, data.valid, device),
            _snapshot(model, data, device),
            data.fixed_tokens,
            time.perf_counter() - began,
        )
        history.append(record)
        report(record)
    accuracy = _accuracy(model, data.test, device)
    return Result(job, _finished(setup, device), accuracy, len(data.test[-1]), history, time.perf_counter() - start)
