"""Tokens as the views show them, and which positions a view shows.

Hiding special tokens ([CLS], [SEP], <s>, </s>, BOS...) drops their rows and columns from a view;
`visible_positions` says which positions remain. Long inputs are shown a window at a time in the
detail views (`token_window`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Labels that mark sequence boundaries rather than words (BERT, RoBERTa/BART, GPT-2, the toy models).
# [MASK] is a word slot, not a boundary: it is never hidden.
SPECIAL_TOKENS = frozenset(
    {"[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>", "<|endoftext|>", "<bos>", "<eos>", "<cls>", "<sep>"}
)

# Detail views (head view, heatmap, Q/K/V) draw every cell as data: beyond this many tokens they show
# a window of the input, so a 512-token input does not send megabytes of chart data per view.
MAX_DETAIL_TOKENS = 64


def display_token(token: str) -> str:
    """A token as shown: byte-level BPE / sentencepiece space markers become a visible space '␣',
    a byte-level newline '↵'; an empty token '∅'. The one place token labels are made readable."""
    token = str(token).replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "↵")
    return token if token else "∅"


def display_tokens(tokens: Sequence[str]) -> list[str]:
    return [display_token(t) for t in tokens]


def plain_word(token: str) -> str:
    """A token as a plain word, space markers dropped: "Ġcat" -> "cat", "▁Haus" -> "Haus"."""
    return display_token(token).replace("␣", "").strip()


def visible_positions(tokens: Sequence[str], hide_special: bool) -> np.ndarray:
    """Positions shown: all, or all but the special tokens (int array)."""
    keep = [i for i, t in enumerate(tokens) if not (hide_special and t in SPECIAL_TOKENS)]
    return np.asarray(keep if keep else range(len(tokens)), dtype=np.int64)


def token_window(n: int, start: int, size: int = MAX_DETAIL_TOKENS) -> slice:
    """Positions [start, start + size) clipped to n tokens (detail views of long inputs)."""
    start = int(min(max(start, 0), max(n - size, 0)))
    return slice(start, min(n, start + size))
