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


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable Latin-1 bytes stand for themselves, the
    other 68 (space, newline, control bytes...) for the characters from U+0100 on (space is 'Ġ', newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            alphabet[chr(256 + shifted)] = b
            shifted += 1
    return alphabet


BYTE_LEVEL = _byte_level_alphabet()
SHIFTED = frozenset(c for c in BYTE_LEVEL if ord(c) >= 256)  # characters only byte-level BPE writes


def _from_byte_level(token: str) -> str | None:
    """The text a byte-level BPE token (GPT-2, RoBERTa, Llama 3, SmolLM2) stands for: "Ġcat" -> " cat",
    "âĢĻ" -> "’". None when the token is not written in that alphabet or its bytes are not whole UTF-8
    characters; a token with the alphabet's own shifted characters whose bytes are a piece of a character
    is shown as the bytes ("\xe2\x80")."""
    if not token or any(c not in BYTE_LEVEL for c in token) or token.isascii():
        return None
    data = bytes(BYTE_LEVEL[c] for c in token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # A Latin-1 word of a WordPiece vocabulary ("café") is no byte-level token: keep it as written.
        return data.decode("utf-8", errors="backslashreplace") if any(c in SHIFTED for c in token) else None


def display_token(token: str) -> str:
    """A token as shown: byte-level BPE tokens as the text they stand for ("âĢĻ" -> "’"); spaces, whether
    byte-level 'Ġ' or sentencepiece '▁', as a visible '␣', newlines as '↵'; an empty token '∅'. The one place
    token labels are made readable."""
    token = str(token)
    decoded = _from_byte_level(token)
    if decoded is not None:
        visible = {" ": "␣", "\n": "↵", "\t": "⇥"}
        token = "".join(visible.get(c, c if c.isprintable() else c.encode("unicode_escape").decode()) for c in decoded)
    token = token.replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "↵")
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
