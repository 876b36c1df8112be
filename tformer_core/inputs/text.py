"""Text cut to what a model can read: at a token boundary, longest segment first, with a count of what was cut.

    fitted = fit_to_model(model, text)          # FittedInput(text, pair, n_tokens, n_dropped, max_tokens)
    trace = model.trace(fitted.text)

A 10,000-word paste is cut to the model's maximum (512 tokens for BERT) instead of being refused,
and the page says how many tokens were dropped.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from ..errors import InputError
from ..tokenizers import Tokenizer, require_readable

__all__ = ["FittedInput", "TextReader", "fit_to_model"]


class FittedInput(NamedTuple):
    """Text (and second segment) cut so the model can read it; counts in tokens, special tokens included."""

    text: str
    pair: str | None
    n_tokens: int  # tokens the model reads
    n_dropped: int  # tokens cut off the end(s) of the input
    max_tokens: int | None  # the model's maximum (None: no limit)


def _prefix(tokenizer: Tokenizer, text: str, keep: int) -> str:
    """The longest prefix of `text` cut at a token end that tokenizes to at most `keep` tokens."""
    if keep <= 0:
        return ""
    points = tokenizer.cut_points(text)
    lo, hi = 0, min(len(points), keep + 1)  # the k-th token end covers about k tokens
    best = ""
    while lo < hi:  # binary search: token counts grow with the prefix
        mid = (lo + hi) // 2
        candidate = text[: points[mid]]
        if tokenizer.count_content(candidate) <= keep:
            best, lo = candidate, mid + 1
        else:
            hi = mid
    return best.rstrip()


def _split_budget(budget: int, n_a: int, n_b: int) -> tuple[int, int]:
    """Longest first (as BERT's tokenizers truncate pairs): cut the longer segment until both fit."""
    if n_a + n_b <= budget:
        return n_a, n_b
    short = min(n_a, n_b)
    if short <= budget // 2:
        return (n_a, budget - n_a) if n_a == short else (budget - n_b, n_b)
    return budget - budget // 2, budget // 2


class TextReader(Protocol):
    """What `fit_to_model` reads of a model: every TracedModel is one (a view may pass a lower maximum)."""

    @property
    def tokenizer(self) -> Tokenizer | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def max_tokens(self) -> int | None: ...


def fit_to_model(model: TextReader, text: str, pair: str | None = None) -> FittedInput:
    """`text` (and `pair`, BERT's sentence B) cut at a token boundary so the whole input fits the model (its
    positions, or the fewer tokens one pass reads on this server: `TracedModel.pass_tokens`).

    Decoder-only models take no second segment (it is ignored). Raises ValueError for an empty
    sentence, or one of invisible characters only. n_dropped counts the tokens cut off, so the page
    can say so.
    """
    if not isinstance(text, str):
        raise InputError("the sentence is empty: type at least one word")
    require_readable(text, "sentence")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise InputError("this model has no tokenizer, so it cannot read text")
    pair = pair if (pair and pair.strip() and model.kind == "encoder") else None
    if pair is not None:
        require_readable(pair, "second segment")
    text = text.strip()
    pair = pair.strip() if pair else None
    limit = model.max_tokens
    passes = getattr(model, "pass_tokens", None)  # the server's limit for one pass (TracedModel.pass_tokens)
    if passes is not None and (limit is None or passes < limit):
        limit = passes
    total = tokenizer.count(text, pair)
    if tokenizer.count_content(text) == 0:
        raise InputError("the tokenizer finds no tokens in the sentence (only characters it drops): type some words")
    if limit is None or total <= limit:
        return FittedInput(text, pair, total, 0, limit)
    n_a = tokenizer.count_content(text)
    n_b = tokenizer.count_content(pair) if pair is not None else 0
    budget = limit - (total - n_a - n_b)  # room left after [CLS], [SEP]...
    if budget < (2 if pair is not None else 1):
        raise InputError(f"this model reads at most {limit} tokens, too few for this input")
    for _ in range(8):  # re-tokenizing a cut text can merge pieces differently: shrink until it fits
        keep_a, keep_b = _split_budget(budget, n_a, n_b)
        cut_a = _prefix(tokenizer, text, keep_a)
        cut_b = _prefix(tokenizer, pair, keep_b) if pair is not None else None
        if cut_a and (pair is None or cut_b):
            n = tokenizer.count(cut_a, cut_b)
            if n <= limit:
                return FittedInput(cut_a, cut_b, n, total - n, limit)
            budget -= n - limit
        else:
            budget -= 1
    raise InputError(f"this input cannot be cut to the model's {limit} tokens")
