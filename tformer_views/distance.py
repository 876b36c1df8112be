"""How far heads look: mean attention distance in tokens (text) and in pixels (ViT, the paper's Fig. 7).

    token_distances(trace)                         # [layers, heads], tokens
    image_distances(trace)                         # [layers, heads], pixels
    distances_over_images(model, pictures)         # [pictures, layers, heads], traced in batches

Each comes with the distance of uniform attention (the dashed baseline of the charts), from the one
`tformer_core.metrics.uniform_attention`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import numpy as np
import torch
from PIL import Image

from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.metrics import (
    mean_attention_distance,
    mean_attention_distance_tensor,
    mean_token_distance,
    mean_token_distance_tensor,
    uniform_attention,
)
from tformer_core.models.vit import ViT
from tformer_core.trace import Trace, reduces_on_device, to_host

from .text import head_matrix, shown_weights
from .tokens import visible_positions
from .vision import require_vit

__all__ = [
    "BATCH_WEIGHTS_BYTES",
    "GPU_BATCH_WEIGHTS_BYTES",
    "auto_batch_size",
    "distances_over_images",
    "image_distances",
    "token_distances",
    "uniform_image_distance",
    "uniform_token_distance",
]


def token_distances(trace: Trace, stack: str | None = None, hide_special: bool = False) -> np.ndarray:
    """[layers, heads] mean attention distance in tokens (tc.mean_token_distance of the shown weights), reduced
    on the trace's device (only the grid comes to the host).

    With hidden special tokens, distances are over the shown tokens with renormalised rows
    (positions counted among the shown tokens).
    """
    stack = stack or trace.main_stack
    layers = range(trace.layers_in(stack))
    if not reduces_on_device(trace.device):
        return np.stack(
            [
                mean_token_distance(head_matrix(trace, layer, None, stack, hide_special, widen=False).weights)
                for layer in layers
            ]
        )
    q_tokens, k_tokens = trace.tokens_for(stack)
    queries, keys = visible_positions(q_tokens, hide_special), visible_positions(k_tokens, hide_special)
    renormalise = len(keys) < len(k_tokens)
    with torch.inference_mode():
        grid = torch.stack(
            [
                mean_token_distance_tensor(shown_weights(trace, layer, stack, queries, keys, renormalise)[0])
                for layer in layers
            ]
        )
    return to_host([grid])[0].astype(np.float64)


def uniform_token_distance(trace: Trace, stack: str | None = None, hide_special: bool = False) -> float:
    """The mean distance of uniform attention over the keys each query may see (layer 0's mask)."""
    m = head_matrix(trace, 0, 0, stack, hide_special)
    allowed = np.ones(m.weights.shape, dtype=bool) if m.allowed is None else m.allowed
    return float(mean_token_distance(uniform_attention(allowed)))


def image_distances(trace: Trace, renormalize: bool = False) -> np.ndarray:
    """[layers, heads] mean attention distance in pixels of one traced image: reduced on a GPU (the grid crosses
    to the host), with numpy over the weights in place on the CPU."""
    grid, side, prefix = trace.patch_grid, trace.patch_side, trace.n_prefix_tokens
    layers = range(trace.n_layers)
    if not reduces_on_device(trace.device):
        return np.stack(
            [mean_attention_distance(trace.attention(layer), grid, side, prefix, renormalize) for layer in layers]
        )
    with torch.inference_mode():
        weights = [trace.block_tensor("weights", layer) for layer in layers]
        figures = torch.stack([mean_attention_distance_tensor(w, grid, side, prefix, renormalize) for w in weights])
    return to_host([figures])[0].astype(np.float64)


def uniform_image_distance(
    grid_hw: tuple[int, int], patch_size: int, n_prefix_tokens: int, renormalize: bool = False
) -> float:
    """The mean attention distance of uniform attention over every token (the dashed baseline)."""
    n = n_prefix_tokens + grid_hw[0] * grid_hw[1]
    weights = uniform_attention(np.ones((n, n), dtype=bool))
    return float(mean_attention_distance(weights, grid_hw, patch_size, n_prefix_tokens, renormalize))


BATCH_WEIGHTS_BYTES = 96 * 2**20  # the attention weights one batch may hold on the CPU while it is reduced
GPU_BATCH_WEIGHTS_BYTES = 2**30  # on a GPU (at most a quarter of its free memory)


def auto_batch_size(model: ViT, budget_bytes: int | None = None, largest: int | None = None) -> int:
    """Pictures per batch so that the batch's attention weights (layers x heads x tokens² in the model's dtype)
    stay within `budget_bytes`: 18 for DeiT-Tiny, 4 for ViT-B/16 on the CPU (96 MB, at most 32 pictures);
    on a GPU 1 GiB or a quarter of its free memory, at most 64 pictures (48 of ViT-B/16 in float32). At least 1."""
    c = model.config
    on_gpu = model.device.type == "cuda"
    if budget_bytes is None:
        budget_bytes = BATCH_WEIGHTS_BYTES
        if on_gpu:
            free, _ = torch.cuda.mem_get_info(model.device)
            budget_bytes = min(GPU_BATCH_WEIGHTS_BYTES, free // 4)
    if largest is None:
        largest = 64 if on_gpu else 32
    n = c.n_prefix_tokens + c.grid_hw[0] * c.grid_hw[1]
    per_picture = c.n_layers * c.n_heads * n * n * model.dtype.itemsize
    return max(1, min(largest, budget_bytes // per_picture))


def distances_over_images(
    model: ViT,
    images: Iterable[Image.Image],
    renormalize: bool = False,
    batch_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """[images, layers, heads] mean attention distance in pixels, the images preprocessed as the model's
    checkpoint does and traced in batches on the model's device, keeping only the attention weights.

    `images` is read as it goes (a generator that decodes files one by one keeps one picture in memory
    at a time); each batch is reduced where it ran, layer by layer, and only its [batch, layers, heads]
    figures come to the host (one transfer per batch) before the next is traced.
    batch_size: None picks one from the model's size and device (`auto_batch_size`). progress(done) after
    every batch.
    """
    model = require_vit(model)
    preprocessing = model.preprocessing
    assert preprocessing is not None  # require_vit refuses a ViT without one
    batch_size = auto_batch_size(model) if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    c = model.config
    out, done, pictures = [], 0, iter(images)
    while batch := [preprocessing(image) for image in itertools.islice(pictures, batch_size)]:
        traces = model.trace_batch(torch.stack(batch), keep=matching("**.attn.weights"))
        out.append(_batch_distances(traces, c.n_layers, c.grid_hw, c.patch_size, c.n_prefix_tokens, renormalize))
        del traces
        done += len(batch)
        if progress is not None:
            progress(done)
    if not out:
        raise InputError("no images: choose or upload at least one")
    return np.concatenate(out)  # [images, layers, heads]


def _batch_distances(
    traces: list[Trace], n_layers: int, grid: tuple[int, int], side: int, prefix: int, renormalize: bool
) -> np.ndarray:
    """[batch, layers, heads] of one traced batch, reduced layer by layer where it ran: on a GPU the figures cross
    to the host once (no [batch, layers, heads, n, n] copy); on the CPU numpy reads the weights in place."""
    if not reduces_on_device(traces[0].device):
        per_layer = [
            mean_attention_distance(np.stack([t.attention(layer) for t in traces]), grid, side, prefix, renormalize)
            for layer in range(n_layers)
        ]
        return np.stack(per_layer, axis=1)
    with torch.inference_mode():
        per_layer_t = [
            mean_attention_distance_tensor(
                torch.stack([t.block_tensor("weights", layer) for t in traces]), grid, side, prefix, renormalize
            )  # [batch, heads]
            for layer in range(n_layers)
        ]
        figures = torch.stack(per_layer_t, dim=1)  # [batch, layers, heads]
    return to_host([figures])[0].astype(np.float64)
