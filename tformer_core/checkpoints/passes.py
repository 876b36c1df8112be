"""The working memory a checkpoint's forward pass asks for, read from its config files alone, and the server's
answer: `check(config.json's values, preprocessor_config.json's values, name)`.

Every loader calls it before a weight is read (a local folder: after the weights' headers and the parameter
count are checked, before the model is built for real) or downloaded (a hub model: once its config.json and
preprocessor_config.json are fetched, before its weights). The estimate is tformer_core.pass_memory': the config is
read by the family's own reader (the same checks and messages as loading it), without the weights.

A picture model reads pictures of the size its config gives: it is refused when one pass over such a picture
would take more than TFORMER_PASS_MB. A text model reads up to PASS_TOKENS tokens: it is given the most tokens
whose pass fits (`TracedModel.pass_tokens`; SmolLM2 reads fewer than 512 at the default), and refused only when
fewer than MIN_PASS_TOKENS would.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import pass_memory
from ..models.seq2seq import Seq2SeqConfig
from . import bart, bert, detr, fallback, gpt2, llama, mae, marian, t5, vit
from .errors import CheckpointError
from .hfconfig import HFConfig
from .limits import pass_bytes

log = logging.getLogger("tformer_core")

MIN_PASS_TOKENS = 64  # a text model that cannot read this many tokens in one pass is of no use on the pages
_TEXT_CONFIG_KEYS = {
    "d_model": ("hidden_size", "n_embd", "d_model", "dim"),
    "n_heads": ("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "num_heads"),
    "d_ff": ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "d_ff", "n_inner", "hidden_dim"),
    "n_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers"),
}


def core_config(hf: dict, preprocessor: dict | None = None) -> tuple[Any, Any]:
    """(the core's config, a DETR's preprocessing or None) that config.json's values (`hf`) and
    preprocessor_config.json's describe, without the weights: where a size comes from the weights (a
    classifier's classes, BART's vocabulary) config.json's own value is read. (None, None) for an architecture
    no loader reads (the loader refuses it with its reason)."""
    c = HFConfig(hf)
    model_type = hf.get("model_type")
    if model_type in bert.MODEL_TYPES:
        family = "roberta" if model_type in bert.ROBERTA_LIKE else str(model_type)
        return bert.encoder_config(hf, family, True, {}), None  # a masked-word head: logits for every token
    if model_type in gpt2.MODEL_TYPES:
        return gpt2.config(c), None
    if model_type in llama.MODEL_TYPES:
        return llama.llama_config(c, str(model_type)), None
    if model_type in bart.MODEL_TYPES or model_type in marian.MODEL_TYPES:
        vocab = c.whole("vocab_size")
        return Seq2SeqConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, **bart.stack_sizes(hf)), None
    if model_type in t5.MODEL_TYPES:
        return t5.t5_config(hf, c.whole("vocab_size"), True), None
    if model_type in vit.MODEL_TYPES:
        distilled = model_type == "deit"
        return vit.vit_config(c, _n_classes(c), distilled, distilled), None
    if model_type in mae.MODEL_TYPES:
        return mae.mae_config(c), None
    if model_type in detr.MODEL_TYPES:
        return detr.detr_config(c, _n_classes(c) or 91), detr.preprocessing_from(preprocessor or {})
    if fallback.transformers_implements(model_type):
        return _transformers_config(hf), None
    return None, None


def _n_classes(c: HFConfig) -> int:
    labels = c.raw("id2label", {})
    return len(labels) if isinstance(labels, dict) else 0


def _transformers_config(hf: dict) -> Any:
    """A TransformersConfig with the sizes config.json (or its text_config) gives, for the estimate only."""
    from ..models.fallback import TransformersConfig

    nested = hf.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else hf
    c = HFConfig(text)

    def first(keys: tuple[str, ...], default: int | None = None) -> int | None:
        return next((c.whole(k, None, low=0) for k in keys if k in c), default)

    d_model, heads = first(_TEXT_CONFIG_KEYS["d_model"]), first(_TEXT_CONFIG_KEYS["n_heads"])
    layers = first(_TEXT_CONFIG_KEYS["n_layers"])
    if not d_model or not heads or not layers:
        return None
    positions = next((text[k] for k in fallback._MAX_POSITION_KEYS if isinstance(text.get(k), int)), None)
    seq2seq = bool(hf.get("is_encoder_decoder"))
    return TransformersConfig(
        model_type=str(hf.get("model_type")),
        architecture="",
        d_model=d_model,
        n_heads=heads,
        d_head=max(d_model // heads, 1),
        d_ff=first(_TEXT_CONFIG_KEYS["d_ff"]) or 4 * d_model,
        vocab_size=c.whole("vocab_size", 0, low=0),
        max_positions=min(positions or fallback.TRACE_MAX_TOKENS, fallback.TRACE_MAX_TOKENS),
        n_layers=layers,
        n_decoder_layers=(first(("decoder_layers", "num_decoder_layers"), layers) or 0) if seq2seq else 0,
    )


def check(hf: dict, preprocessor: dict | None, name: str) -> int | None:
    """The most tokens one pass of a text model reads on this server (None for a picture model), after the
    estimate of its pass (tformer_core.pass_memory) against TFORMER_PASS_MB; CheckpointError naming the setting when
    a picture model's pass, or a text model's over MIN_PASS_TOKENS tokens, would take more."""
    config, preprocessing = core_config(hf, preprocessor)
    if config is None:
        return None
    budget = pass_bytes()
    if pass_memory.reads_text(config):
        tokens = pass_memory.tokens_within(config, budget)
        most = pass_memory.text_tokens(getattr(config, "max_positions", None))
        if tokens >= min(MIN_PASS_TOKENS, most):
            if tokens < most:
                log.info("%s reads at most %d tokens in one pass (TFORMER_PASS_MB)", name, tokens)
            return tokens
        cost = pass_memory.pass_cost(config, tokens=min(MIN_PASS_TOKENS, most))
        raise CheckpointError(_too_big(name, cost, budget, "as few as "))
    cost = pass_memory.pass_cost(config, preprocessing)
    if cost.total > budget:
        raise CheckpointError(_too_big(name, cost, budget))
    return None


def _too_big(name: str, cost: pass_memory.PassCost, budget: int, few: str = "") -> str:
    return (
        f"{name}: one pass over {few}{cost.input} would take about {_mb(cost.total)} of working memory (one "
        f"layer's attention alone {_mb(cost.attention)}), more than this server gives a pass: the limit is "
        f"{_mb(budget)} (the setting TFORMER_PASS_MB)"
    )


def _mb(n_bytes: int) -> str:
    """Memory in MB of 2**20 bytes, as TFORMER_PASS_MB counts it (GB of 2**30 from 10 GB)."""
    if n_bytes >= 10 * 2**30:
        return f"{n_bytes / 2**30:,.0f} GB"
    return f"{n_bytes / 2**20:,.0f} MB" if n_bytes >= 2**20 else f"{n_bytes / 2**20:.1f} MB"
