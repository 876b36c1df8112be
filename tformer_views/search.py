"""Finding heads: which layer and head link a query token to a key token.

    rows = query_rows(trace, query)                 # [layers, heads, keys]: the query's weights everywhere
    grid = rows[..., key]                           # [layers, heads]: every head's weight for the pair
    ranked_heads(grid, 5)                           # [(layer, head, weight), ...], strongest first
    default_key(trace.tokens, query)                # the key a lecture asks about, when the input is the lecture's

The lecture's question on the default sentence, "which heads tell the model that *it* is the animal?",
takes one look instead of clicking through 72 heads.
"""

from __future__ import annotations

import numpy as np
import torch

from tformer_core.errors import InputError
from tformer_core.trace import Trace, reduces_on_device, to_host

from .tokens import SPECIAL_TOKENS, plain_word

__all__ = ["LECTURE_PAIRS", "content_keys", "default_key", "query_rows", "ranked_heads"]

# The lecture's pairs: on these sentences, the question is what "it" refers to.
LECTURE_PAIRS = {"it": ("animal", "trophy", "cat", "suitcase", "street")}


def query_rows(trace: Trace, query: int, stack: str | None = None) -> np.ndarray:
    """[layers, heads, n_k]: the weights of one query token in every head of every layer (float32)."""
    stack = stack or trace.main_stack
    n_q = len(trace.tokens_for(stack)[0])
    if not 0 <= query < n_q:
        raise InputError(f"query {query} is out of range: the input has {n_q} tokens (0..{n_q - 1})")
    layers = range(trace.layers_in(stack))
    rows = [trace.block_tensor("weights", layer, None, stack)[:, query, :] for layer in layers]
    if not reduces_on_device(trace.device):
        return np.stack(to_host(rows))  # views of the CPU's weights
    with torch.inference_mode():  # the row is picked in every layer on the GPU: one transfer
        stacked = torch.stack(rows)
    return to_host([stacked])[0]


def ranked_heads(grid: np.ndarray, top: int = 5) -> list[tuple[int, int, float]]:
    """The `top` (layer, head, weight) of a [layers, heads] grid, strongest first (ties: lower layer, head)."""
    flat = np.asarray(grid, dtype=np.float64).ravel()
    order = np.argsort(-flat, kind="stable")[: max(int(top), 0)]
    heads = grid.shape[1]
    return [(int(i // heads), int(i % heads), float(flat[i])) for i in order]


def default_key(tokens: tuple[str, ...] | list[str], query: int, fallback: int) -> int:
    """The key a lecture asks about for this query: for "it", the first of the lecture's nouns in the
    sentence (the animal, the trophy...); else `fallback` (e.g. the strongest key of the head shown)."""
    words = [plain_word(t).lower() for t in tokens]
    for candidate in LECTURE_PAIRS.get(words[query] if 0 <= query < len(words) else "", ()):
        if candidate in words:
            return words.index(candidate)
    return fallback


def content_keys(tokens: tuple[str, ...] | list[str]) -> list[int]:
    """Positions of the tokens that are not special ([CLS], [SEP], <s>...)."""
    return [i for i, t in enumerate(tokens) if t not in SPECIAL_TOKENS] or list(range(len(tokens)))
