"""`load_model`: any supported checkpoint into the core's instrumented models.

Sources: a bundled name ("minilm", "smollm2", and the project's own trained models), a local folder in the
Hugging Face layout under the configured model folders, or a hub id. The checkpoint's config
decides the family; each family has its own converter module here, offering MODEL_TYPES (the
config's model_type values it reads) and build(config, tensors, generation_config) -> core model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..models.base import TracedModel, default_device, resolve_dtype
from ..models.detr import DETR
from ..models.kinds import CausalLM, EncoderDecoderModel
from ..models.mae import MAE
from ..models.seq2seq import EncoderDecoder
from ..models.vit import ViT
from . import bart, bert, detr, dinov2, fallback, gguf, gpt2, llama, mae, marian, passes, t5, vit
from .common import Progress, load_tokenizer, on_meta, scrub
from .errors import CheckpointError
from .hfconfig import read_json
from .sources import display_name, hub_folder, local_folder, looks_like_path, minilm_folder
from .weights import read_tensors

FAMILIES = {
    t: module for module in (bert, vit, dinov2, gpt2, llama, marian, bart, t5, mae, detr) for t in module.MODEL_TYPES
}
# Text models that need no network: name -> its folder (smollm2's is the cache of its converted GGUF file).
BUNDLED_TEXT = {"minilm": minilm_folder, "smollm2": lambda: gguf.converted_folder("smollm2")}


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

    `source`: a bundled name ("minilm", "smollm2", "translator", "vit-tiny"), a local model by its display name
    ("models/deit-tiny-patch16-224", see `sources.display_name`) or its path (both only inside the
    configured model folders, `model_dirs` or TFORMER_MODEL_DIRS), or a hub id ("google/vit-base-patch16-224").
    The model's `source` is the name it is known by: the bundled name, the hub id, or a local model's
    display name (never a server path). progress(fraction in [0, 1], message) is called as loading
    advances. Raises CheckpointError (a ValueError) with a message meant for the user when anything is
    wrong; it names the file and the problem and shows no server path. Loading is not cached here:
    callers keep the model (the app caches it once per server process).
    """
    if not isinstance(source, str) or not source.strip():
        raise CheckpointError("no model given: choose a bundled model, a hub id or a local folder")
    source = source.strip()
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in source):
        raise CheckpointError(
            "a model id or folder name cannot hold control characters (such as NUL or a line break): "
            "choose a bundled model, a hub id or a local folder"
        )
    _report(progress, 0.0, f"{source}: locating")
    if source in gguf.GGUF_MODELS:
        return _placed(_load_gguf(source, progress), source, device, dtype, progress)
    if source in BUNDLED_TEXT:
        folder, name = BUNDLED_TEXT[source](), source
    else:
        from .. import bundled  # the project's own trained models (assets/)

        if source in bundled.BUNDLED_MODELS:
            try:
                model = bundled.load_bundled(source, device=device, dtype=dtype)
            except (OSError, ValueError) as error:  # a missing or damaged asset folder
                raise CheckpointError(f"the bundled model {source!r} cannot be loaded: {error}") from error
            except (RuntimeError, MemoryError) as error:  # placing it: out of (GPU) memory
                raise CheckpointError(_placing_failed(source, device, error)) from error
            model.source = source
            _report(progress, 1.0, f"{source}: ready")
            return model
        if looks_like_path(source, model_dirs):
            folder = local_folder(source, model_dirs)
            name = display_name(folder, model_dirs)
        else:
            folder, name = hub_folder(source, progress), source
    return _placed(load_folder(folder, progress, name=name), name, device, dtype, progress)


def _placed(
    model: TracedModel,
    name: str,
    device: str | torch.device | None,
    dtype: str | torch.dtype | None,
    progress: Progress | None,
) -> TracedModel:
    """The loaded model, named and moved to `device` in `dtype`."""
    model.source = name  # a local model by its short name: pages show it, and it never reveals a server path
    _report(progress, 0.95, f"{name}: moving to {device or default_device()}")
    try:
        model.place(device if device is not None else default_device(), resolve_dtype(dtype))
    except (RuntimeError, MemoryError) as error:  # CUDA out of memory, a device that is not there
        raise CheckpointError(_placing_failed(name, device, error)) from error
    _report(progress, 1.0, f"{name}: ready")
    return model


def _load_gguf(name: str, progress: Progress | None) -> TracedModel:
    """A bundled GGUF model from its converted cache folder (converted first when needed); a cache folder the
    loader refuses (damaged since it was written) is converted again, once."""
    folder = gguf.converted_folder(name, progress)
    try:
        model = load_folder(folder, progress, name=name, converted=True)
    except CheckpointError:
        model = load_folder(gguf.converted_folder(name, progress, rebuild=True), progress, name=name, converted=True)
    model.weights_note = gguf.GGUF_MODELS[name].note
    return model


def _placing_failed(name: str, device: str | torch.device | None, error: BaseException) -> str:
    where = device or default_device()
    if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
        return f"{name} does not fit in the memory of {where}"
    return f"{name} cannot be moved to {where} ({type(error).__name__})"


def load_folder(
    folder: Path, progress: Progress | None = None, name: str | None = None, converted: bool = False
) -> TracedModel:
    """A checkpoint folder (config.json, weights, tokenizer / preprocessor files) -> a core model on the CPU.

    In order: config.json and generation_config.json are read; the weights' names, number formats and
    shapes are read without their data (a damaged or truncated file fails here); the model is built on
    PyTorch's meta device, which allocates nothing, and checked against TFORMER_MAX_PARAMS and against
    every tensor's shape; a pass over its largest input is estimated from its config and checked against
    TFORMER_PASS_MB (`passes.check`: a text model may read fewer tokens, `pass_tokens`); only then is it built
    for real and filled. `name` (the model as the user knows
    it, never a server path) appears in the few messages that are not about one file.

    converted=True: a folder tformer wrote itself (the cache of a converted GGUF file), never rewritten in place
    (a new conversion is renamed into place). Its weights then stay its file's private memory map rather than
    being copied (see `weights.read_tensors`), and its tokenizer is built by the class its tokenizer_config.json
    names, which transformers wrote there (AutoTokenizer would read the model's config to choose it, importing
    the model family's code: seconds). With these, and no initialisation or torch._dynamo import on the way
    (`common.on_meta`), a fresh process loads smollm2 in about 1.2 s instead of 3.7 s on the shared 2-core
    machine at load average 2, and in 1 to 4 s instead of 10 to 22 s at load average 7 to 9
    (benchmarks/smollm2.py).
    """
    name = name or folder.name
    try:
        return _load_folder(folder, progress, name, converted)
    except CheckpointError:
        raise
    except MemoryError as error:
        raise CheckpointError(f"there is not enough memory on the server to load {name}") from error
    except ValueError as error:  # a core config's own check (e.g. image size against patch size)
        problem = scrub(str(error), folder)
        raise CheckpointError(f"config.json describes a model tformer cannot build: {problem}") from error
    except Exception as error:  # a case no check foresaw: still one line for the user, the cause kept for the log
        raise CheckpointError(
            f"{name} could not be loaded ({type(error).__name__}: {scrub(str(error), folder)})"
        ) from error


def _load_folder(folder: Path, progress: Progress | None, name: str, converted: bool = False) -> TracedModel:
    hf = read_json(folder / "config.json")
    model_type = hf.get("model_type")
    supported = ", ".join(supported_model_types())
    if model_type is None:
        raise CheckpointError(f"config.json has no model_type, so the architecture is unknown (supported: {supported})")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None and fallback.handles(hf):  # transformers runs it: attention weights, no Q/K/V
        model = fallback.load_transformers(folder, progress, name)
        _check_generation_ids(model)
        return model
    if family is None:
        raise CheckpointError(f"not supported yet: {str(model_type)[:60]} (supported: {supported})")
    # transformers 5 keeps some generation rules (bad words, forced BOS) only in generation_config.json.
    generation_file = folder / "generation_config.json"
    generation = read_json(generation_file) if generation_file.is_file() else None
    _report(progress, 0.7, f"reading weights ({model_type})")
    tensors = read_tensors(folder, mapped=converted)
    try:
        _report(progress, 0.75, "checking the weights against config.json")
        preprocessor = _preprocessor(folder)
        # DINOv2 reads pictures of the size its preprocessing gives, not config.json's (its table is resized).
        sized: dict[str, Any] = {"preprocessor": preprocessor} if family is dinov2 else {}
        with on_meta():  # this thread only: shapes and sizes, no memory
            family.build(hf, tensors.meta(), generation, **sized)
        pass_tokens = passes.check(hf, preprocessor, name)  # what a pass over its largest input takes
        _report(progress, 0.8, "building the instrumented model")
        model = family.build(hf, tensors, generation, **sized)
    finally:
        tensors.close()
    model.pass_tokens = pass_tokens
    _check_generation_ids(model)
    _report(progress, 0.9, "loading the tokenizer / image processor")
    _attach_inputs(model, folder, converted)
    return model


def _preprocessor(folder: Path) -> dict[str, Any] | None:
    """preprocessor_config.json's values, or None when the folder has none."""
    path = folder / vit.PREPROCESSOR
    return read_json(path) if path.is_file() else None


def _attach_inputs(model: TracedModel[Any], folder: Path, converted: bool) -> None:
    """A vision family's image preprocessing, or a text family's tokenizer (when the folder has one)."""
    if isinstance(model, ViT):
        model.preprocessing = vit.preprocessing(folder, model.config)
    elif isinstance(model, MAE):
        model.preprocessing = mae.preprocessing(folder, model.config)
    elif isinstance(model, DETR):
        model.preprocessing = detr.preprocessing(folder, model.config)
    else:
        tokenizer = load_tokenizer(folder, by_class=converted)
        if tokenizer is not None:
            model.attach_tokenizer(tokenizer)


def _check_generation_ids(model: TracedModel) -> None:
    """Every token id generation feeds back in or indexes logits with must be a row of the output layer,
    else decoding would fail later. An end token outside the vocabulary is harmless (it is never produced)
    unless it is forced."""
    if not isinstance(model, (CausalLM, EncoderDecoderModel)) or not model.output_vocab_size:
        return  # only the kinds that generate have generation settings
    settings, size = model.generation, model.output_vocab_size
    start = settings.start_id
    start_key = "decoder_start_token_id (or bos_token_id)"
    if start is None and isinstance(model, EncoderDecoder):  # the decoder then starts from the padding token
        start, start_key = settings.pad_id, "pad_token_id"
    named = [
        (start_key, start),
        ("forced_bos_token_id", settings.forced_bos_id),
        ("eos_token_id (forced at the end)", settings.eos_id if settings.forced_eos else None),
        *(("bad_words_ids / suppress_tokens", i) for i in settings.suppress_ids),
    ]
    for key, value in named:
        if value is not None and not 0 <= value < size:
            raise CheckpointError(
                f"config.json / generation_config.json: {key} is {value}, but the model has only {size:,} tokens "
                f"(ids 0 to {size - 1:,})"
            )


__all__ = ["BUNDLED_TEXT", "CheckpointError", "load_folder", "load_model", "supported_model_types"]
