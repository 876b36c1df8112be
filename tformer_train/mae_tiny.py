"""The bundled masked autoencoder: a small ViT-MAE trained by this project on generated shape scenes.

    python -m tformer_train.train mae-tiny        # -> ./trained/mae-tiny/

The pictures are vit-tiny's (`data.make_scenes`: 32 x 32, one shape on a striped, graded, noisy
background), cut into 64 patches of 4 x 4 pixels; 75 % of them are masked at random and the model rebuilds
their pixels from the 16 it sees. The loss is the squared error over the masked patches, in normalised
pixels (not each patch normalised by its own mean and spread, the MAE paper's norm_pix_loss: the page shows
the predicted colours as they are).

`evaluate_mae` measures it on held-out scenes against two baselines that use the same visible patches:
every masked pixel given the mean colour of the visible ones, and every masked patch a copy of the
nearest visible patch.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from tformer_core.bundled.loading import config_to_dict, preprocessing_from_meta
from tformer_core.models.mae import MAE, MAEConfig, pixel_patches

from . import data as td
from .evaluation import EVAL_SEED
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

NAME = "mae-tiny"

MAE_CONFIG = MAEConfig(
    image_size=td.IMAGE_SIZE,
    patch_size=4,
    n_channels=3,
    n_layers=4,
    d_model=64,
    n_heads=4,
    d_ff=128,
    norm="pre",
    activation="gelu",
    ln_eps=1e-6,
    decoder_d_model=64,
    decoder_n_heads=4,
    decoder_d_ff=128,
    decoder_n_layers=2,
    mask_ratio=0.75,
    norm_pix_loss=False,
)
MAE_RECIPE = Recipe(steps=4000, batch_size=128, lr=1.5e-3, warmup=200, weight_decay=0.05, betas=(0.9, 0.95))
# vit-tiny's normalisation: the same pictures, so the same mean and spread.
MAE_PREPROCESSING = td.SCENE_PREPROCESSING


def masked_mse(predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the masked patches: predicted, target (B, N, P*P*C), mask (B, N) 1 = masked -> ()."""
    per_patch = ((predicted - target) ** 2).mean(-1)  # (B, N)
    return (per_patch * mask).sum() / mask.sum()


def _per_image_mse(predicted: torch.Tensor, target: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(B,) mean squared error of each image over the patches `where` (B, N) is 1 (NaN where there are none)."""
    per_patch = ((predicted - target) ** 2).mean(-1)  # (B, N)
    return (per_patch * where).sum(1) / where.sum(1)


def mean_colour_prediction(target: torch.Tensor, mask: torch.Tensor, n_channels: int = 3) -> torch.Tensor:
    """The baseline that knows only the visible patches' mean colour: every pixel of every patch predicted as
    it. target (B, N, P*P*C) in (row, column, channel) order, mask (B, N) 1 = masked -> (B, N, P*P*C)."""
    B, N, D = target.shape
    pixels = target.reshape(B, N, D // n_channels, n_channels)
    visible = (1 - mask).reshape(B, N, 1, 1)
    mean = (pixels * visible).sum((1, 2)) / (visible.sum((1, 2)) * pixels.shape[2])  # (B, C)
    return mean[:, None, None, :].expand(B, N, D // n_channels, n_channels).reshape(B, N, D)


def nearest_visible_prediction(target: torch.Tensor, mask: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
    """The baseline that copies, into each masked patch, the nearest visible patch (grid distance between patch
    centres; among equally near ones the first in row-major order). target (B, N, P*P*C), mask (B, N)."""
    rows, cols = grid_hw
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    centres = torch.stack([r.flatten(), c.flatten()], 1).float()  # (N, 2)
    distance = torch.cdist(centres, centres)  # (N, N)
    hidden = mask.bool()[:, None, :]  # (B, 1, N): a masked patch is no source
    nearest = distance[None].masked_fill(hidden, float("inf")).argmin(-1)  # (B, N), first of equal minima
    return torch.gather(target, 1, nearest[..., None].expand(-1, -1, target.shape[-1]))


def _normalise(model: MAE, images: torch.Tensor) -> torch.Tensor:
    if model.preprocessing is None:
        raise ValueError("this MAE has no preprocessing: load it with tc.load_model")
    return model.preprocessing.normalise(images).to(model.device, model.dtype)


@torch.inference_mode()
def reconstruct(
    model: MAE, images: torch.Tensor, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predicted (B, N, P*P*C), targets (B, N, P*P*C), mask (B, N)) for images (B, 3, H, W) in [0, 1] masked by
    noise (B, N), in normalised pixels, on the CPU."""
    x = _normalise(model, images)
    predicted, mask = model(x, noise.to(x.device, x.dtype))
    target = pixel_patches(x, model.config.patch_size)
    return predicted.float().cpu(), target.float().cpu(), mask.float().cpu()


def evaluate_mae(model: MAE, log: Log = print, n: int = 2000, batch_size: int = 500) -> dict:
    """Squared error over the masked patches of `n` held-out scenes, against the two baselines; the same figures
    over the masked patches that hold part of the shape (the hard part: the background continues)."""
    start = time.perf_counter()
    c = model.config
    scenes = td.make_scenes(n, EVAL_SEED)
    noise = torch.rand(n, c.n_patches, generator=torch.Generator().manual_seed(EVAL_SEED))
    per_image: dict[str, list[torch.Tensor]] = {}
    for lo in range(0, n, batch_size):
        predicted, target, mask = reconstruct(model, scenes.images[lo : lo + batch_size], noise[lo : lo + batch_size])
        shape = (td.patch_coverage(scenes.coverage[lo : lo + batch_size], c.patch_size) > 0).float() * mask
        guesses = {
            "model": predicted,
            "mean_colour": mean_colour_prediction(target, mask, c.n_channels),
            "nearest_visible": nearest_visible_prediction(target, mask, c.grid_hw),
        }
        for name, guess in guesses.items():
            per_image.setdefault(name, []).append(_per_image_mse(guess, target, mask))
            per_image.setdefault(f"{name}_shape", []).append(_per_image_mse(guess, target, shape))
    mse = {k: torch.cat(v) for k, v in per_image.items()}
    has_shape = ~torch.isnan(mse["model_shape"])  # images with at least one masked patch on the shape

    def figures(suffix: str, rows: torch.Tensor) -> dict:
        kinds = ("model", "mean_colour", "nearest_visible")
        model_mse, mean_mse, near_mse = (float(mse[f"{k}{suffix}"][rows].mean()) for k in kinds)
        better = mse[f"model{suffix}"][rows] < mse[f"mean_colour{suffix}"][rows]
        return {
            "model_mse": model_mse,
            "mean_colour_mse": mean_mse,
            "nearest_visible_mse": near_mse,
            "mean_colour_ratio": mean_mse / model_mse,
            "nearest_visible_ratio": near_mse / model_mse,
            "images_better_than_mean_colour": float(better.float().mean()),
        }

    m = figures("", torch.ones(n, dtype=torch.bool))
    s = {**figures("_shape", has_shape), "images": int(has_shape.sum())}
    metrics = {
        "held_out_images": n,
        "masked_patches_per_image": c.n_patches - c.n_kept,
        "masked": m,
        "masked_on_shape": s,
        "eval_seed": EVAL_SEED,
        "eval_seconds": round(time.perf_counter() - start, 1),
    }
    log(
        f"[{NAME}] masked-patch MSE {m['model_mse']:.4f} vs mean colour {m['mean_colour_mse']:.4f} "
        f"(x{m['mean_colour_ratio']:.2f}) and nearest visible patch {m['nearest_visible_mse']:.4f} "
        f"(x{m['nearest_visible_ratio']:.2f}); on the shape x{s['mean_colour_ratio']:.2f} / "
        f"x{s['nearest_visible_ratio']:.2f}, on {n} held-out scenes"
    )
    return metrics


def train_mae(
    steps: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    threads: int = 2,
    evaluate: bool = True,
    log: Log = print,
) -> RunResult:
    """Train the small MAE on generated shape scenes and write it to `out` (default ./trained/mae-tiny)."""
    recipe = MAE_RECIPE.with_steps(steps)
    out = Path(out) if out is not None else DEFAULT_OUT / NAME
    preprocessing = preprocessing_from_meta(MAE_PREPROCESSING)
    with deterministic(seed, threads):
        start = time.perf_counter()
        model = MAE(MAE_CONFIG)
        with torch.no_grad():  # as the MAE paper: the class and mask tokens start small and random, not at 0
            model.encoder.embed.cls_token.normal_(0.0, 0.02)
            model.decoder.embed.mask_token.normal_(0.0, 0.02)
        stream = torch.Generator().manual_seed(td.TRAIN_STREAM_OFFSET + seed)

        def loss_of_batch(step: int) -> torch.Tensor:
            scenes = td.make_scenes(recipe.batch_size, seed, generator=stream)
            noise = torch.rand(recipe.batch_size, MAE_CONFIG.n_patches, generator=stream)
            x = preprocessing.normalise(scenes.images)
            predicted, mask = model(x, noise)
            return masked_mse(predicted, pixel_patches(x, MAE_CONFIG.patch_size), mask)

        final_loss = optimise(model, recipe, loss_of_batch, log, NAME)
        train_seconds = time.perf_counter() - start

    meta = {
        "family": "mae",
        "name": NAME,
        "config": config_to_dict(MAE_CONFIG),
        "preprocessing": MAE_PREPROCESSING,
        "training": {
            "command": command_line(NAME, steps, seed, threads),
            "seed": seed,
            "recipe": asdict(recipe),
            "final_train_loss": round(final_loss, 5),
            "train_seconds": round(train_seconds, 1),
            "environment": environment_record(threads),
            "images_seen": recipe.steps * recipe.batch_size,
        },
    }
    return write_run(model, out, meta, {}, evaluate_mae if evaluate else None, log)
