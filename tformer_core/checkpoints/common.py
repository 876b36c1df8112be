"""What every family converter shares: activations by Hugging Face name, tokenizer loading."""

from __future__ import annotations

from pathlib import Path

from ..generation import GenerationSettings
from ..tokenizers import HFTokenizer
from .weights import CheckpointError

DEFAULT_MAX_NEW_TOKENS = 64  # interactive use: a page shows every step

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def activation(name: str) -> str:
    try:
        return HF_ACTIVATIONS[name]
    except KeyError:
        raise CheckpointError(f"activation {name!r} is not supported yet") from None


def load_tokenizer(folder: Path) -> HFTokenizer | None:
    """The checkpoint's own tokenizer (never with remote code), or None when the folder has none."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model", "source.spm")
    if not any((folder / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    try:
        return HFTokenizer(AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False))
    except Exception as error:  # a broken or unusual tokenizer: the model still loads, ids still work
        raise CheckpointError(f"the tokenizer in {folder.name} could not be loaded: {error}") from None


def _single_id(value) -> int | None:
    if isinstance(value, (list, tuple)):
        # Several end tokens: the core stops at one; the first is the checkpoint's main one.
        return int(value[0]) if value else None
    return None if value is None else int(value)


def generation_settings(
    hf: dict, generation: dict | None = None, default_start: int | None = None
) -> GenerationSettings:
    """Greedy-decoding rules from config.json (`hf`), overridden by generation_config.json (`generation`),
    as transformers does.

    Mirrored: eos, decoder start (else bos, else `default_start`), pad, single-token bad_words_ids and
    suppress_tokens (never generated), forced_bos_token_id, forced_eos_token_id (when it is the eos token),
    max_length / max_new_tokens (capped at 64 for interactive use). Not mirrored (the core decodes greedily,
    one rule set): beams, sampling, min_length, no_repeat_ngram_size, repetition_penalty,
    begin_suppress_tokens, multi-token bad words, a second eos id.
    """
    g = {**hf, **{k: v for k, v in (generation or {}).items() if v is not None}}
    eos = _single_id(g.get("eos_token_id"))
    start = g.get("decoder_start_token_id")
    if start is None:
        start = g.get("bos_token_id") if default_start is None else default_start
    suppress: list[int] = []
    for words in g.get("bad_words_ids") or []:
        if isinstance(words, (list, tuple)) and len(words) == 1:
            suppress.append(int(words[0]))
    for token in g.get("suppress_tokens") or []:
        suppress.append(int(token))
    forced_eos = g.get("forced_eos_token_id")
    if isinstance(forced_eos, (list, tuple)):
        forced_eos = forced_eos[0] if len(forced_eos) == 1 else None
    budget = DEFAULT_MAX_NEW_TOKENS
    if g.get("max_new_tokens"):
        budget = min(budget, int(g["max_new_tokens"]))
    elif g.get("max_length") and g.get("max_length") > 1:
        budget = min(budget, int(g["max_length"]) - 1)  # max_length counts the decoder start token
    return GenerationSettings(
        eos_id=eos,
        start_id=None if start is None else int(start),
        pad_id=g.get("pad_token_id"),
        suppress_ids=tuple(dict.fromkeys(suppress)),
        forced_bos_id=g.get("forced_bos_token_id"),
        forced_eos=forced_eos is not None and eos is not None and int(forced_eos) == eos,
        max_new_tokens=budget,
    )
