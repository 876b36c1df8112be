"""Tokens as the views show them, and which positions a view shows.

Hiding special tokens ([CLS], [SEP], <s>, </s>, BOS...) drops their rows and columns from a view;
`visible_positions` says which positions remain. Long inputs are shown a window at a time in the
detail views (`token_window`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

__all__ = [
    "BYTE_LEVEL",
    "MAX_DETAIL_TOKENS",
    "MAX_PIECES",
    "SHIFTED",
    "SPECIAL_TOKENS",
    "UNKNOWN_TOKENS",
    "display_next",
    "display_token",
    "display_tokens",
    "ends_inside_a_character",
    "plain_word",
    "text_changes",
    "token_window",
    "visible_positions",
]

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
        token = "".join(_visible(c) for c in decoded)
    token = token.replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "↵")
    return token if token else "∅"


def display_tokens(tokens: Sequence[str]) -> list[str]:
    """Tokens as shown (`display_token`), and byte-level pieces of one character as that character: a character a
    byte-level BPE split over several tokens ("á»" + "ĵ" = the bytes of "ồ") is shown on each of its pieces with
    which piece it is, "ồ(1/2)" and "ồ(2/2)", instead of bytes that mean nothing alone."""
    labels = [display_token(t) for t in tokens]
    raws = [_raw(t) for t in tokens]
    i = 0
    while i < len(tokens):
        j = _completed_by(raws, i)
        if j is None:
            i += 1
            continue
        labels[i : j + 1] = _pieces([r for r in raws[i : j + 1] if r is not None])  # none is None up to j
        i = j + 1
    return labels


def display_next(before: Sequence[str], token: str) -> str:
    """A token as shown where it would come next after the tokens `before` (a prediction): the character it
    completes when `before` ends inside one ("ĵ" after "á»": "ồ(2/2)"), or "⟨part of a character⟩" when it
    continues it without finishing it; "⟨start of a character⟩" after what it spells when it ends inside one;
    else as `display_token` shows it."""
    raw = _raw(token)
    if raw is None:
        return display_token(token)
    context = [_raw(t) for t in before[-(MAX_PIECES - 1) :]]
    for m in range(1, len(context) + 1):
        pieces = [p for p in context[-m:] if p is not None]
        if len(pieces) == m and _state(b"".join(pieces)) == "open":
            combined = _state(b"".join([*pieces, raw]))
            if combined == "whole":
                return _pieces([*pieces, raw])[-1]
            if combined == "open":  # more bytes of the character begun, not its last
                return "⟨part of a character⟩"
            break
    if _state(raw) == "open":
        whole = raw[: len(raw) - _open_tail(raw)].decode("utf-8")
        return "".join(_visible(c) for c in whole) + "⟨start of a character⟩"
    return display_token(token)


MAX_PIECES = 4  # a UTF-8 character has at most 4 bytes, so at most 4 byte-level tokens


def ends_inside_a_character(tokens: Sequence[str]) -> bool:
    """True when the last tokens are byte-level pieces of a character that is not finished (a model stopped
    writing after the first bytes of one)."""
    for m in range(1, min(MAX_PIECES, len(tokens)) + 1):
        raws = [r for r in (_raw(t) for t in tokens[-m:]) if r is not None]
        if len(raws) < m:
            return False
        state = _state(b"".join(raws))
        if state != "bad":
            return state == "open"
    return False


def _raw(token: str) -> bytes | None:
    """The bytes a token stands for when it is written in the byte-level alphabet, else None."""
    token = str(token)
    if not token or any(c not in BYTE_LEVEL for c in token):
        return None
    return bytes(BYTE_LEVEL[c] for c in token)


def _open_tail(data: bytes) -> int:
    """How many bytes at the end of `data` start a character that is not finished (0 when none)."""
    for n in range(1, min(4, len(data)) + 1):
        byte = data[-n]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the last character's first byte
            needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return n if n < needed else 0
    return 0


def _state(data: bytes) -> str:
    """ "whole" (valid UTF-8), "open" (valid up to a character it has only begun), or "bad"."""
    try:
        data.decode("utf-8")
        return "whole"
    except UnicodeDecodeError:
        pass
    tail = _open_tail(data)
    if tail:
        try:
            data[: len(data) - tail].decode("utf-8")
            return "open"
        except UnicodeDecodeError:
            pass
    return "bad"


def _completed_by(raws: list[bytes | None], i: int) -> int | None:
    """When token i ends inside a character that the next few byte-level tokens finish, the last of them."""
    first = raws[i]
    if first is None or _state(first) != "open":
        return None
    data = first
    for j in range(i + 1, min(i + MAX_PIECES, len(raws))):
        piece = raws[j]
        if piece is None:
            return None
        data += piece
        state = _state(data)
        if state == "whole":
            return j
        if state == "bad":
            return None
    return None


def _visible(c: str) -> str:
    return {" ": "␣", "\n": "↵", "\t": "⇥"}.get(c, c if c.isprintable() else c.encode("unicode_escape").decode())


def _pieces(raws: list[bytes]) -> list[str]:
    """Labels of tokens whose bytes (together) are whole UTF-8: each token's characters, a character split over
    several tokens written on each of them with the piece's number, "ồ(1/2)"."""
    bounds = [0]
    for raw in raws:
        bounds.append(bounds[-1] + len(raw))
    owner = [k for k, raw in enumerate(raws) for _ in raw]  # byte -> token
    labels = [""] * len(raws)
    start = 0
    for c in b"".join(raws).decode("utf-8"):
        end = start + len(c.encode("utf-8"))
        first, last = owner[start], owner[end - 1]
        for k in range(first, last + 1):
            labels[k] += _visible(c) if first == last else f"{_visible(c)}({k - first + 1}/{last - first + 1})"
        start = end
    return [label or "∅" for label in labels]


UNKNOWN_TOKENS = frozenset({"[UNK]", "<unk>", "<|unk|>"})  # the token a vocabulary writes for what it lacks


def text_changes(text: str, tokens: Sequence[str]) -> list[str]:
    """How a tokenizer changed the text it read, as phrases for one line ("it lowercases it", "strips accents
    (mèo → meo)", "has no token for 🐱, written [UNK]"); empty when its tokens spell the text as typed (a
    byte-level BPE's do). The user's text is compared with what the tokens spell, WordPiece's "##" joined."""
    spelled = "".join(
        plain_word(t).removeprefix("##") for t in tokens if t not in SPECIAL_TOKENS and t not in UNKNOWN_TOKENS
    )
    changes = []
    if any(c.isupper() for c in text) and not any(c.isupper() for c in spelled):
        changes.append("lowercases it")
    accented = [w for w in text.split() if _bare(w) != w and any(c.isalpha() for c in w)]
    if accented and _bare(spelled) == spelled:
        word = accented[0]
        changes.append(f"strips accents ({word} → {_bare(word).lower() if changes else _bare(word)})")
    unknown = [t for t in tokens if t in UNKNOWN_TOKENS]
    if unknown:
        known = set(_bare(spelled).lower())
        missing = list(dict.fromkeys(c for c in text if not c.isspace() and _bare(c).lower() not in known))
        what = ", ".join(missing[:3]) + ("…" if len(missing) > 3 else "") if missing else "part of it"
        changes.append(f"has no token for {what}, written {unknown[0]}")
    return changes


def _bare(text: str) -> str:
    """`text` without its accents (é -> e): its letters' combining marks dropped."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))


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
