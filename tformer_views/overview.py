"""Every head of every layer as one picture: the layers x heads overview (BertViz's model view, as a PNG).

A 12 x 12 model at 512 tokens has 37.7 million attention weights; the overview sends one PNG of about
a megabyte at most: each head's matrix is averaged over blocks of tokens down to at most THUMBNAIL_PX
pixels a side and coloured on its own scale.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image, ImageDraw

from tformer_core.trace import Trace, reduces_on_device, to_host

from .colour import colourise
from .pictures import label_font
from .text import allowed_cells, head_matrix, shown_weights
from .tokens import visible_positions

__all__ = ["THUMBNAIL_PX", "Overview", "block_mean", "block_mean_tensor", "overview", "overview_thumbnails"]

THUMBNAIL_PX = 64  # the largest side of one head's thumbnail in the overview picture


def block_mean(a: np.ndarray, size: int = THUMBNAIL_PX) -> np.ndarray:
    """Average [..., n_q, n_k] over blocks so that neither side exceeds `size` (no change when it fits).

    Blocks are ceil(n / size) positions wide; the last block of a side may be narrower, and is
    averaged over the positions it has.
    """
    out = np.asarray(a)
    for axis in (-2, -1):
        n = out.shape[axis]
        b = -(-n // size)
        if b == 1:
            continue
        m = -(-n // b)
        pad = [(0, 0)] * out.ndim
        pad[axis] = (0, m * b - n)
        padded = np.pad(out, pad) if m * b != n else out
        if axis == -2:
            summed = padded.reshape(*padded.shape[:-2], m, b, padded.shape[-1]).sum(-2, dtype=np.float64)
            counts = np.minimum(b, n - np.arange(m) * b)[:, None]
        else:
            summed = padded.reshape(*padded.shape[:-1], m, b).sum(-1, dtype=np.float64)
            counts = np.minimum(b, n - np.arange(m) * b)
        out = summed / counts
    return np.asarray(out, dtype=np.float64)


def block_mean_tensor(t: torch.Tensor, size: int = THUMBNAIL_PX) -> torch.Tensor:
    """`block_mean` on a tensor, where it is (a GPU's attention stays there): [..., m_q, m_k], float32.

    An average pooling with blocks as wide as its stride: with ceil_mode the last, narrower block of a side is
    averaged over the positions it has (the pooling divides by the cells inside the input), as `block_mean`.
    """
    n_q, n_k = t.shape[-2:]
    b_q, b_k = -(-n_q // size), -(-n_k // size)
    flat = t.reshape(-1, n_q, n_k).float()  # (channels, H, W) as the pooling reads them
    if b_q == b_k == 1:
        return flat.reshape(t.shape)
    pooled = torch.nn.functional.avg_pool2d(flat, (b_q, b_k), stride=(b_q, b_k), ceil_mode=True)
    return pooled.reshape(*t.shape[:-2], *pooled.shape[-2:])


@dataclass(frozen=True)
class Overview:
    """Every head of every layer as one PNG picture.

    thumbs: [layers, heads, m_q, m_k] block-averaged weights (NaN where every cell is masked);
    block: tokens per thumbnail pixel before upscaling; zoom: screen pixels per thumbnail pixel
    (short inputs are enlarged to about THUMBNAIL_PX); origin: top-left pixel of thumbnail (0, 0).
    """

    png: bytes
    thumbs: np.ndarray
    block: int
    zoom: int
    origin: tuple[int, int]
    gap: int
    n_tokens: tuple[int, int]
    hidden_share: np.ndarray = field(repr=False)  # [layers, heads] mean share of attention on hidden tokens

    @property
    def cell_px(self) -> tuple[int, int]:
        """(height, width) of one thumbnail on screen, in pixels."""
        return self.thumbs.shape[-2] * self.zoom, self.thumbs.shape[-1] * self.zoom

    def box(self, layer: int, head: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) pixels of one thumbnail in the picture (PIL crop box)."""
        h, w = self.cell_px
        left = self.origin[0] + head * (w + self.gap)
        top = self.origin[1] + layer * (h + self.gap)
        return left, top, left + w, top + h


def overview_thumbnails(
    trace: Trace, stack: str | None = None, hide_special: bool = False, size: int = THUMBNAIL_PX
) -> tuple[np.ndarray, np.ndarray, int]:
    """([layers, heads, m_q, m_k] block means of the shown weights, [layers, heads] hidden share, block size).

    One layer at a time, so a 512-token, 12 x 12 model never holds all its weights twice. On a GPU every layer
    is reduced there and the thumbnails cross to the host once; on the CPU numpy reduces the weights in place.
    Blocks in which every cell is masked are NaN (drawn grey).
    """
    stack = stack or trace.main_stack
    q_tokens, k_tokens = trace.tokens_for(stack)
    queries, keys = visible_positions(q_tokens, hide_special), visible_positions(k_tokens, hide_special)
    if reduces_on_device(trace.device):
        thumbs, shares = _thumbnails_on_device(trace, stack, queries, keys, len(keys) < len(k_tokens), size)
    else:
        thumbs, shares = _thumbnails_on_host(trace, stack, hide_special, size)
    n_tokens = max(len(queries), len(keys))
    return thumbs, shares, -(-n_tokens // size)


def _thumbnails_on_host(trace: Trace, stack: str, hide_special: bool, size: int) -> tuple[np.ndarray, np.ndarray]:
    thumbs, shares = [], []
    for layer in range(trace.layers_in(stack)):
        m = head_matrix(trace, layer, None, stack, hide_special, None, widen=False)
        thumb = block_mean(m.weights, size)
        if m.allowed is not None:
            thumb = np.where(block_mean(m.allowed.astype(np.float64), size) > 0, thumb, np.nan)
        thumbs.append(thumb)
        shares.append(m.hidden_share.mean(-1))
    return np.stack(thumbs), np.stack(shares)


def _thumbnails_on_device(
    trace: Trace, stack: str, queries: np.ndarray, keys: np.ndarray, hidden: bool, size: int
) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        thumbs, shares = [], []
        for layer in range(trace.layers_in(stack)):
            weights, hidden_share = shown_weights(trace, layer, stack, queries, keys, hidden)
            thumb = block_mean_tensor(weights, size)
            allowed = allowed_cells(trace, layer, stack, queries, keys)  # each layer's (sliding windows differ)
            if allowed is not None:
                thumb = torch.where(block_mean_tensor(allowed, size) > 0, thumb, torch.nan)
            thumbs.append(thumb)
            shares.append(hidden_share.mean(-1))
        host_thumbs, host_shares = to_host([torch.stack(thumbs), torch.stack(shares)])
    return host_thumbs.astype(np.float64), host_shares.astype(np.float64)


def overview(
    trace: Trace, stack: str | None = None, hide_special: bool = False, size: int = THUMBNAIL_PX, gap: int = 3
) -> Overview:
    """The layers x heads overview as one PNG: rows are layers, columns heads, each thumbnail <= `size` px.

    Each thumbnail is coloured on its own scale (viridis, 0 = dark, its largest weight = yellow):
    the point is the pattern of each head, which a shared scale would hide for diffuse heads.
    """
    stack = stack or trace.main_stack
    thumbs, shares, block = overview_thumbnails(trace, stack, hide_special, size)
    n_layers, n_heads, mq, mk = thumbs.shape
    zoom = max(1, size // max(mq, mk))
    ch, cw = mq * zoom, mk * zoom
    left, top = 34, 16
    width = left + n_heads * (cw + gap)
    height = top + n_layers * (ch + gap)
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    for layer in range(n_layers):
        for head in range(n_heads):
            rgb = colourise(thumbs[layer, head], "viridis", lo=0.0)
            if zoom > 1:
                rgb = rgb.repeat(zoom, 0).repeat(zoom, 1)
            y0, x0 = top + layer * (ch + gap), left + head * (cw + gap)
            canvas[y0 : y0 + ch, x0 : x0 + cw] = rgb
    image = Image.fromarray(canvas)
    draw, font = ImageDraw.Draw(image), label_font(11)
    for head in range(n_heads):
        draw.text((left + head * (cw + gap) + cw // 2, top // 2), f"H{head}", fill=(60, 60, 60), font=font, anchor="mm")
    for layer in range(n_layers):
        y = top + layer * (ch + gap) + ch // 2
        draw.text((left - 4, y), f"L{layer}", fill=(60, 60, 60), font=font, anchor="rm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    q_tokens, k_tokens = trace.tokens_for(stack)
    n_q = len(visible_positions(q_tokens, hide_special))
    n_k = len(visible_positions(k_tokens, hide_special))
    return Overview(buffer.getvalue(), thumbs, block, zoom, (left, top), gap, (n_q, n_k), shares)
