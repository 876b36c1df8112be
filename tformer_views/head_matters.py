"""Does this head matter? What the page shows for one input of any model kind, from the core's probes.

    study = text_study(model, "The capital of France is")       # a language model: p(next token)
    study.importance.effects["decoder"]     # [layers, heads] drop in p when each head is ablated
    study.attribution.heads                 # [layers, heads] each head's direct share of the logit (or None)
    study.lens                              # the prediction read after every layer (or None)
    ablated(model, study, [Head("decoder", 3, 5)])   # the number with those heads ablated
    ablation(model, study.kind, study.inputs, study.output, Head("decoder", 3, 5))   # and what it changes
    patching(model, *PAIRS["France / Italy"])       # which layer x position carries the difference

One study per kind: next-token (CausalLM), translation's next target word (EncoderDecoderModel), class (ViT),
two sentences' similarity (an encoder without a head, e.g. MiniLM). Each is computed once per input (the page
caches it); ablating a chosen head is one more pass (a similarity's two, and the clean one when the caller has
no clean trace). A study keeps arrays and labels, not the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image

from tformer_core import lens as lens_mod
from tformer_core import probes, workload
from tformer_core.errors import InputError
from tformer_core.inputs.image_file import read_image
from tformer_core.interventions import Edit, Head, Hook, ablate_heads
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import CausalLM, EncoderDecoderModel, EncoderModel, VisionModel
from tformer_core.patching import ResidualPatching, UnequalInputs, residual_patching, unequal_inputs_message
from tformer_core.patching import patching_workload as residual_patching_workload
from tformer_core.trace import Trace
from tformer_core.workload import Workload

from .pictures import to_jpeg
from .tokens import display_token, display_tokens

__all__ = [
    "PAIRS",
    "Ablation",
    "HeadStudy",
    "ablated",
    "ablation",
    "display_token",
    "grid",
    "image_study",
    "lens_frame",
    "lens_of",
    "lens_table",
    "patching",
    "patching_axes",
    "patching_cost",
    "probe_of",
    "similarity_study",
    "study",
    "study_cost",
    "text_study",
    "trace_of",
    "translation_study",
]


Progress = Callable[[float, str], None]
KINDS = ("text", "translation", "image", "similarity")
PICTURE_PX = 224  # an image study's picture, beside its prediction: the size a ViT reads


@dataclass(frozen=True, eq=False)
class HeadStudy:
    """One input's study. kind: "text", "translation", "image" or "similarity"; inputs: what it was asked
    for (`study(kind, model, *inputs)` computes it again); output: the output followed (None: a similarity);
    what: the number measured ("p(' Paris')", "cos(first, second)"); prediction: the model's top outputs
    [(label, probability)] (similarity: [("cosine similarity", value)]); importance: every head ablated;
    attribution: each head's direct share of the logit, None with `note` saying why; lens: the logit lens,
    None for a model without a head; trace: the clean pass (compact, for the attention views); picture: an
    image study's picture (JPEG, upright, at most PICTURE_PX a side) to show beside its prediction, else None.

    It holds arrays and labels only, never the model (a cached study must not keep an evicted model alive):
    what needs the model again (`ablation`) takes it as an argument."""

    kind: str
    inputs: tuple
    output: int | None
    what: str
    prediction: list[tuple[str, float]]
    importance: probes.HeadImportance
    attribution: lens_mod.Attribution | None
    note: str
    lens: lens_mod.LogitLens | None
    trace: Trace
    picture: bytes | None = None


def _attribution(model: TracedModel, trace: Trace, output: int) -> tuple[lens_mod.Attribution | None, str]:
    try:
        return lens_mod.direct_attribution(model, trace, output), ""
    except ValueError as error:
        return None, str(error)


def _start(model: TracedModel) -> int:
    if not isinstance(model, EncoderDecoderModel):
        raise InputError("a translation study needs an encoder-decoder model")
    generation = model.generation
    return int(generation.start_id if generation.start_id is not None else generation.pad_id or 0)


def _pixels(model: TracedModel, data: bytes, name: str) -> np.ndarray:
    if not isinstance(model, VisionModel) or model.preprocessing is None:
        raise ValueError("this study needs a Vision Transformer with its preprocessing")
    return np.asarray(model.preprocessing(read_image(data, name).image))


def _checked(kind: str, model: TracedModel) -> None:
    wanted = {"text": CausalLM, "translation": EncoderDecoderModel, "image": VisionModel, "similarity": EncoderModel}
    if kind not in wanted:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(model, wanted[kind]):
        needs = {"text": "a language model (decoder-only)", "translation": "an encoder-decoder model"}
        raise InputError(
            f"this study needs {needs.get(kind, 'a Vision Transformer' if kind == 'image' else 'a text encoder')}"
        )


def probe_of(kind: str, model: TracedModel, inputs: tuple, output: int | None = None) -> probes.Probe:
    """The probe of a study: `inputs` as `study` takes them; output None: the model's own top-1."""
    _checked(kind, model)
    if kind == "text":
        return probes.next_token_probe(model, inputs[0], output)  # type: ignore[arg-type]
    if kind == "translation":
        return probes.translation_probe(model, inputs[0], [_start(model)], output)  # type: ignore[arg-type]
    if kind == "image":
        return probes.class_probe(model, _pixels(model, *inputs), output)  # type: ignore[arg-type]
    return probes.similarity_probe(model, inputs[0], inputs[1])  # type: ignore[arg-type]


def trace_of(kind: str, model: TracedModel, inputs: tuple) -> Trace:
    """The traced pass of a study's input (the first sentence of a pair), under any active intervention."""
    _checked(kind, model)
    if isinstance(model, EncoderDecoderModel):
        return model.trace(inputs[0], [_start(model)])
    if isinstance(model, VisionModel):
        return model.trace(_pixels(model, *inputs))
    if isinstance(model, (CausalLM, EncoderModel)):
        return model.trace(inputs[0])
    raise InputError(f"this study does not read a {model.kind} model")


def _count(model: TracedModel, text: str, tokenizer: Any = None) -> int:
    reader = tokenizer if tokenizer is not None else model.tokenizer
    if reader is None or not isinstance(text, str):
        raise InputError("this study reads text through the model's tokenizer")
    return max(1, len(reader.encode(text)))


def study_cost(kind: str, model: TracedModel, inputs: tuple, limit_flops: float) -> tuple[Workload, str]:
    """What `study(kind, model, *inputs)` will compute, estimated before anything runs (the text tokenized, no
    pass), and what would fit within `limit_flops` ("a text of at most 37 tokens (this one has 150)"; "" when
    the input's length is not the user's to change). InputError for a kind the model cannot study."""
    _checked(kind, model)
    if kind == "image":
        assert isinstance(model, VisionModel)
        c = model.config
        tokens = c.n_prefix_tokens + c.n_patches
        return probes.head_importance_workload(model, probes.study_heads(model), tokens), ""
    heads = probes.study_heads(model)
    if kind == "translation":  # the encoder reads the source, the decoder the start token
        n, what = _count(model, inputs[0]), "a source sentence"
        cost = lambda tokens: probes.head_importance_workload(  # noqa: E731
            model, heads, tokens + 1, {"encoder": tokens, "decoder": 1}
        )
    else:
        n = sum(_count(model, text) for text in inputs)  # a similarity's two sentences, run one after the other
        what = "two sentences" if kind == "similarity" else "a text"
        cost = lambda tokens: probes.head_importance_workload(model, heads, tokens)  # noqa: E731
    most = workload.longest(cost, limit_flops, max(n, 1))
    fits = f"{what} of at most {most:,} tokens (this one has {n:,})" if most else ""
    return cost(n), fits


def patching_cost(model: TracedModel, a: str, b: str, limit_flops: float) -> tuple[Workload, str]:
    """What `patching(model, a, b)` will compute, before anything runs, and what would fit (see `study_cost`);
    InputError when A and B differ in tokens (the message of `patching`, with both inputs' tokens)."""
    if not isinstance(model, CausalLM):
        raise InputError("patching between two inputs is shown for language models (decoder-only)")
    n = _count(model, a)
    if n != _count(model, b):  # said before the cost: no grid can be run for them, whatever their length
        tokenizer = model.tokenizer
        assert tokenizer is not None  # _count read them with it
        tokens = [display_tokens(tokenizer.convert_ids_to_tokens(tokenizer.encode(text))) for text in (a, b)]
        raise InputError(unequal_inputs_message(*tokens))
    cost = lambda tokens: residual_patching_workload(model, tokens)  # type: ignore[arg-type]  # noqa: E731
    most = workload.longest(cost, limit_flops, n)
    return cost(n), (f"two inputs of at most {most:,} tokens each (these have {n:,})" if most else "")


def study(kind: str, model: TracedModel, *inputs: Any, progress: Progress | None = None) -> HeadStudy:
    """One input's study (see HeadStudy): text: (text,) a language model's next token; translation: (source,)
    a translator's first target word; image: (file bytes, file name) a ViT's top class; similarity: (first,
    second) a sentence encoder's cosine similarity of two mean-pooled embeddings. progress(fraction, message)."""
    trace = trace_of(kind, model, inputs)
    output = None if kind == "similarity" else int(trace.ranked(1)[0][0])
    probe = probe_of(kind, model, inputs, output)
    tick = progress or (lambda fraction, message: None)
    importance = probes.head_importance(probe, progress=lambda f, m: tick(0.9 * f, m))
    tick(0.9, "The logit lens and direct attribution")
    if output is None:
        prediction = [("cosine similarity", importance.clean)]
        return HeadStudy(
            kind,
            inputs,
            None,
            probe.what,
            prediction,
            importance,
            None,
            "a sentence encoder has no logit",
            None,
            trace.compact(),
        )
    attribution, note = _attribution(model, trace, output)
    lens = lens_mod.logit_lens(model, trace, k=5, target=output)
    prediction = [(display_token(label), p) for label, p in trace.predictions(5)]
    what = f"p({display_token(trace.predictions(1)[0][0])!r})"
    picture = _thumbnail(*inputs) if kind == "image" else None
    return HeadStudy(
        kind, inputs, output, what, prediction, importance, attribution, note, lens, trace.compact(), picture
    )


def _thumbnail(data: bytes, name: str) -> bytes:
    image = read_image(data, name).image
    k = PICTURE_PX // max(image.size)
    if k >= 2:  # a 64-px sample, drawn pixel-exact three times larger
        return to_jpeg(image.resize((image.width * k, image.height * k), Image.Resampling.NEAREST))
    image = image.copy()
    image.thumbnail((PICTURE_PX, PICTURE_PX))
    return to_jpeg(image)


def text_study(model: TracedModel, text: str) -> HeadStudy:
    """A language model's next token after `text`: which heads its probability depends on."""
    return study("text", model, text)


def translation_study(model: TracedModel, source: str) -> HeadStudy:
    """A translator's first target word for `source` (its greedy choice after the start token)."""
    return study("translation", model, source)


def image_study(model: TracedModel, data: bytes, name: str = "") -> HeadStudy:
    """A ViT's top class for a picture file."""
    return study("image", model, data, name)


def similarity_study(model: TracedModel, first: str, second: str) -> HeadStudy:
    """A sentence encoder's cosine similarity of two sentences' mean-pooled embeddings."""
    return study("similarity", model, first, second)


@dataclass(frozen=True, eq=False)
class Ablation:
    """One head ablated (zero). value: the study's number with it ablated; prediction: the top outputs then
    (a similarity: the value); own: the head's own attention (computed before its output, which the
    ablation replaces: the same with and without); labels: each stack's (query, key) tokens (a ViT: none, its
    weights are shown as the class token's row over the patch grid); downstream: the later head whose
    attention changed most, with its weights before and after (None: no later head, or none changed);
    changed: that largest change, the sum over its rows of half the L1 distance (0 = the same, 1 a row =
    disjoint)."""

    head: Head
    value: float
    prediction: list[tuple[str, float]]
    own: np.ndarray
    labels: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]
    downstream: Head | None
    before: np.ndarray | None
    after: np.ndarray | None
    changed: float


def _shown(trace: Trace, head: Head) -> np.ndarray:
    weights = np.asarray(trace.attention(head.layer, head.head, head.stack), dtype=np.float64)
    if trace.kind != "vit":
        return weights
    return weights[0, trace.n_prefix_tokens :].reshape(trace.patch_grid)  # the class token's row over the picture


def _most_changed(clean: Trace, ablated: Trace, head: Head) -> tuple[Head | None, float]:
    """The head (other than `head`) whose attention weights moved most, and by how much. Heads that run before
    the ablated one do not move at all, so every head is compared."""
    best, change = None, 0.0
    for stack in clean.attention_stacks:
        for layer in range(clean.layers_in(stack)):
            a = np.asarray(clean.attention(layer, None, stack), dtype=np.float64)  # [heads, n_q, n_k]
            b = np.asarray(ablated.attention(layer, None, stack), dtype=np.float64)
            per_head = 0.5 * np.abs(a - b).sum(axis=(1, 2))
            if stack == head.stack and layer == head.layer:
                per_head[head.head] = 0.0
            if per_head.max() > max(change, 1e-6):
                best, change = Head(stack, layer, int(per_head.argmax())), float(per_head.max())
    return best, change


def _display(tokens: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(display_token(t) for t in tokens[0]), tuple(display_token(t) for t in tokens[1])


def ablation(
    model: TracedModel,
    kind: str,
    inputs: tuple,
    output: int | None,
    head: Head,
    clean: Trace | None = None,
    progress: Progress | None = None,
) -> Ablation:
    """`head` ablated in a study's input (`study.kind, study.inputs, study.output`): the number measured, the
    prediction, and the attention of the head and of the head that changed most.

    One traced pass under the ablation: the number is read off its output as the study's probe reads it (a
    similarity's cosine needs the probe's own pass of both sentences: one more). clean: the input's clean trace
    when the caller has it (the study's, compact: a page's click costs one pass), else traced here (one more).
    progress(fraction, message): as each layer of each pass runs."""
    edits = ablate_heads([head])
    passes = 1 + (output is None) + (clean is None)
    ticks, step = _layer_ticks(model, passes, progress)
    step("the pass without it")
    with model.intervene([*edits, *ticks]):
        ablated_trace = trace_of(kind, model, inputs)
    if output is None:
        step("the two sentences' cosine without it")
        value = float(probe_of(kind, model, inputs, output).measure([*edits, *ticks])[0])
        prediction = [("cosine similarity", value)]
    else:
        value = _probability(ablated_trace, output)
        prediction = [(display_token(label), p) for label, p in ablated_trace.predictions(5)]
    if clean is None:
        step("the pass with every head, to compare")
        with model.intervene(ticks):
            clean = trace_of(kind, model, inputs)
    labels = {} if clean.kind == "vit" else {s: _display(clean.tokens_for(s)) for s in clean.attention_stacks}
    later, changed = _most_changed(clean, ablated_trace, head)
    before = None if later is None else _shown(clean, later)
    after = None if later is None else _shown(ablated_trace, later)
    return Ablation(head, value, prediction, _shown(clean, head), labels, later, before, after, changed)


def _probability(trace: Trace, output: int) -> float:
    """The softmax probability of `output` at the trace's last position (a ViT: of its class), in float64 as the
    probes compute it: the same number as the study's probe under the same edits."""
    logits = trace.activations["head.logits"]
    row = logits if logits.ndim == 1 else logits[-1]
    return float(torch.softmax(row.double(), dim=-1)[int(output)])


def _layer_ticks(
    model: TracedModel, passes: int, progress: Progress | None
) -> tuple[list[Edit], Callable[[str], None]]:
    """(identity edits at each layer's input that report the layers run so far over `passes` passes, step(message):
    call before each pass, it says what the pass is for). No edits without `progress`."""
    if progress is None:
        return [], lambda message: None
    layers = {s: n for s, (n, _) in probes.study_heads(model).items() if s != "cross"}  # cross: in decoder layers
    total = max(passes * sum(layers.values()), 1)
    done, said = [0], [""]

    def tick(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        done[0] += 1  # a sentence pair's probe runs each layer twice: the fraction stops at 1
        progress(min(done[0] / total, 1.0), said[0])
        return x

    def step(message: str) -> None:
        said[0] = message
        progress(min(done[0] / total, 1.0), message)

    return [Edit(f"{s}.{layer}.resid_pre", tick) for s, n in layers.items() for layer in range(n)], step


def lens_of(kind: str, model: TracedModel, inputs: tuple, output: int) -> lens_mod.LogitLens:
    """The logit lens of a study's input (one traced pass with the residual stream), following `output`."""
    return lens_mod.logit_lens(model, trace_of(kind, model, inputs), k=5, target=output)


def ablated(model: TracedModel, study: HeadStudy, heads: list[Head]) -> float:
    """The study's number with `heads` ablated together (zero), one pass."""
    return float(probe_of(study.kind, model, study.inputs, study.output).measure(ablate_heads(heads))[0])


# ---- patching between two inputs -----------------------------------------------------------------------
PAIRS = {
    "France / Italy": ("The capital of France is", "The capital of Italy is"),
    "tired / wide": (
        "The animal didn't cross the street because it was too tired",
        "The animal didn't cross the street because it was too wide",
    ),
}


def patching(model: TracedModel, a: str, b: str, progress: Progress | None = None) -> ResidualPatching:
    """B's residual stream patched into A at every layer x position (tformer_core.patching), for a language
    model; the answers are each input's own next token (or, when they agree, what B says instead)."""
    if not isinstance(model, CausalLM):
        raise ValueError("patching between two inputs is shown for language models (decoder-only)")
    try:
        return residual_patching(model, a, b, progress=progress)  # type: ignore[arg-type]
    except UnequalInputs as error:  # the same message with the tokens as the page shows them
        shown = unequal_inputs_message(display_tokens(error.tokens_a), display_tokens(error.tokens_b))
        raise InputError(shown) from error


def patching_axes(grid: ResidualPatching) -> tuple[list[str], list[str]]:
    """(row labels, column labels) of the patching grid: "L0".. "out"; each position's token, "A→B" where the
    inputs differ."""
    rows = [f"L{layer}" if layer != "out" else "out" for layer in grid.layers]
    cols = []
    for i, (a, b) in enumerate(zip(grid.tokens, grid.source_tokens, strict=True)):
        cols.append(f"{i}: {display_token(a)}" if a == b else f"{i}: {display_token(a)}→{display_token(b)}")
    return rows, cols


def grid(study: HeadStudy, stack: str, part: str) -> np.ndarray:
    """[layers, heads] of a stack: "ablation" (drop in the number) or "attribution" (share of the logit)."""
    if part == "ablation":
        return study.importance.effects[stack]
    if study.attribution is None:
        raise ValueError(study.note)
    return study.attribution.cross if stack == "cross" else study.attribution.heads  # type: ignore[return-value]


def lens_table(study: HeadStudy) -> pd.DataFrame:
    """One row per layer: the top output read there, its probability, and the final prediction's rank."""
    if study.lens is None:
        raise ValueError("this model has no head: there is no prediction to read along the way")
    return lens_frame(study.lens)


def lens_frame(lens: lens_mod.LogitLens) -> pd.DataFrame:
    """A logit lens as a table (what the page shows, and a notebook cell draws): one row per layer, the top output
    read there, its probability, and the followed output's rank and probability."""
    return pd.DataFrame(
        {
            "after layer": list(lens.layers),
            "top": [display_token(labels[0]) for labels in lens.top_labels],
            "p(top)": lens.top_probs[:, 0],
            f"rank of {display_token(lens.target_label)}": lens.rank,
            f"p({display_token(lens.target_label)})": lens.prob,
        }
    )
