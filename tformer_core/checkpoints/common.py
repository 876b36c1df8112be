"""What every family converter shares: activations by Hugging Face name, building a module within the
size limit, tokenizer loading, generation rules, the progress callback a load reports to."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..generation import GenerationSettings
from ..tokenizers import HFTokenizer
from .errors import CheckpointError
from .hfconfig import HFConfig, read_json
from .limits import check_params

M = TypeVar("M", bound=nn.Module)

# A load's progress: (fraction done in [0, 1], what it is doing), for the app's progress bar.
Progress = Callable[[float, str], None]

DEFAULT_MAX_NEW_TOKENS = 64  # interactive use: a page shows every step

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def activation(name: Any, key: str = "the activation") -> str:
    """The core's name for a Hugging Face activation; `key` is the config.json key it came from."""
    if not isinstance(name, str):
        raise CheckpointError(f'config.json: {key} must be a name such as "gelu", got {name!r}')
    try:
        return HF_ACTIVATIONS[name]
    except KeyError as error:
        raise CheckpointError(f"config.json: {key} {name[:40]!r} is not supported yet") from error


def build_module(cls: type[M], config: Any) -> M:
    """cls(config), refused when it has more parameters than TFORMER_MAX_PARAMS allows.

    The loader first builds every model on PyTorch's meta device (shapes, no memory), so this refuses a too
    large model before any of it is allocated. Fixed tables (sinusoidal positions) count as parameters.
    """
    model = cls(config)
    check_params(sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers()))
    return model


# Filling a tensor with (random) numbers: nothing to do on the meta device, which holds no numbers.
_FILLS = frozenset(
    {
        "normal_",
        "uniform_",
        "trunc_normal_",
        "kaiming_normal_",
        "kaiming_uniform_",
        "xavier_normal_",
        "xavier_uniform_",
        "constant_",
        "zeros_",
        "ones_",
        "zero_",
        "fill_",
        "orthogonal_",
        "eye_",
        "dirac_",
        "sparse_",
        "random_",
        "exponential_",
        "bernoulli_",
    }
)


class _NoFillsOnMeta(TorchFunctionMode):
    """Skips the initialisation of meta tensors. Their random initialisation goes through PyTorch's Python
    reference kernels, whose first use imports torch._dynamo: 3 of the 12 seconds a fresh process took to
    load smollm2."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _FILLS:
            target = args[0] if args else kwargs.get("tensor", kwargs.get("self"))  # nn.init passes tensor=
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Modules built inside are on PyTorch's meta device (shapes, no memory), uninitialised; this thread only."""
    with torch.device("meta"), _NoFillsOnMeta():
        yield


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model", "source.spm")
_JSON_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_TEXT_TOKENIZER_FILES = ("vocab.txt", "merges.txt")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.-])(?:[A-Za-z]:)?(?:[/\\][^/\\\s'\"]+)+")


def scrub(text: str, folder: Path) -> str:
    """One line of a library's error message, without server paths (a file keeps its own name)."""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    for shown in {str(folder), str(folder.resolve()), os.path.realpath(folder)}:
        line = line.replace(shown + os.sep, "").replace(shown, "the model folder")
    line = _ABSOLUTE_PATH.sub(lambda m: re.split(r"[/\\]", m.group(0))[-1], line)
    return line if len(line) <= 160 else line[:157] + "..."


def load_tokenizer(folder: Path, by_class: bool = False) -> HFTokenizer | None:
    """The checkpoint's own tokenizer (never with remote code), or None when the folder has none.

    Its JSON and text files are checked first, so a damaged one is named; anything else the tokenizer
    library refuses is reported in one line without server paths. by_class=True, for a folder transformers'
    own save_pretrained wrote (the converted cache): the class tokenizer_config.json names, when it is
    transformers' generic TokenizersBackend, is built directly, without AutoTokenizer's reading of the model's
    config (which imports the model family's code: 2 of the 12 seconds a fresh process took to load smollm2).
    """
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        return None
    if by_class and _names_generic_backend(folder):
        from transformers import TokenizersBackend

        return _tokenizer(folder, lambda: TokenizersBackend.from_pretrained(str(folder), local_files_only=True))
    for name in _JSON_TOKENIZER_FILES + ("vocab.json",):
        if (folder / name).is_file():
            read_json(folder / name)
    for name in _TEXT_TOKENIZER_FILES:
        if (folder / name).is_file():
            try:
                (folder / name).read_bytes().decode("utf-8")
            except UnicodeDecodeError as error:
                raise CheckpointError(f"{name} is damaged: it is not UTF-8 text") from error
    from transformers import AutoTokenizer

    return _tokenizer(folder, lambda: AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False))


def _names_generic_backend(folder: Path) -> bool:
    try:
        return read_json(folder / "tokenizer_config.json").get("tokenizer_class") == "TokenizersBackend"
    except CheckpointError:
        return False


def _tokenizer(folder: Path, build: Callable[[], Any]) -> HFTokenizer:
    try:
        return HFTokenizer(build())
    except Exception as error:
        files = ", ".join(n for n in TOKENIZER_FILES + _JSON_TOKENIZER_FILES[2:] if (folder / n).is_file())
        raise CheckpointError(
            f"the tokenizer files ({files}) cannot be read ({type(error).__name__}: {scrub(str(error), folder)})"
        ) from error


def _token_id(value: Any, key: str, file: str) -> int | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{file}: {key} must be a token id (a whole number), got {value!r}"[:200])
    if value < 0:
        if key == "pad_token_id":  # a few configs write -1 for "no padding token"
            return None
        raise CheckpointError(f"{file}: {key} must be a token id (a whole number from 0), got {value}")
    return value


def _required_id(value: Any, key: str, file: str) -> int:
    token = _token_id(value, key, file)
    if token is None:  # only a pad_token_id may be "none"
        raise CheckpointError(f"{file}: {key} must be a token id (a whole number from 0), got {value!r}")
    return token


def generation_settings(
    hf: dict, generation: dict | None = None, default_start: int | None = None
) -> GenerationSettings:
    """Greedy-decoding rules from config.json (`hf`), overridden by generation_config.json (`generation`),
    as transformers does.

    Mirrored: eos, decoder start (else bos, else `default_start`), pad, single-token bad_words_ids and
    suppress_tokens (never generated), forced_bos_token_id, forced_eos_token_id (when it is the eos token),
    max_length / max_new_tokens (capped at 64 for interactive use). Not mirrored (the core decodes greedily,
    one rule set): beams, sampling, min_length, no_repeat_ngram_size, repetition_penalty,
    begin_suppress_tokens, multi-token bad words, a second eos id. A value of the wrong kind is a
    CheckpointError naming the file it came from.
    """
    given = {k: v for k, v in (generation or {}).items() if v is not None}
    g = {**hf, **given}

    def file(key: str) -> str:
        return "generation_config.json" if key in given else "config.json"

    def one_id(key: str) -> int | None:
        value = g.get(key)
        if isinstance(value, (list, tuple)):  # several ids: the core uses one, the checkpoint's main (first) one
            value = value[0] if value else None
        return None if value is None else _token_id(value, key, file(key))

    def id_list(key: str) -> list:
        value = g.get(key) or []
        if not isinstance(value, (list, tuple)):
            raise CheckpointError(f"{file(key)}: {key} must be a list, got {value!r}"[:200])
        return list(value)

    eos = one_id("eos_token_id")
    start = one_id("decoder_start_token_id")
    if start is None:
        start = one_id("bos_token_id") if default_start is None else default_start
    suppress: list[int] = []
    for words in id_list("bad_words_ids"):
        if isinstance(words, (list, tuple)) and len(words) == 1:
            suppress.append(_required_id(words[0], "bad_words_ids", file("bad_words_ids")))
    for token in id_list("suppress_tokens"):
        suppress.append(_required_id(token, "suppress_tokens", file("suppress_tokens")))
    forced_eos = g.get("forced_eos_token_id")
    if isinstance(forced_eos, (list, tuple)):
        forced_eos = forced_eos[0] if len(forced_eos) == 1 else None
    if forced_eos is not None:
        forced_eos = _token_id(forced_eos, "forced_eos_token_id", file("forced_eos_token_id"))
    return GenerationSettings(
        eos_id=eos,
        start_id=start,
        pad_id=one_id("pad_token_id"),
        suppress_ids=tuple(dict.fromkeys(suppress)),
        forced_bos_id=one_id("forced_bos_token_id"),
        forced_eos=forced_eos is not None and eos is not None and forced_eos == eos,
        max_new_tokens=_length_budget(g, file),
    )


def _length_budget(g: dict, file: Callable[[str], str]) -> int:
    """New tokens a generation may take: the config's max_new_tokens or max_length, at most 64."""
    lengths = {k: HFConfig(g, file(k)).whole(k, None, low=0) for k in ("max_new_tokens", "max_length")}
    if lengths["max_new_tokens"]:
        return min(DEFAULT_MAX_NEW_TOKENS, lengths["max_new_tokens"])
    if lengths["max_length"] and lengths["max_length"] > 1:
        return min(DEFAULT_MAX_NEW_TOKENS, lengths["max_length"] - 1)  # max_length counts the decoder start token
    return DEFAULT_MAX_NEW_TOKENS
