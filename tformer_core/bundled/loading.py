"""Loading the models this project trains and ships in `assets/`, offline.

Each asset folder holds `config.json` (family, core config, special token ids, preprocessing),
`model.safetensors`, the vocabulary or label files and `MODEL_CARD.md`. They are written by
`python -m tformer_train.train <name>`; nothing here reaches the network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model as load_safetensors_model

from ..checkpoints.common import scrub
from ..checkpoints.errors import CheckpointError
from ..checkpoints.hfconfig import read_json
from ..generation import GenerationSettings
from ..inputs.preprocessing import ImagePreprocessing
from ..models.base import TracedModel
from ..models.detr import DETR, DETRConfig, DetrPreprocessing
from ..models.mae import MAE, MAEConfig
from ..models.pooling import PoolingClassifier, PoolingConfig
from ..models.rnn import RNNConfig, RNNSeq2Seq
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from ..models.vit import ViT, ViTConfig
from .sentence_tokenizer import SentenceTokenizer
from .tokenizer import WordTokenizer

__all__ = [
    "ASSETS_DIR",
    "BUNDLED_MODELS",
    "CARD_FILE",
    "CONFIG_FILE",
    "FAMILIES",
    "WEIGHTS_FILE",
    "asset_dir",
    "config_to_dict",
    "detr_preprocessing_from_meta",
    "file_sha256",
    "load_bundled",
    "load_from_dir",
    "model_card",
    "preprocessing_from_meta",
    "read_lines",
    "recorded",
    "write_lines",
]

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
# name -> folder in assets/
BUNDLED_MODELS: dict[str, str] = {
    name: name
    for name in (
        "translator",
        "vit-tiny",
        "sentiment-attention",
        "sentiment-mean",
        "rnn-additive",
        "rnn-dot",
        "rnn-bilinear",
        "mae-tiny",
        "detr-tiny",
    )
}
FAMILIES = {
    "encoder-decoder": (EncoderDecoder, Seq2SeqConfig),
    "vit": (ViT, ViTConfig),
    "pooling": (PoolingClassifier, PoolingConfig),
    "rnn-seq2seq": (RNNSeq2Seq, RNNConfig),
    "mae": (MAE, MAEConfig),
    "detr": (DETR, DETRConfig),
}

CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "model.safetensors", "MODEL_CARD.md"


def preprocessing_from_meta(pre: dict) -> ImagePreprocessing:
    """The bundled ViT's preprocessing from its config.json: the same object as the hub ViTs', so every
    ViT is treated alike. Photos are resized (bilinear, antialiased by PIL when shrinking) to the
    training size, scaled to [0, 1] and normalised with the stored mean and std."""
    return ImagePreprocessing(
        resize=("exact", tuple(pre["image_size"])),
        crop=None,
        resample=2,
        rescale=1 / 255,
        mean=tuple(pre["mean"]),
        std=tuple(pre["std"]),
    )


def detr_preprocessing_from_meta(pre: dict) -> DetrPreprocessing:
    """The bundled DETR's preprocessing from its config.json: DETR's own (the shorter side resized to
    `shortest_edge`, the longer at most `longest_edge`, aspect kept), with the stored mean and std."""
    return DetrPreprocessing(
        shortest=int(pre["shortest_edge"]),
        longest=int(pre["longest_edge"]),
        mean=tuple(pre["mean"]),
        std=tuple(pre["std"]),
    )


def asset_dir(name: str) -> Path:
    """The asset folder of a bundled model; ValueError naming the known models for any other name."""
    if name not in BUNDLED_MODELS:
        raise ValueError(f"unknown bundled model {name!r}: the bundled models are {sorted(BUNDLED_MODELS)}")
    return ASSETS_DIR / BUNDLED_MODELS[name]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _shown(folder: Path) -> str:
    """A folder as messages name it: relative to the repository ("assets/vit-tiny") or to the working folder,
    else by its name alone, never as a server path."""
    folder = Path(os.path.abspath(folder))
    for base in (ASSETS_DIR.parent, Path.cwd()):
        if folder.is_relative_to(base) and folder != base:
            return folder.relative_to(base).as_posix()
    return folder.name


def load_from_dir(
    folder: str | Path, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Build a bundled-format model from a folder (what `train` writes) and place it on `device` in `dtype`.

    A missing, damaged or mismatched file raises CheckpointError (a ValueError) naming it, relative to the
    repository or the working folder.
    """
    folder = Path(folder)
    shown = _shown(folder)
    for needed in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise CheckpointError(
                f"{shown} has no {needed}: write it with `python -m tformer_train.train <name> --out {shown}`"
            )
    meta = read_json(folder / CONFIG_FILE, f"{shown}/{CONFIG_FILE}")
    family = meta.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
        raise CheckpointError(f"{shown}/{CONFIG_FILE}: unknown family {family!r}, expected one of {sorted(FAMILIES)}")
    model_cls, config_cls = FAMILIES[family]
    try:
        # JSON lists (image_size, labels, a backbone's widths); the frozen configs hold tuples (hashable).
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(meta["config"]).items()}
        model = model_cls(config_cls(**fields))
    except Exception as error:  # a missing "config", unknown or mistyped fields: the constructors' own errors
        raise CheckpointError(
            f'{shown}/{CONFIG_FILE}: its "config" does not describe a {family} model '
            f"({type(error).__name__}: {scrub(str(error), folder)})"
        ) from error
    try:
        # strict: a renamed or missing tensor must fail here, not produce a half-random model.
        load_safetensors_model(model, str(folder / WEIGHTS_FILE), strict=True, device="cpu")
    except Exception as error:  # SafetensorError, missing or unexpected tensors, shape mismatches
        raise CheckpointError(
            f"{shown}/{WEIGHTS_FILE} is damaged or does not match {CONFIG_FILE} ({scrub(str(error), folder)})"
        ) from error
    try:
        _attach_inputs(model, meta, folder, shown)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, OSError) as error:
        what = f"the key {error}" if isinstance(error, KeyError) else type(error).__name__
        raise CheckpointError(f"{shown}: its vocabulary or label files cannot be read ({what})") from error
    return model.place(device, dtype)


def _listed_file(folder: Path, meta: dict, key: str, shown: str) -> Path:
    """The file config.json names under `key`: a plain name in the folder, never a path elsewhere."""
    name = meta[key]
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise CheckpointError(f"{shown}/{CONFIG_FILE}: {key} must name a file in the folder, got {name!r}"[:200])
    return folder / name


def _check_special(tokenizers: dict[str, WordTokenizer], meta: dict, shown: str) -> None:
    for side, tok in tokenizers.items():
        expected = meta["special_tokens"]
        got = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id, "unk": tok.unk_id}
        if got != expected:
            raise CheckpointError(
                f"{shown}: the {side} vocabulary's special ids {got} differ from config.json {expected}"
            )


def _attach_seq2seq_vocabularies(
    model: EncoderDecoder | RNNSeq2Seq, meta: dict, folder: Path, shown: str
) -> WordTokenizer:
    """Source and target word tokenizers (the Transformer translator and the RNN encoder-decoders); the
    target's is returned. Its words label the outputs."""
    source = WordTokenizer(read_lines(_listed_file(folder, meta, "source_vocab", shown)))
    target = WordTokenizer(read_lines(_listed_file(folder, meta, "target_vocab", shown)), prepend_bos=True)
    _check_special({"source": source, "target": target}, meta, shown)
    if len(source) != model.config.src_vocab_size or len(target) != model.config.tgt_vocab_size:
        raise CheckpointError(f"{shown}: vocabulary files do not match the vocabulary sizes in config.json")
    model.attach_tokenizer(source)
    model.target_tokenizer = target
    model.output_labels = target.labels(model.output_vocab_size)  # predictions name target words
    return target


def _attach_inputs(model: TracedModel[Any], meta: dict, folder: Path, shown: str) -> None:
    """Tokenizers, generation rules and labels (text families), labels and preprocessing (ViT, DETR), or
    preprocessing (MAE)."""
    if isinstance(model, PoolingClassifier):
        tokenizer = SentenceTokenizer(read_lines(_listed_file(folder, meta, "vocab", shown)))
        _check_special({"sentence": tokenizer}, meta, shown)
        if len(tokenizer) != model.config.vocab_size:
            raise CheckpointError(f"{shown}: the vocabulary file does not match the vocabulary size in config.json")
        model.attach_tokenizer(tokenizer)
    elif isinstance(model, RNNSeq2Seq):
        _attach_seq2seq_vocabularies(model, meta, folder, shown)
    elif isinstance(model, EncoderDecoder):
        tgt = _attach_seq2seq_vocabularies(model, meta, folder, shown)
        # generate() starts from <bos>, stops at <eos>, never emits <pad> or a second <bos>.
        model.generation = GenerationSettings(
            eos_id=tgt.eos_id,
            start_id=tgt.bos_id,
            pad_id=tgt.pad_id,
            suppress_ids=(tgt.pad_id, tgt.bos_id),
            max_new_tokens=int(meta.get("max_target_length", model.config.max_positions - 1)),
        )
    elif isinstance(model, ViT):
        names = read_lines(_listed_file(folder, meta, "labels", shown))
        if len(names) != model.config.n_classes:
            raise CheckpointError(f"{shown}: {len(names)} labels for {model.config.n_classes} classes")
        model.class_names = names
        model.preprocessing = preprocessing_from_meta(meta["preprocessing"])
    elif isinstance(model, MAE):
        model.preprocessing = preprocessing_from_meta(meta["preprocessing"])
    elif isinstance(model, DETR):
        if len(model.config.labels) != model.config.n_classes:
            raise CheckpointError(f"{shown}: {len(model.config.labels)} labels for {model.config.n_classes} classes")
        model.preprocessing = detr_preprocessing_from_meta(meta["preprocessing"])
    else:
        raise CheckpointError(f"{shown}: a {model.kind} model is not one the bundled format holds")


def load_bundled(
    name: str, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Load a bundled model by name ("translator", "vit-tiny", "mae-tiny", ...) from assets/, offline, in eval mode."""
    return load_from_dir(asset_dir(name), device, dtype)


def recorded(name: str) -> dict:
    """What a bundled model's training run recorded in its config.json (config, training, evaluation)."""
    return read_json(asset_dir(name) / CONFIG_FILE, f"{BUNDLED_MODELS.get(name, name)}/{CONFIG_FILE}")


def model_card(name: str) -> str:
    """The markdown model card of a bundled model."""
    return (asset_dir(name) / CARD_FILE).read_text(encoding="utf-8")
