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

from typing import Any

from ..models.seq2seq import Seq2SeqConfig
from . import bart, bert, detr, dinov2, fallback, gpt2, llama, mae, marian, t5, vit
from .hfconfig import HFConfig
from .limits import check_pass


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
    if model_type in dinov2.MODEL_TYPES:
        return dinov2.dinov2_config(c, preprocessor, model_type == "dinov2_with_registers"), None
    if model_type in mae.MODEL_TYPES:
        return mae.mae_config(c), None
    if model_type in detr.MODEL_TYPES:
        return detr.detr_config(c, _n_classes(c) or 91), detr.preprocessing_from(preprocessor or {})
    if fallback.transformers_implements(model_type):
        return fallback.estimate_config(hf), None
    return None, None


def _n_classes(c: HFConfig) -> int:
    labels = c.raw("id2label", {})
    return len(labels) if isinstance(labels, dict) else 0


def check(hf: dict, preprocessor: dict | None, name: str) -> int | None:
    """The most tokens one pass of a text model reads on this server (None for a picture model, or an
    architecture no loader reads), from config.json's values (`hf`) and preprocessor_config.json's: the
    family's config read as `core_config` reads it, then `limits.check_pass` (TFORMER_PASS_MB)."""
    config, preprocessing = core_config(hf, preprocessor)
    return None if config is None else check_pass(config, preprocessing, name)
