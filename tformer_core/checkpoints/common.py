"""What every family converter shares: activations by Hugging Face name, tokenizer loading."""

from __future__ import annotations

from pathlib import Path

from .weights import CheckpointError

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


def load_tokenizer(folder: Path):
    """The checkpoint's own tokenizer (never with remote code), or None when the folder has none."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model", "source.spm")
    if not any((folder / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as error:  # a broken or unusual tokenizer: the model still loads, ids still work
        raise CheckpointError(f"the tokenizer in {folder.name} could not be loaded: {error}") from None


def vocabulary_labels(tokenizer, vocab_size: int) -> list[str]:
    """A display string for every output id (for predictions); ids past the tokenizer's vocabulary get '<id>'."""
    n = min(len(tokenizer), vocab_size)
    labels = [t if t is not None else f"<{i}>" for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(n))))]
    labels = [t.replace("Ġ", " ").replace("▁", " ") for t in labels]  # byte-level BPE / sentencepiece spaces
    return labels + [f"<{i}>" for i in range(n, vocab_size)]
