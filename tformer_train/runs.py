"""What every training run of a bundled model shares: its recipe, the deterministic setting it runs in, the
optimisation loop, and writing what it trained (weights, config.json with the run's record, vocabulary or
label files, the measured figures and the model card).

    with deterministic(seed, threads):
        final_loss = optimise(model, recipe, loss_of_batch, log, name)
    return write_run(model, out, meta, files, evaluate, log)

The trainers (train.py's translator and vit-tiny, early_attention, mae_tiny, detr_tiny) build on this module;
train.py's command line gathers them, and none of them imports it back.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from tformer_core.bundled.loading import CONFIG_FILE, WEIGHTS_FILE, file_sha256, load_from_dir, write_lines

from .cards import write_card

__all__ = [
    "DEFAULT_OUT",
    "Log",
    "Recipe",
    "RunResult",
    "command_line",
    "deterministic",
    "environment_record",
    "optimise",
    "unique_state_dict",
    "write_run",
]

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


def optimise(
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


def environment_record(threads: int) -> dict:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "threads": threads,
    }


def write_run(
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


def command_line(name: str, steps: int | None, seed: int, threads: int) -> str:
    parts = ["python -m tformer_train.train", name]
    if steps is not None:
        parts += ["--steps", str(steps)]
    if seed != 0:
        parts += ["--seed", str(seed)]
    if threads != 2:
        parts += ["--threads", str(threads)]
    return " ".join(parts)
