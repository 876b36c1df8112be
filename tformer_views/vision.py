"""What the Vision Transformer pages show, from ViT traces: attention over the picture, rollout, the model's filters.

result = analyse(model, image_bytes, "photo.jpg")          # the picture as the model sees it, and its trace
attention_map(result.trace, layer=5, head=None)             # [rows, cols]: the class token's attention, mean of heads
pictures.overlay(result.image, that_map)                    # PIL: the map as heat over the picture
rollout(result.trace, "max", 0.9)                           # attention rollout (Abnar & Zuidema 2020)
relevancy_map(model, image_bytes, "photo.jpg", class_id)     # gradient-weighted relevancy for one class
embedding_filter_pcs(model), position_similarity_maps(model)   # ViT paper, Fig. 7, left and centre
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from tformer_core.artefacts import TokenNorms, token_norms
from tformer_core.errors import InputError
from tformer_core.inputs.image_file import ImageError, LoadedImage, read_image
from tformer_core.inputs.preprocessing import ImagePreprocessing
from tformer_core.models.base import TracedModel
from tformer_core.models.vit import ViT
from tformer_core.probes import class_probe
from tformer_core.relevancy import relevancy
from tformer_core.trace import Trace, reduces_on_device, to_host, to_numpy

from .colour import colourise
from .pictures import overlay, tiles

__all__ = [
    "FUSIONS",
    "MAX_FIGURE_PX",
    "MAX_MAPS_PER_SIDE",
    "VisionResult",
    "analyse",
    "attention_map",
    "embedding_filter_pcs",
    "head_overlays",
    "key_weights",
    "position_similarity",
    "position_similarity_maps",
    "prefix_tokens_named",
    "query_token",
    "read_pictures",
    "relevancy_map",
    "require_vit",
    "rollout",
    "rollout_map",
    "similarity_map_step",
    "trace_picture",
]

FUSIONS = ("mean", "max", "min")


def require_vit(model: TracedModel) -> ViT:
    """`model` as a ViT with its image preprocessing; ValueError with a message for the page otherwise."""
    if not isinstance(model, ViT):
        raise InputError("this page shows Vision Transformers (ViT, DeiT); this model reads text")
    if model.preprocessing is None:
        raise InputError("this ViT has no image preprocessing (no preprocessor_config.json in its folder)")
    return model


@dataclass(frozen=True, eq=False)
class VisionResult:
    """A picture and what the model computed for it.

    image: RGB as the model sees it (resized, cropped), before normalisation; trace: its trace;
    original_size: (width, height) as uploaded; preprocessing: what made `image` of it (the page says whether
    it cropped); notes: what reading it changed (rotation, modes, size).
    The uploaded picture itself is not kept (a cached result holds the model's 224-px view of a
    56-megapixel photo, not the photo). norms: every token's norm after every layer (tformer_core.artefacts),
    taken from the full trace before a cache drops its residual stream; None where a result was made without.
    """

    image: Image.Image
    trace: Trace
    original_size: tuple[int, int]
    preprocessing: ImagePreprocessing
    notes: tuple[str, ...] = ()
    norms: TokenNorms | None = None

    @property
    def grid_hw(self) -> tuple[int, int]:
        return self.trace.patch_grid

    @property
    def patch_size(self) -> int:
        return self.trace.patch_side

    @property
    def pixels(self) -> torch.Tensor:
        """The model's input for this picture, (C, H, W) float32, normalised: what `analyse` traced, rebuilt from
        `image` (a pass over it again, e.g. with a source removed, runs the same picture)."""
        return self.preprocessing.to_tensor(self.image)


def analyse(model: TracedModel, data: bytes, name: str = "") -> VisionResult:
    """Read an image file, preprocess it as the checkpoint does, trace it. ImageError / ValueError for bad input."""
    vit, preprocessing, loaded, seen = _seen(model, data, name)
    trace = vit.trace(preprocessing.to_tensor(seen))  # what `VisionResult.pixels` rebuilds
    return VisionResult(seen, trace, loaded.original_size, preprocessing, loaded.notes, token_norms(trace))


def trace_picture(model: TracedModel, data: bytes, name: str = "", keep: Callable[[str], bool] | None = None) -> Trace:
    """The trace `analyse` makes of an image file, keeping the names `keep` selects (all by default): for a view
    that needs more than the cached one holds (the residual stream after each attention, for the flow)."""
    vit, preprocessing, _, seen = _seen(model, data, name)
    return vit.trace(preprocessing.to_tensor(seen), keep=keep)


def _seen(model: TracedModel, data: bytes, name: str) -> tuple[ViT, ImagePreprocessing, LoadedImage, Image.Image]:
    """(the ViT, its preprocessing, the file read, the picture as the model sees it: resized, cropped)."""
    vit = require_vit(model)
    preprocessing = vit.preprocessing
    assert preprocessing is not None  # require_vit refuses a ViT without one
    loaded = read_image(data, name)
    return vit, preprocessing, loaded, preprocessing.resized(loaded.image)


def query_token(trace: Trace, patch: int | None) -> int:
    """Token index of a query: the class token (patch None) or patch `patch` (row-major) after the prefix tokens."""
    if patch is None:
        return 0
    rows, cols = trace.patch_grid
    n = rows * cols
    if not 0 <= patch < n:
        raise InputError(f"patch {patch} is out of range: the grid has {n} patches (0..{n - 1})")
    return trace.n_prefix_tokens + int(patch)


def prefix_tokens_named(trace: Trace) -> str:
    """The tokens before the patches, in words: "class token", "class and distillation tokens" (DeiT), "class
    token and 4 registers" (DINOv2 with registers)."""
    registers = sum(token.startswith("[REG") for token in trace.tokens[: trace.n_prefix_tokens])
    if registers:
        return f"class token and {registers} register{'s' if registers > 1 else ''}"
    return "class token" if trace.n_prefix_tokens == 1 else "class and distillation tokens"


def key_weights(trace: Trace, layer: int, head: int, patch: int | None = None) -> np.ndarray:
    """One head's attention row [tokens] for the query (the class token, or patch `patch`): the weight it gives
    every key, the prefix tokens ([CLS], DeiT's [DIST], registers) first, then the patches; it sums to 1."""
    return np.asarray(trace.attention(layer, head)[query_token(trace, patch)], dtype=np.float64)  # that head alone


def attention_map(trace: Trace, layer: int, head: int | None, patch: int | None = None) -> np.ndarray:
    """[rows, cols]: how much the query (class token, or a patch) attends to each patch; head None: mean of heads.

    Not renormalised: the share the query gives the prefix tokens is `1 - map.sum()`.
    """
    w = trace.block_tensor("weights", layer)  # [heads, n, n], on the trace's device
    row = w[:, query_token(trace, patch), trace.n_prefix_tokens :]  # [heads, N]
    row = row.float().mean(0) if head is None else row[head]
    return np.asarray(to_host([row])[0], dtype=np.float64).reshape(trace.patch_grid)


def rollout(trace: Trace, head_fusion: str = "mean", discard_ratio: float = 0.9) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020), as vit-explain computes it: [n_tokens, n_tokens].

    Per layer: fuse the heads (mean / max / min), set the lowest `discard_ratio` of the fused weights
    to 0 (the class token's attention to itself is always kept), add the identity for the residual
    connection, (A + I) / 2, renormalise the rows, and multiply the layers from the first up.
    """
    if head_fusion not in FUSIONS:
        raise InputError(f"head fusion must be one of {FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise InputError(f"the discard ratio must be in [0, 1), got {discard_ratio}")
    if not reduces_on_device(trace.device):
        return _rollout_on_host(trace, head_fusion, discard_ratio)
    n = len(trace.tokens)
    exact = torch.float32 if trace.device.type == "mps" else torch.float64  # Apple's GPUs have no float64
    with torch.inference_mode():  # every layer on the GPU; the [n, n] result crosses to the host once
        eye = torch.eye(n, dtype=exact, device=trace.device)
        result = eye
        for layer in range(trace.n_layers):
            w = trace.block_tensor("weights", layer).to(exact)  # [heads, n, n]
            fused = w.mean(0) if head_fusion == "mean" else w.amax(0) if head_fusion == "max" else w.amin(0)
            flat = fused.reshape(-1).clone()
            drop = torch.sort(flat, stable=True).indices[: int(flat.numel() * discard_ratio)]
            flat[drop[drop != 0]] = 0.0
            a = (flat.reshape(n, n) + eye) / 2
            a = a / a.sum(-1, keepdim=True)
            result = a @ result
    return to_host([result])[0]


def _rollout_on_host(trace: Trace, head_fusion: str, discard_ratio: float) -> np.ndarray:
    n = len(trace.tokens)
    result = np.eye(n)
    for layer in range(trace.n_layers):
        w = np.asarray(trace.attention(layer), dtype=np.float64)  # [heads, n, n]
        fused = getattr(w, head_fusion)(axis=0)
        flat = fused.ravel().copy()
        drop = np.argsort(flat, kind="stable")[: int(flat.size * discard_ratio)]
        flat[drop[drop != 0]] = 0.0
        a = (flat.reshape(n, n) + np.eye(n)) / 2
        a /= a.sum(-1, keepdims=True)
        result = a @ result
    return result


def relevancy_map(model: TracedModel, data: bytes, name: str, class_id: int) -> np.ndarray:
    """[rows, cols]: the class token's gradient-weighted relevancy (Chefer et al. 2021; tformer_core.relevancy)
    over the patches for class `class_id` of a picture file: one forward and one backward pass. Unlike raw
    attention and rollout, which are the same whatever class is asked about, it follows the class's score."""
    vit = require_vit(model)
    assert vit.preprocessing is not None  # require_vit refuses a ViT without one
    probe = class_probe(vit, vit.preprocessing(read_image(data, name).image), int(class_id))
    relevance = relevancy(probe)[0].relevance  # [n, n]
    return relevance[0, vit.config.n_prefix_tokens :].reshape(vit.config.grid_hw)


def rollout_map(trace: Trace, head_fusion: str = "mean", discard_ratio: float = 0.9) -> np.ndarray:
    """[rows, cols]: the class token's row of the rollout over the patches."""
    return rollout(trace, head_fusion, discard_ratio)[0, trace.n_prefix_tokens :].reshape(trace.patch_grid)


# ---- the model's own pictures (ViT paper, Fig. 7) --------------------------------------------------
def embedding_filter_pcs(
    model: TracedModel, n: int = 28, tile_px: int = 32, columns: int = 7
) -> tuple[Image.Image, np.ndarray]:
    """The first `n` principal components of the patch-embedding filters as RGB P x P tiles (Fig. 7, left).

    The filters are the D rows of the linear patch embedding, each P*P*C numbers (channel-first);
    they are centred and the principal directions found by SVD. Each component is shown min-max
    scaled to 0..255. Returns (picture, share of the variance of each component shown).
    """
    model = require_vit(model)
    c = model.config
    patch = model.weights().patch
    assert patch is not None  # a ViT's stack embeds patches
    w = to_numpy(patch.W).reshape(patch.W.shape[0], -1).astype(np.float64)  # [D, C*P*P], channel first
    centred = w - w.mean(0, keepdims=True)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    n = min(n, vt.shape[0])
    variance = (s**2) / (s**2).sum()
    pictures = []
    for i in range(n):
        comp = vt[i].reshape(c.n_channels, c.patch_size, c.patch_size).transpose(1, 2, 0)  # [P, P, C]
        lo, hi = comp.min(), comp.max()
        rgb = np.round((comp - lo) / (hi - lo or 1.0) * 255).astype(np.uint8)
        if rgb.shape[-1] == 1:
            rgb = np.repeat(rgb, 3, axis=-1)
        pictures.append(Image.fromarray(rgb[..., :3]).resize((tile_px, tile_px), Image.Resampling.NEAREST))
    return tiles(pictures, [str(i + 1) for i in range(n)], columns, tile_px, gap=4, label_px=12), variance[:n]


def _unit_positions(model: TracedModel) -> np.ndarray:
    """[N, D] the patches' position embeddings (prefix tokens left out), each scaled to length 1."""
    model = require_vit(model)
    positions = model.weights().W_pos
    assert positions is not None  # a ViT's positions are learned
    pos = to_numpy(positions)[model.config.n_prefix_tokens :].astype(np.float64)  # [N, D]
    return pos / np.maximum(np.linalg.norm(pos, axis=1, keepdims=True), 1e-12)


def position_similarity(model: TracedModel) -> np.ndarray:
    """[N, N] cosine similarity between the position embeddings of the patches (prefix tokens left out)."""
    unit = _unit_positions(model)
    return unit @ unit.T


# Fig. 7's centre holds a map per patch, each as large as the grid: its pixels grow with the grid's fourth power
# (a 96 x 96 grid drew 18,622 x 18,622 pixels, 347 megapixels, which Pillow refuses as a decompression bomb).
# Grids up to MAX_MAPS_PER_SIDE a side (ViT-B/16 at 384 pixels: 24) show every patch's map; larger ones every
# k-th patch's in each direction, and the picture stays within MAX_FIGURE_PX a side.
MAX_MAPS_PER_SIDE = 24
MAX_FIGURE_PX = 2048


def similarity_map_step(grid_hw: tuple[int, int]) -> int:
    """Every how many patches (in each direction) Fig. 7's centre shows a map: 1 (all) up to 24 a side."""
    return -(-max(grid_hw) // MAX_MAPS_PER_SIDE)


def position_similarity_maps(model: TracedModel, cell_px: int = 2, gap: int = 2) -> Image.Image:
    """Fig. 7, centre: for each patch (placed at its spot in the grid), a small map of its position
    embedding's cosine similarity with every patch's (-1 blue .. 1 red). A grid larger than 24 patches a side
    shows the maps of every k-th patch (`similarity_map_step`), at most 2048 pixels a side in all."""
    unit = _unit_positions(model)
    rows, cols = require_vit(model).config.grid_hw
    step = similarity_map_step((rows, cols))
    shown_rows, shown_cols = range(0, rows, step), range(0, cols, step)
    k = max(cell_px, 42 // max(rows, cols))  # small grids get larger maps
    fits = (MAX_FIGURE_PX + gap) // max(len(shown_rows), len(shown_cols)) - gap
    scale = min(1.0, fits / (max(rows, cols) * k))
    map_h, map_w = max(1, round(rows * k * scale)), max(1, round(cols * k * scale))
    width, height = len(shown_cols) * (map_w + gap) - gap, len(shown_rows) * (map_h + gap) - gap
    canvas = Image.new("RGB", (width, height), "white")
    for r_shown, r in enumerate(shown_rows):
        for c_shown, c in enumerate(shown_cols):
            sim = unit @ unit[r * cols + c]  # [N]: this patch's similarity with every patch
            colours = colourise(sim.reshape(rows, cols), "coolwarm", lo=-1.0, hi=1.0)
            tile = Image.fromarray(colours).resize((map_w, map_h), Image.Resampling.NEAREST)
            canvas.paste(tile, (c_shown * (map_w + gap), r_shown * (map_h + gap)))
    return canvas


def read_pictures(files: Iterable[tuple[str, bytes]], names: list[str], refused: list[str]) -> Iterator[Image.Image]:
    """Decode files one at a time, as they are consumed: a big photo is decoded only once the one before it
    has been used, so twenty 56-megapixel pictures never sit in memory together. The names of the
    pictures yielded are appended to `names`, the messages of the files refused to `refused`."""
    for name, data in files:
        try:
            image = read_image(data, name).image
        except ImageError as error:
            refused.append(str(error))
            continue
        names.append(name)
        yield image


def head_overlays(
    result: VisionResult, layer: int, patch: int | None, alpha: float = 0.6, smooth: bool = True, tile_px: int = 180
) -> Image.Image:
    """Every head's attention of one query (class token or a patch) in `layer` over the picture, then
    the mean of the heads, side by side; each picture is scaled to its own maximum."""
    trace = result.trace
    maps = [attention_map(trace, layer, h, patch) for h in range(trace.n_heads)] + [
        attention_map(trace, layer, None, patch)
    ]
    shown = [overlay(result.image, m, alpha=alpha, smooth=smooth) for m in maps]
    labels = [f"head {h}" for h in range(trace.n_heads)] + ["mean"]
    return tiles(shown, labels, columns=min(len(shown), 7), tile_px=tile_px)
