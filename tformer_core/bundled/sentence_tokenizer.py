"""The word tokenizer of the models trained on real English sentences (the movie snippets).

Like the translator's `WordTokenizer` (a fixed vocabulary, one id per word, unknown words as `<unk>`,
shown as such), but words are read the way English is written: lower-cased, letters and digits with an
apostrophe kept inside a word ("doesn't", "film's"), every other character a separator. The vocabulary is
the training split's words that occur at least twice (`build_vocabulary`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from .tokenizer import SPECIAL_TOKENS, WordTokenizer

__all__ = ["SentenceTokenizer", "build_vocabulary", "sentence_words"]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def sentence_words(text: str) -> list[str]:
    """The words of an English sentence as the models read them."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def build_vocabulary(texts: Iterable[str], min_count: int = 2) -> list[str]:
    """The special tokens, then every word seen at least `min_count` times, most frequent first (ties in
    alphabetical order, so the same texts always give the same vocabulary)."""
    counts = Counter(w for text in texts for w in sentence_words(text))
    words = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
    return [*SPECIAL_TOKENS, *words]


class SentenceTokenizer(WordTokenizer):
    """`WordTokenizer` reading English words (see the module); `prepend_bos` puts `<bos>` first, the token
    a Transformer classifier reads its label from (its [CLS])."""

    def words(self, text: str) -> list[str]:
        return sentence_words(text)
