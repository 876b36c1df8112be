"""Loading the models this project trains and ships in `assets/`, offline.

Each asset folder holds `config.json` (family, core config, special token ids, preprocessing),
`model.safetensors`, the vocabulary or label files and `MODEL_CARD.md`. They are written by
`python -m tformer_core.bundled.train <name>`; nothing here reaches the network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model as load_safetensors_model

from ..generation import GenerationSettings
from ..inputs.preprocessing import ImagePreprocessing
from ..models.base import TracedModel
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from ..models.vit import ViT, ViTConfig
from .tokenizer import WordTokenizer

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
BUNDLED_MODELS: dict[str, str] = {"translator": "translator", "vit-tiny": "vit-tiny"}  # name -> folder in assets/
FAMILIES = {"encoder-decoder": (EncoderDecoder, Seq2SeqConfig), "vit": (ViT, ViTConfig)}

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


def load_from_dir(
    folder: str | Path, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Build a bundled-format model from a folder (what `train` writes) and place it on `device` in `dtype`."""
    folder = Path(folder)
    for needed in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise ValueError(
                f"{folder} has no {needed}: write it with `python -m tformer_core.bundled.train <name> --out {folder}`"
            )
    meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    family = meta.get("family")
    if family not in FAMILIES:
        raise ValueError(f"{folder / CONFIG_FILE}: unknown family {family!r}, expected one of {sorted(FAMILIES)}")
    model_cls, config_cls = FAMILIES[family]
    fields = dict(meta["config"])
    if isinstance(fields.get("image_size"), list):
        fields["image_size"] = tuple(fields["image_size"])
    model = model_cls(config_cls(**fields))
    # strict: a renamed or missing tensor must fail here, not produce a half-random model.
    load_safetensors_model(model, str(folder / WEIGHTS_FILE), strict=True, device="cpu")
    if family == "encoder-decoder":
        model.attach_tokenizer(WordTokenizer(read_lines(folder / meta["source_vocab"])))
        model.target_tokenizer = WordTokenizer(read_lines(folder / meta["target_vocab"]), prepend_bos=True)
        for side, tok in (("source", model.tokenizer), ("target", model.target_tokenizer)):
            expected = meta["special_tokens"]
            got = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id, "unk": tok.unk_id}
            if got != expected:
                raise ValueError(
                    f"{folder}: the {side} vocabulary's special ids {got} differ from config.json {expected}"
                )
        if (
            len(model.tokenizer) != model.config.src_vocab_size
            or len(model.target_tokenizer) != model.config.tgt_vocab_size
        ):
            raise ValueError(f"{folder}: vocabulary files do not match the vocabulary sizes in config.json")
        tgt = model.target_tokenizer
        model.output_labels = tgt.labels(model.output_vocab_size)  # predictions name target words
        # generate() starts from <bos>, stops at <eos>, never emits <pad> or a second <bos>.
        model.generation = GenerationSettings(
            eos_id=tgt.eos_id,
            start_id=tgt.bos_id,
            pad_id=tgt.pad_id,
            suppress_ids=(tgt.pad_id, tgt.bos_id),
            max_new_tokens=int(meta.get("max_target_length", model.config.max_positions - 1)),
        )
    else:
        model.class_names = read_lines(folder / meta["labels"])
        if len(model.class_names) != model.config.n_classes:
            raise ValueError(f"{folder}: {len(model.class_names)} labels for {model.config.n_classes} classes")
        model.preprocessing = preprocessing_from_meta(meta["preprocessing"])
    return model.place(device, dtype)


def load_bundled(
    name: str, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Load a bundled model by name ("translator", "vit-tiny") from assets/, offline, in eval mode."""
    return load_from_dir(asset_dir(name), device, dtype)


def model_card(name: str) -> str:
    """The markdown model card of a bundled model."""
    return (asset_dir(name) / CARD_FILE).read_text(encoding="utf-8")
