"""What the core asks of a tokenizer, and the adapter that gives a Hugging Face tokenizer that shape.

Two kinds of tokenizer reach the models: a checkpoint's own (transformers, fast or slow, any family)
and the bundled models' word-level one (`tformer_core.bundled.tokenizer.WordTokenizer`). Both offer
`Tokenizer`, so the models, the input fitting and the views call one set of methods and never ask
which kind they hold.

Token labels are kept as the tokenizer writes them ("Ġcat", "▁Haus", "##s"); turning the space
markers into something readable is the views' job (`tformer_views.tokens.display_token`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .errors import InputError

__all__ = ["HFTokenizer", "Tokenizer", "readable", "require_readable", "word_ends"]


@runtime_checkable
class Tokenizer(Protocol):
    """The calls the core and the views make of a tokenizer."""

    @property
    def mask_token(self) -> str | None:
        """The text that marks a word to guess ("[MASK]", "<mask>"), or None."""

    @property
    def mask_token_id(self) -> int | None: ...

    def __len__(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """The ids a model reads for `text`, special tokens included."""

    def encode_pair(self, text: str, pair: str) -> tuple[list[int], list[int] | None]:
        """Two segments joined as the model expects them (BERT's sentence A and B): ids and segment ids."""

    def encode_target(self, text: str) -> list[int]:
        """The target side of a translation pair: ids without the decoder's start token."""

    def count(self, text: str, pair: str | None = None) -> int:
        """How many ids `encode` (or `encode_pair`) gives, special tokens included."""

    def count_content(self, text: str) -> int:
        """How many ids the text itself takes, without special tokens."""

    def cut_points(self, text: str) -> list[int]:
        """Character offsets at which the text may be cut between tokens (the last is len(text))."""

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Ids as text, special tokens left out (an unknown-word token stays visible)."""

    def unknown_words(self, text: str) -> list[str]:
        """The parts of `text` the vocabulary cannot represent (each read as the unknown token)."""

    def labels(self, vocab_size: int) -> list[str]:
        """A label for every output id of a model with `vocab_size` outputs (ids past the vocabulary: "<id>")."""

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's chat template (Jinja), or None when it has none."""

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        """The conversation `messages` ([{"role": "user", "content": "..."}, ...]) as the text the model
        continues, the assistant's turn opened. ValueError without a chat template."""


def word_ends(text: str) -> list[int]:
    """Offsets just after each word (and len(text)): where a tokenizer without offsets may be cut."""
    points = [i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()]
    if not points or points[-1] != len(text):
        points.append(len(text))
    return points


class HFTokenizer:
    """A transformers tokenizer behind `Tokenizer`. `hf` is the wrapped tokenizer itself.

    verbose=False on every call: transformers otherwise warns that a long input exceeds the model,
    which is exactly what the input fitting measures before it cuts the text.
    """

    def __init__(self, hf: Any) -> None:
        self.hf = hf

    @property
    def mask_token(self) -> str | None:
        return self.hf.mask_token if self.hf.mask_token_id is not None else None

    @property
    def mask_token_id(self) -> int | None:
        return self.hf.mask_token_id

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text, verbose=False)["input_ids"])

    def encode_pair(self, text: str, pair: str) -> tuple[list[int], list[int] | None]:
        encoded = self.hf(text, pair, verbose=False)
        types = encoded.get("token_type_ids")
        return list(encoded["input_ids"]), (list(types) if types is not None else None)

    def encode_target(self, text: str) -> list[int]:
        return list(self.hf(text_target=text, verbose=False)["input_ids"])  # Marian has a separate target side

    def count(self, text: str, pair: str | None = None) -> int:
        return len(self.hf(text, pair, verbose=False)["input_ids"])

    def count_content(self, text: str) -> int:
        return len(self.hf(text, add_special_tokens=False, verbose=False)["input_ids"])

    def cut_points(self, text: str) -> list[int]:
        if not self.hf.is_fast:  # slow tokenizers give no offsets: cut between words
            return word_ends(text)
        offsets = self.hf(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        points = sorted({int(end) for _, end in offsets if end > 0})
        if not points or points[-1] != len(text):
            points.append(len(text))
        return points

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        tokens = self.hf.convert_ids_to_tokens([int(i) for i in ids])
        return [t if t is not None else f"<{int(i)}>" for i, t in zip(ids, tokens)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=True)

    def unknown_words(self, text: str) -> list[str]:
        unk = self.hf.unk_token_id
        if unk is None or not self.hf.is_fast:
            return []
        encoded = self.hf(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        spans = [text[a:b] for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if i == unk]
        return list(dict.fromkeys(s for s in spans if s.strip()))

    def labels(self, vocab_size: int) -> list[str]:
        n = min(len(self.hf), vocab_size)
        return self.convert_ids_to_tokens(range(n)) + [f"<{i}>" for i in range(n, vocab_size)]

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.hf, "chat_template", None)  # transformers' tokenizers without one lack it
        return template if isinstance(template, str) and template else None

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        if self.chat_template is None:
            raise InputError("this tokenizer has no chat template: give the prompt as plain text")
        return str(self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))


def readable(text: str) -> bool:
    """True when `text` has a character a reader can see: not only spaces, control characters (NUL, ...)
    and invisible format characters (zero-width space and joiners, direction marks, the BOM)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn") for ch in text)


def require_readable(text: str, what: str = "input") -> None:
    """ValueError with a message for the user when `text` is empty or has no readable character."""
    if not text.strip():
        raise InputError(f"the {what} is empty: type at least one word")
    if not readable(text):
        raise InputError(
            f"the {what} has no readable text: it holds only invisible characters (control characters such as "
            "NUL, zero-width spaces or direction marks). Type or paste some words."
        )
