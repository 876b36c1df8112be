"""Checkpoints of architectures tformer does not implement, loaded into transformers' own classes.

`load_transformers(folder)` is what the loader falls back to when config.json's model_type has no
converter in the core but transformers implements it (`transformers_implements`). The model then runs
through transformers' code with eager attention, and traces hold what transformers hands out: the
attention weights and the hidden states (see `tformer_core.models.fallback`).

The same safety rules as the core's converters:
- Never any checkpoint code: `trust_remote_code` is never set, and a config.json that names an
  architecture transformers does not have (a custom class in `auto_map`) is refused with a message.
- Weights from safetensors, or from .bin through `torch.load(weights_only=True)` (transformers' default,
  asked for explicitly); both are first checked by `weights.read_tensors` (headers against file lengths,
  pickles that hold anything but tensors refused, a .bin far over the parameter limit refused unread).
- The parameter limit (TFORMER_MAX_PARAMS) is checked on the model built on PyTorch's meta device,
  before any weight is allocated; layer counts and widths are bounded before that; and so is the working
  memory of a pass (TFORMER_PASS_MB, `limits.check_pass`).
- Every parameter must come from the checkpoint: a weight transformers would have to initialise at
  random (a checkpoint of another architecture) is an error, not a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..models.encoder import classifier_scoring
from ..models.fallback import (
    TransformersConfig,
    TransformersDecoder,
    TransformersEncoder,
    TransformersModel,
    TransformersSeq2Seq,
)
from .common import Progress, generation_settings, load_tokenizer, scrub
from .errors import CheckpointError
from .hfconfig import HFConfig, read_json
from .limits import check_params, check_pass
from .weights import read_tensors

# transformers' model classes and models (imported where a model is loaded: transformers takes seconds to
# import); their attributes are transformers' own, read dynamically, so they are typed loosely here.
HFModelClass = Any
HFModel = Any

# The most tokens a transformers-run model reads in one trace: its attention weights are stored for every
# layer and head (no Q and K to recompute them from), 600 MB for a 12-layer, 12-head model at 1024 tokens.
TRACE_MAX_TOKENS = 1024
# transformers' auto mappings whose classes have a head the core shows, and what the head predicts.
HEADS = (
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked-word"),
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "next-token"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "next-token"),
    ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "classification"),
)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers")
_WIDTH_KEYS = (
    "hidden_size",
    "n_embd",
    "d_model",
    "dim",
    "embedding_size",
    "intermediate_size",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "d_ff",
    "hidden_dim",
    "vocab_size",
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_key_value_heads",
)
_MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
_TEXT_CONFIG_KEYS = {
    "d_model": ("hidden_size", "n_embd", "d_model", "dim"),
    "n_heads": ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "num_heads"),
    "d_ff": ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "d_ff", "n_inner", "hidden_dim"),
    "n_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers"),
}
NOT_OURS = "its code is not part of transformers; tformer never runs a checkpoint's own code"


def transformers_implements(model_type: object) -> bool:
    """Whether transformers (the installed version) has a configuration class for `model_type`."""
    from transformers import CONFIG_MAPPING

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def handles(hf: dict) -> bool:
    """Whether `load_transformers` should answer for a config.json the core has no converter for: transformers
    implements its model_type (it is loaded), or it names code of its own (refused with the reason)."""
    return transformers_implements(hf.get("model_type")) or "auto_map" in hf


def _names(value: object) -> tuple[str, ...]:
    """An auto mapping's entry as class names (some entries list several)."""
    if isinstance(value, str):
        return (value,)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, (tuple, list)) else ()


def choose_class(hf: dict) -> tuple[HFModelClass, str | None, str]:
    """(the transformers class to build, the head it has or None, the head left out or "") from config.json.

    The class is config.json's first architecture when it is a transformers class of the config's model_type
    with a head the core shows; the model_type's base model when the architecture has another head (question
    answering, token classification) or none is named. CheckpointError for code that is not transformers'.
    """
    import transformers
    from transformers.models.auto import modeling_auto

    model_type = hf.get("model_type")
    architectures = hf.get("architectures") or []
    named = architectures[0] if isinstance(architectures, list) and architectures else None
    if not transformers_implements(model_type):
        shown = str(model_type)[:60]
        if "auto_map" in hf:
            raise CheckpointError(f"config.json describes a custom model ({shown}): {NOT_OURS}")
        raise CheckpointError(
            f"not supported: {shown} is neither one of tformer's architectures nor one transformers "
            f"{transformers.__version__} implements"
        )
    if named is not None:
        cls = getattr(transformers, str(named), None) if str(named).isidentifier() else None
        if _is_model_class(cls, None):
            if not _is_model_class(cls, model_type):
                raise CheckpointError(f"config.json names {named}, which is not a {model_type} architecture")
        else:
            raise CheckpointError(f"config.json names the architecture {str(named)[:60]}: {NOT_OURS}")
        for mapping, head in HEADS:
            if named in _names(getattr(modeling_auto, mapping).get(model_type)):
                return cls, head, ""
    base = _names(modeling_auto.MODEL_MAPPING_NAMES.get(str(model_type)))
    cls = getattr(transformers, base[0], None) if base else None
    if cls is None or not _is_model_class(cls, model_type):
        raise CheckpointError(f"transformers has no text model for {model_type}: tformer cannot show it")
    return cls, None, (str(named) if named and named != cls.__name__ else "")


def _is_model_class(cls: object, model_type: object) -> bool:
    """Whether `cls` is a transformers model class (of `model_type`, unless that is None)."""
    from transformers import PreTrainedModel

    if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
        return False
    return model_type is None or getattr(cls.config_class, "model_type", None) == model_type


def check_sizes(hf: dict) -> None:
    """Layer counts and widths within the bounds of `hfconfig` (before anything is built from them)."""
    for values, file in ((hf, "config.json"), (hf.get("text_config"), "config.json (text_config)")):
        if not isinstance(values, dict):
            continue
        c = HFConfig(values, file)
        for key in _LAYER_KEYS:
            c.layers(key, None)
        for key in _WIDTH_KEYS:
            c.whole(key, None, low=0)


def read_config(folder: Path, cls: HFModelClass) -> Any:
    """transformers' config object for the folder (its own JSON reading and checks), eager attention."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
    except Exception as error:
        raise CheckpointError(f"config.json cannot be read by transformers ({scrub(str(error), folder)})") from error
    if not isinstance(config, cls.config_class):
        raise CheckpointError(f"config.json does not describe a {cls.__name__}")
    config._attn_implementation = "eager"  # the attention matrix is built, so it can be handed out
    return config


def count_on_meta(cls: HFModelClass, config: Any, name: str) -> int:
    """Parameters (and fixed tables) of `cls(config)` built on the meta device, which allocates nothing;
    CheckpointError when they exceed TFORMER_MAX_PARAMS."""
    with torch.device("meta"):
        model = cls._from_config(config, attn_implementation="eager")
    tensors = {id(t): t.numel() for t in [*model.parameters(), *model.buffers()]}
    n = sum(tensors.values())
    check_params(n, name)
    return n


def from_pretrained(cls: HFModelClass, folder: Path, config: Any) -> HFModel:
    """The checkpoint's weights in `cls`, as float32 on the CPU, from files `read_tensors` accepted."""
    read_tensors(folder).close()  # the same checks as the core's converters, before transformers reads them
    has_safetensors = any(folder.glob("model*.safetensors"))
    try:
        model, info = cls.from_pretrained(
            str(folder),
            config=config,
            attn_implementation="eager",
            dtype=torch.float32,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=has_safetensors,
            weights_only=True,
            output_loading_info=True,
        )
    except Exception as error:  # shapes that do not fit the config, files transformers refuses
        raise CheckpointError(
            f"transformers cannot load the weights into {cls.__name__} ({scrub(str(error), folder)})"
        ) from error
    missing = sorted(info.get("missing_keys") or ()) + sorted(k for k, *_ in info.get("mismatched_keys") or ())
    if missing:
        raise CheckpointError(
            f"the weights do not provide {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''} of "
            f"{cls.__name__}: the weights and config.json do not belong together"
        )
    return model.eval()


def _probe(model: torch.nn.Module, seq2seq: bool, vocab: int) -> Any:
    """One forward pass over 4 tokens with every attention matrix and hidden state returned."""
    ids = torch.tensor([[(vocab // 2 + i) % vocab for i in range(4)]])
    extra = {"decoder_input_ids": ids[:, :3]} if seq2seq else {}
    with torch.inference_mode():
        return model(input_ids=ids, output_attentions=True, output_hidden_states=True, use_cache=False, **extra)


def _is_causal(attentions: Any) -> bool:
    """Whether every layer's weights above the diagonal are exactly 0 (a causal mask), from the probe."""
    return all(bool((torch.triu(a[0].float(), diagonal=1) == 0).all()) for a in attentions)


def _check_attentions(attentions: Any, n: int, where: str) -> None:
    """Every layer must hand out [1, heads, n_q, n_k] weights; a layer without attention (a recurrent or
    state-space layer) or one that changes the sequence length has nothing the views can draw."""
    if not attentions or any(not isinstance(a, torch.Tensor) or a.dim() != 4 for a in attentions):
        raise CheckpointError(f"transformers gives no attention weights for every layer of this {where}")
    if any(a.shape[-1] != n or a.shape[1] != attentions[0].shape[1] for a in attentions):
        raise CheckpointError(
            f"this {where} changes the number of tokens or heads between layers: tformer cannot show it"
        )


def describe(model: HFModel, head: str | None, dropped: str, hf: dict) -> TransformersConfig:
    """The core's config of a loaded transformers model, from config.json and one probing pass."""
    config = model.config
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    vocab = model.get_input_embeddings().num_embeddings
    out = _probe(model, seq2seq, vocab)
    attentions = out.encoder_attentions if seq2seq else out.attentions
    hidden = out.encoder_hidden_states if seq2seq else out.hidden_states
    _check_attentions(attentions, 4, "model")
    if seq2seq:
        _check_attentions(out.decoder_attentions, 3, "model's decoder")
        if not _is_causal(out.decoder_attentions):
            raise CheckpointError("this encoder-decoder model's decoder sees later tokens: tformer cannot show it")
    n_heads = int(attentions[0].shape[1])
    d_model = int(hidden[0].shape[-1]) if hidden else int(getattr(config, "hidden_size", n_heads))
    head_dim = getattr(config, "head_dim", None)
    n_outputs = int(out.logits.shape[-1]) if head is not None else 0
    c = HFConfig(hf)
    declared = (hf.get(k) for k in _MAX_POSITION_KEYS)
    limit = next((v for v in declared if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    problem_type = getattr(config, "problem_type", None) or ""
    return TransformersConfig(
        model_type=hf["model_type"],
        architecture=type(model).__name__,
        d_model=d_model,
        n_heads=n_heads,
        d_head=head_dim if isinstance(head_dim, int) and head_dim > 0 else max(d_model // n_heads, 1),
        d_ff=next((c.whole(k, 0, low=0) for k in ("intermediate_size", "ffn_dim", "d_ff") if k in c), 0),
        vocab_size=vocab,
        max_positions=min(limit or TRACE_MAX_TOKENS, TRACE_MAX_TOKENS),
        n_layers=len(attentions),
        n_decoder_layers=len(out.decoder_attentions) if seq2seq else 0,
        head=head,
        n_outputs=n_outputs,
        labels=_class_labels(config, n_outputs) if head == "classification" else (),
        problem_type=problem_type,
        scoring=classifier_scoring(problem_type, n_outputs),
        causal=not seq2seq and _is_causal(attentions),
        dropped_head=dropped,
    )


def estimate_config(hf: dict) -> TransformersConfig | None:
    """A TransformersConfig with the sizes config.json (or its text_config) gives, for the estimate of a pass only
    (`limits.check_pass`, before any weight is read); None when it gives no width, heads or layers."""
    nested = hf.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else hf
    c = HFConfig(text)

    def first(keys: tuple[str, ...], default: int | None = None) -> int | None:
        return next((c.whole(k, None, low=0) for k in keys if k in c), default)

    d_model, heads = first(_TEXT_CONFIG_KEYS["d_model"]), first(_TEXT_CONFIG_KEYS["n_heads"])
    layers = first(_TEXT_CONFIG_KEYS["n_layers"])
    if not d_model or not heads or not layers:
        return None
    positions = next((text[k] for k in _MAX_POSITION_KEYS if isinstance(text.get(k), int)), None)
    seq2seq = bool(hf.get("is_encoder_decoder"))
    return TransformersConfig(
        model_type=str(hf.get("model_type")),
        architecture="",
        d_model=d_model,
        n_heads=heads,
        d_head=max(d_model // heads, 1),
        d_ff=first(_TEXT_CONFIG_KEYS["d_ff"]) or 4 * d_model,
        vocab_size=c.whole("vocab_size", 0, low=0),
        max_positions=min(positions or TRACE_MAX_TOKENS, TRACE_MAX_TOKENS),
        n_layers=layers,
        n_decoder_layers=(first(("decoder_layers", "num_decoder_layers"), layers) or 0) if seq2seq else 0,
    )


def _class_labels(config: Any, n_labels: int) -> tuple[str, ...]:
    table = getattr(config, "id2label", None) or {}
    labels = tuple(str(table.get(i, f"LABEL_{i}"))[:200] for i in range(n_labels))
    return labels


def load_transformers(folder: Path, progress: Progress | None = None, name: str | None = None) -> TransformersModel:
    """A checkpoint folder of an architecture the core does not implement -> a `TransformersModel` on the CPU
    (`TransformersEncoder`, `TransformersDecoder` or `TransformersSeq2Seq`, decided by the model itself: an
    encoder-decoder config, else causal attention makes a decoder). CheckpointError when it cannot be shown."""
    name = name or folder.name
    hf = read_json(folder / "config.json")
    _report(progress, 0.7, f"{str(hf.get('model_type'))[:40]}: not one of tformer's architectures, run by transformers")
    cls, head, dropped = choose_class(hf)
    if cls.main_input_name != "input_ids":
        raise CheckpointError(
            f"{cls.__name__} reads {cls.main_input_name}, not text: tformer shows other architectures only "
            "for text models"
        )
    check_sizes(hf)
    config = read_config(folder, cls)
    _report(progress, 0.75, "checking the size on the meta device")
    count_on_meta(cls, config, name)
    estimate = estimate_config(hf)
    pass_tokens = None if estimate is None else check_pass(estimate, None, name)
    _report(progress, 0.8, f"loading the weights into transformers' {cls.__name__}")
    hf_model = from_pretrained(cls, folder, config)
    try:
        described = describe(hf_model, head, dropped, hf)
    except CheckpointError:
        raise
    except Exception as error:  # the probing pass failed: the model cannot be traced
        raise CheckpointError(
            f"{name} does not run on a short input ({type(error).__name__}: {scrub(str(error), folder)})"
        ) from error
    wrapper = (
        TransformersSeq2Seq
        if hf_model.config.is_encoder_decoder
        else (TransformersDecoder if described.causal else TransformersEncoder)
    )
    model = wrapper(hf_model, described)
    model.pass_tokens = pass_tokens
    generation_file = folder / "generation_config.json"
    generation = read_json(generation_file) if generation_file.is_file() else None
    model.generation = generation_settings(hf, generation)
    _report(progress, 0.9, "loading the tokenizer")
    tokenizer = load_tokenizer(folder)
    if tokenizer is not None:
        model.attach_tokenizer(tokenizer)
    return model


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)
