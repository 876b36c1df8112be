"""`load_model`: any supported checkpoint into the core's instrumented models.

Sources: a bundled name ("minilm", and the project's own trained models), a local folder in the
Hugging Face layout under the configured model folders, or a hub id. The checkpoint's config
decides the family; each family has its own converter module here, offering MODEL_TYPES (the
config's model_type values it reads) and build(config, tensors, generation_config) -> core model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..inputs.preprocessing import ImagePreprocessing
from ..models.base import TracedModel, default_device, resolve_dtype
from ..models.vit import ViT
from . import bart, bert, gpt2, marian, t5, vit
from .common import load_tokenizer
from .sources import Progress, hub_folder, local_folder, looks_like_path, minilm_folder
from .weights import CheckpointError, read_state_dict

FAMILIES = {t: module for module in (bert, vit, gpt2, marian, bart, t5) for t in module.MODEL_TYPES}
BUNDLED_TEXT = {"minilm": minilm_folder}


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)


def load_model(
    source: str,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: Progress | None = None,
    model_dirs: list[Path] | None = None,
) -> TracedModel:
    """Load `source` into the core's model of its family, on `device` (default: CUDA when available).

    progress(fraction in [0, 1], message) is called as loading advances. Raises CheckpointError
    (a ValueError) with a message meant for the user when anything is wrong. Loading is not cached
    here: callers keep the model (the app caches it once per server process).
    """
    if not isinstance(source, str) or not source.strip():
        raise CheckpointError("no model given: choose a bundled model, a hub id or a local folder")
    source = source.strip()
    _report(progress, 0.0, f"{source}: locating")
    if source in BUNDLED_TEXT:
        folder = BUNDLED_TEXT[source]()
    else:
        from .. import bundled  # the project's own trained models (assets/)

        if source in bundled.BUNDLED_MODELS:
            try:
                model = bundled.load_bundled(source, device=device, dtype=dtype)
            except (OSError, ValueError) as error:  # a missing or damaged asset folder
                raise CheckpointError(f"the bundled model {source!r} cannot be loaded: {error}") from None
            model.source = source
            _report(progress, 1.0, f"{source}: ready")
            return model
        folder = local_folder(source, model_dirs) if looks_like_path(source) else hub_folder(source, progress)
    model = load_folder(folder, progress)
    model.source = source
    _report(progress, 0.95, f"{source}: moving to {device or default_device()}")
    model.place(device if device is not None else default_device(), resolve_dtype(dtype))
    _report(progress, 1.0, f"{source}: ready")
    return model


def load_folder(folder: Path, progress: Progress | None = None) -> TracedModel:
    """A checkpoint folder (config.json, weights, tokenizer / preprocessor files) -> a core model on the CPU."""
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"config.json in {folder.name} cannot be read: {error}") from None
    model_type = hf.get("model_type", "?")
    family = FAMILIES.get(model_type)
    if family is None:
        raise CheckpointError(f"not supported yet: {model_type} (supported: {', '.join(supported_model_types())})")
    _report(progress, 0.7, f"reading weights ({model_type})")
    tensors = read_state_dict(folder)
    _report(progress, 0.8, "building the instrumented model")
    # transformers 5 keeps some generation rules (bad words, forced BOS) only in generation_config.json.
    generation_file = folder / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else None
    model = family.build(hf, tensors, generation)
    del tensors
    _report(progress, 0.9, "loading the tokenizer / image processor")
    if isinstance(model, ViT):
        processor = folder / "preprocessor_config.json"
        cfg = json.loads(processor.read_text()) if processor.is_file() else {}
        model.preprocessing = ImagePreprocessing.from_hf(cfg, model.config.image_hw[0])
    else:
        tokenizer = load_tokenizer(folder)
        if tokenizer is not None:
            model.attach_tokenizer(tokenizer)
    return model


__all__ = ["CheckpointError", "load_folder", "load_model", "supported_model_types"]
