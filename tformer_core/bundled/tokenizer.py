"""The bundled translator's word-level tokenizer: a fixed vocabulary, one id per word."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..tokenizers import word_ends

__all__ = ["BOS", "EOS", "PAD", "SPECIAL_TOKENS", "UNK", "WordTokenizer"]

# Every vocabulary of the bundled models starts with these, ids 0, 1, 2, 3 (the loader checks them).
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

# Sentence punctuation is dropped rather than turned into <unk>: the toy languages have none,
# and "The dog sleeps." should read as the sentence the user meant.
_PUNCTUATION = re.compile(r"[.,!?;:\"]")


class WordTokenizer:
    """Word-level tokenizer over a fixed vocabulary: lower-case, drop punctuation, split on spaces.

    Implements `tformer_core.tokenizers.Tokenizer`. Unknown words become `<unk>` (shown as `<unk>`,
    never silently replaced by a known word). Special tokens written in the text (`<bos>`, ...) map
    to themselves. With `prepend_bos` (the decoder's side), `encode` starts the ids with `<bos>`,
    unless the text already starts with it.
    """

    mask_token = None
    mask_token_id = None

    def __init__(self, vocab: Sequence[str], prepend_bos: bool = False) -> None:
        vocab = list(vocab)
        if list(vocab[: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
            raise ValueError(f"a vocabulary must start with the special tokens {SPECIAL_TOKENS}, got {vocab[:4]}")
        if len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary lists a word twice")
        self.vocab: list[str] = vocab
        self.index: dict[str, int] = {w: i for i, w in enumerate(vocab)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.index[t] for t in (PAD, BOS, EOS, UNK))
        self.prepend_bos = prepend_bos

    def __len__(self) -> int:
        return len(self.vocab)

    def words(self, text: str) -> list[str]:
        """The words `encode` sees: lower-cased, punctuation dropped, split on whitespace."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        return _PUNCTUATION.sub(" ", text.lower()).split()

    def unknown_words(self, text: str) -> list[str]:
        """The words of `text` that are not in the vocabulary (each becomes `<unk>`), each once."""
        return list(dict.fromkeys(w for w in self.words(text) if w not in self.index))

    def encode_target(self, text: str) -> list[int]:
        return [self.index.get(w, self.unk_id) for w in self.words(text)]

    def encode(self, text: str) -> list[int]:
        ids = self.encode_target(text)
        if self.prepend_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def encode_pair(self, text: str, pair: str) -> tuple[list[int], list[int] | None]:
        raise ValueError("the bundled translator reads one sentence, not a pair")

    def count(self, text: str, pair: str | None = None) -> int:
        if pair is not None:
            self.encode_pair(text, pair)
        return len(self.encode(text))

    def count_content(self, text: str) -> int:
        return len(self.words(text))

    def cut_points(self, text: str) -> list[int]:
        return word_ends(text)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"token id {i} is outside the vocabulary (0..{len(self.vocab) - 1})")
            out.append(self.vocab[i])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, special tokens other than <unk> left out."""
        skip = {self.pad_id, self.bos_id, self.eos_id}
        return " ".join(self.vocab[int(i)] for i in ids if int(i) not in skip)

    def labels(self, vocab_size: int) -> list[str]:
        return self.vocab[:vocab_size] + [f"<{i}>" for i in range(len(self.vocab), vocab_size)]

    chat_template = None  # the translator reads sentences, not conversations

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        raise ValueError("the bundled translator has no chat template")
