"""Does this head matter? What the page shows for one input of any model kind, from the core's probes.

    study = text_study(model, "The capital of France is")       # a language model: p(next token)
    study.importance.effects["decoder"]     # [layers, heads] drop in p when each head is ablated
    study.attribution.heads                 # [layers, heads] each head's direct share of the logit (or None)
    study.lens                              # the prediction read after every layer (or None)
    ablated(study, [Head("decoder", 3, 5)]) # the prediction with those heads ablated

One study per kind: next-token (CausalLM), translation's next target word (EncoderDecoderModel), class (ViT),
two sentences' similarity (an encoder without a head, e.g. MiniLM). Each is computed once per input (the page
caches it); ablating a chosen head is one more pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core import lens as lens_mod
from tformer_core import probes
from tformer_core.inputs.image_file import read_image
from tformer_core.interventions import Head, ablate_heads
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import CausalLM, EncoderDecoderModel, EncoderModel, VisionModel
from tformer_core.trace import Trace

from .tokens import display_token

__all__ = ["HeadStudy", "ablated", "display_token", "grid", "image_study", "lens_table", "similarity_study"]
__all__ += ["text_study", "translation_study"]


@dataclass(frozen=True, eq=False)
class HeadStudy:
    """One input's study. what: the number measured ("p(' Paris')", "cos(first, second)"); prediction: the model's
    top outputs [(label, probability)] (similarity: [("cosine similarity", value)]); importance: every head
    ablated; attribution: each head's direct share of the logit, None with `note` saying why; lens: the logit
    lens, None for a model without a head; trace: the clean pass (for the attention views)."""

    what: str
    prediction: list[tuple[str, float]]
    importance: probes.HeadImportance
    attribution: lens_mod.Attribution | None
    note: str
    lens: lens_mod.LogitLens | None
    trace: Trace
    probe: probes.Probe


def _attribution(model: TracedModel, trace: Trace, output: int) -> tuple[lens_mod.Attribution | None, str]:
    try:
        return lens_mod.direct_attribution(model, trace, output), ""
    except ValueError as error:
        return None, str(error)


def _finish(model: TracedModel, trace: Trace, probe: probes.Probe, output: int | None) -> HeadStudy:
    importance = probes.head_importance(probe)
    if output is None:
        prediction = [("cosine similarity", importance.clean)]
        note = "a sentence encoder has no logit"
        return HeadStudy(probe.what, prediction, importance, None, note, None, trace.compact(), probe)
    attribution, note = _attribution(model, trace, output)
    lens = lens_mod.logit_lens(model, trace, k=5, target=output)
    prediction = [(display_token(label), p) for label, p in trace.predictions(5)]
    what = f"p({display_token(trace.predictions(1)[0][0])!r})"
    return HeadStudy(what, prediction, importance, attribution, note, lens, trace.compact(), probe)


def text_study(model: TracedModel, text: str) -> HeadStudy:
    """A language model's next token after `text`: which heads its probability depends on."""
    if not isinstance(model, CausalLM):
        raise ValueError("this study needs a language model (decoder-only)")
    trace = model.trace(text)
    probe = probes.next_token_probe(model, text)  # type: ignore[arg-type]
    return _finish(model, trace, probe, int(trace.ranked(1)[0][0]))


def translation_study(model: TracedModel, source: str) -> HeadStudy:
    """A translator's first target word for `source` (its greedy choice after the start token)."""
    if not isinstance(model, EncoderDecoderModel):
        raise ValueError("this study needs an encoder-decoder model")
    start = model.generation.start_id if model.generation.start_id is not None else model.generation.pad_id
    trace = model.trace(source, [int(start or 0)])
    probe = probes.translation_probe(model, source, [int(start or 0)])  # type: ignore[arg-type]
    return _finish(model, trace, probe, int(trace.ranked(1)[0][0]))


def image_study(model: TracedModel, data: bytes, name: str = "") -> HeadStudy:
    """A ViT's top class for a picture file."""
    if not isinstance(model, VisionModel) or model.preprocessing is None:
        raise ValueError("this study needs a Vision Transformer with its preprocessing")
    pixels = model.preprocessing(read_image(data, name).image)
    trace = model.trace(pixels)
    probe = probes.class_probe(model, pixels)  # type: ignore[arg-type]
    return _finish(model, trace, probe, int(trace.ranked(1)[0][0]))


def similarity_study(model: TracedModel, first: str, second: str) -> HeadStudy:
    """A sentence encoder's cosine similarity of two sentences' mean-pooled embeddings."""
    if not isinstance(model, EncoderModel):
        raise ValueError("this study needs a text encoder")
    trace = model.trace(first)
    return _finish(model, trace, probes.similarity_probe(model, first, second), None)  # type: ignore[arg-type]


def ablated(study: HeadStudy, heads: list[Head]) -> float:
    """The probe's number with `heads` ablated together (zero), one pass."""
    return float(study.probe.measure(ablate_heads(heads))[0])


def grid(study: HeadStudy, stack: str, part: str) -> np.ndarray:
    """[layers, heads] of a stack: "ablation" (drop in the number) or "attribution" (share of the logit)."""
    if part == "ablation":
        return study.importance.effects[stack]
    if study.attribution is None:
        raise ValueError(study.note)
    return study.attribution.cross if stack == "cross" else study.attribution.heads  # type: ignore[return-value]


def lens_table(study: HeadStudy) -> pd.DataFrame:
    """One row per layer: the top output read there, its probability, and the final prediction's rank."""
    lens = study.lens
    if lens is None:
        raise ValueError("this model has no head: there is no prediction to read along the way")
    return pd.DataFrame(
        {
            "after layer": list(lens.layers),
            "top": [display_token(labels[0]) for labels in lens.top_labels],
            "p(top)": lens.top_probs[:, 0],
            f"rank of {display_token(lens.target_label)}": lens.rank,
            f"p({display_token(lens.target_label)})": lens.prob,
        }
    )
