"""Does this head matter? One input made ready to run many times with interventions, and every head ablated.

    probe = next_token_probe(model, "The capital of France is")      # p(" Paris"), the model's own top-1
    result = head_importance(probe)                                  # every head ablated, in batched passes
    result.effects["decoder"][3, 5]      # how much p(" Paris") drops when head 5 of layer 3 is ablated
    result.seconds, result.passes

A `Probe` is a model, an input and the number measured on it, one per model kind: the next token's
probability (a language model, a translator's next target token), a class's probability (a ViT), the cosine
similarity of two sentences' mean-pooled embeddings (a sentence encoder such as MiniLM, which has no head).

`head_importance` ablates each head in its own batch row. The rows that ablate a head of layer l are copies
of the clean row up to layer l (`interventions.branch` grows the batch at layer l's input): the layers below
an ablation run once, not once per head, and only the predicted position goes through the unembedding. Row 0
stays clean: the clean score comes from the same pass. Passes are cut so that a pass holds at most
ROW_TOKENS rows x tokens, which bounds its memory whatever the input's length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import workload
from .capture import Edit, Hook
from .interventions import ABLATIONS, Head, branch, scale_heads
from .models.base import TracedModel
from .models.decoder import Decoder
from .models.encoder import Encoder
from .models.seq2seq import EncoderDecoder
from .models.vit import ViT, image_input
from .workload import Workload

__all__ = [
    "ROW_TOKENS",
    "HeadImportance",
    "Probe",
    "Progress",
    "class_probe",
    "head_importance",
    "head_importance_workload",
    "next_token_probe",
    "require_core",
    "similarity_probe",
    "study_heads",
    "translation_probe",
]

Progress = Callable[[float, str], None]
ROW_TOKENS = 8192  # rows x tokens of one batched pass: SmolLM2's FFN holds 8192 x 1536 floats (50 MB) at most


@dataclass(frozen=True, eq=False)
class Probe:
    """One input of a model, ready to be run many times under edits.

    run(): one forward pass of the input (batch 1, grown by `branch` edits) -> its raw output; score(output) ->
    (B,) the number measured, per batch row. what: that number in words ("p(' Paris')"). heads: the attention
    stacks and their (layers, heads). branch_stacks: the stacks whose layers a batch may branch at, in the
    order the pass runs them (an encoder-decoder's decoder reads the encoder's output, which stays one row).
    tokens: positions per pass (all sequences together), for the memory bound. edits: always applied.
    """

    model: TracedModel
    run: Callable[[], torch.Tensor]
    score: Callable[[torch.Tensor], torch.Tensor]
    what: str
    heads: dict[str, tuple[int, int]]
    tokens: int
    edits: tuple[Edit, ...] = ()

    def measure(self, edits: list[Edit] | tuple[Edit, ...] = ()) -> np.ndarray:
        """The score of every batch row of one pass under `edits` (float64 [B]; HookNameError, before the pass,
        for an edit whose name the model has no hook point for)."""
        with torch.inference_mode(), self.model.intervene([*self.edits, *edits]):
            return self.score(self.run()).double().cpu().numpy()


def require_core(model: TracedModel) -> None:
    """ValueError unless the core runs `model` (its hook points take edits; transformers' own models have none)."""
    if model.path != "tformer":
        raise ValueError("interventions need the core's own modules (hook points); transformers runs this model")


def _label(model: TracedModel, output: int) -> str:
    labels = model.output_labels
    return repr(str(labels[output])) if labels is not None and output < len(labels) else str(output)


def _probability_of(
    model: TracedModel,
    output: int | None,
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    run: Callable[[], torch.Tensor],
    edits: tuple[Edit, ...] = (),
) -> tuple[int, Callable[[torch.Tensor], torch.Tensor]]:
    """(output id, score function): the softmax probability of `output` (default: the clean pass's top-1, which
    costs one pass of `model` under `edits`; given an output, none runs)."""
    if output is None:
        with torch.inference_mode(), model.intervene(edits):
            output = int(logits_of(run())[0].argmax())
    chosen = int(output)
    return chosen, lambda out: torch.softmax(logits_of(out).double(), dim=-1)[:, chosen]


def next_token_probe(model: Decoder, text: str | list[int], token: int | None = None) -> Probe:
    """A language model's probability of `token` (default: its own top-1) after the last position of `text`."""
    require_core(model)
    with torch.inference_mode(False):  # a plain tensor, which relevancy's backward pass may use
        ids, _ = model._ids(text, model.config.vocab_size, model.config.max_positions)
    last = (Edit("decoder.out", lambda x, hook: x[:, -1:]),)  # only the last position reaches the unembedding
    run = lambda: model(ids)  # noqa: E731
    token, score = _probability_of(model, token, lambda out: out[:, -1], run, last)
    layers, heads = model.config.n_layers, model.config.n_heads
    return Probe(model, run, score, f"p({_label(model, token)})", {"decoder": (layers, heads)}, ids.shape[1], last)


def translation_probe(
    model: EncoderDecoder, source: str | list[int], target: list[int], token: int | None = None
) -> Probe:
    """A translator's probability of target token `token` (default: its top-1) after the target prefix `target`
    (token ids, starting with the start token), reading `source`."""
    require_core(model)
    c = model.config
    with torch.inference_mode(False):
        src, _ = model._ids(source, c.src_vocab_size, c.max_positions, what="source")
        tgt, _ = model._ids(target, c.tgt_vocab_size, c.max_positions, model.target_tokenizer, "target")
    last = (Edit("decoder.out", lambda x, hook: x[:, -1:]),)
    run = lambda: model(src, tgt)  # noqa: E731
    token, score = _probability_of(model, token, lambda out: out[:, -1], run, last)
    heads = {"encoder": (c.n_encoder_layers, c.n_heads), "decoder": (c.n_decoder_layers, c.n_heads)}
    heads["cross"] = heads["decoder"]
    return Probe(model, run, score, f"p({_label(model, token)})", heads, src.shape[1] + tgt.shape[1], last)


def class_probe(model: ViT, image: torch.Tensor | np.ndarray, class_id: int | None = None) -> Probe:
    """A ViT's probability of class `class_id` (default: its top-1) for one preprocessed image (C, H, W)."""
    require_core(model)
    if model.head is None:
        raise ValueError("this ViT has no class head")
    with torch.inference_mode(False):
        x = image_input(image, model.config, model.device, model.dtype).clone()
    run = lambda: model(x)  # noqa: E731
    class_id, score = _probability_of(model, class_id, lambda out: out, run)
    c = model.config
    tokens = c.n_prefix_tokens + c.n_patches
    return Probe(model, run, score, f"p({_label(model, class_id)})", {"encoder": (c.n_layers, c.n_heads)}, tokens)


def similarity_probe(model: Encoder, first: str | list[int], second: str | list[int]) -> Probe:
    """The cosine similarity of two sentences' embeddings (each the mean of its final hidden states over its
    tokens, as MiniLM's sentence embedding): both sentences run under the same edits, row for row."""
    require_core(model)
    c = model.config
    with torch.inference_mode(False):
        a, _ = model._ids(first, c.vocab_size, c.max_positions, what="first sentence")
        b, _ = model._ids(second, c.vocab_size, c.max_positions, what="second sentence")

    def run() -> torch.Tensor:
        return torch.stack([model(a).mean(dim=1), model(b).mean(dim=1)])  # (2, B, D)

    def score(out: torch.Tensor) -> torch.Tensor:
        return torch.cosine_similarity(out[0].double(), out[1].double(), dim=-1)  # (B,)

    return Probe(model, run, score, "cos(first, second)", {"encoder": (c.n_layers, c.n_heads)}, a.shape[1] + b.shape[1])


@dataclass(frozen=True, eq=False)
class HeadImportance:
    """Every head ablated, one at a time. clean: the probe's score without ablation; scores[stack] [layers,
    heads]: the score with that head ablated; effects: clean - scores (the drop: positive where the head
    helped). seconds: the time taken; passes: forward passes run; rows: batch rows run in all (each a whole
    or, branched, a partial pass)."""

    what: str
    how: str
    clean: float
    scores: dict[str, np.ndarray]
    seconds: float
    passes: int
    rows: int
    effects: dict[str, np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "effects", {s: self.clean - v for s, v in self.scores.items()})

    def ranked(self) -> list[tuple[Head, float]]:
        """Every head with its effect, the largest drop first."""
        items = [(Head(s, l, h), float(e[l, h])) for s, e in self.effects.items() for l, h in np.ndindex(e.shape)]
        return sorted(items, key=lambda item: -item[1])


def _branch_stack(stack: str) -> str:
    return "encoder" if stack == "encoder" else "decoder"  # a decoder layer holds its self- and cross-attention


def _chunks(probe: Probe) -> list[tuple[str, list[tuple[int, list[Head]]]]]:
    """The passes: (stack branched, [(layer, the heads its rows ablate)]), each pass within ROW_TOKENS."""
    return _plan(probe.heads, probe.tokens)


def _plan(heads: dict[str, tuple[int, int]], tokens: int) -> list[tuple[str, list[tuple[int, list[Head]]]]]:
    passes = []
    for branched in ("encoder", "decoder"):
        stacks = [s for s in heads if _branch_stack(s) == branched]
        if not stacks:
            continue
        current: list[tuple[int, list[Head]]] = []
        rows = 1
        for layer in range(heads[stacks[0]][0]):
            units = [Head(s, layer, h) for s in stacks for h in range(heads[s][1])]
            if current and (rows + len(units)) * tokens > ROW_TOKENS:
                passes.append((branched, current))
                current, rows = [], 1
            current.append((layer, units))
            rows += len(units)
        passes.append((branched, current))
    return passes


def study_heads(model: TracedModel) -> dict[str, tuple[int, int]]:
    """The attention stacks every head of `model` is ablated in, and their (layers, heads), as its kind's probe
    names them (Probe.heads): a language model's "decoder", an encoder's or a ViT's "encoder", a translator's
    "encoder", "decoder" and "cross"."""
    require_core(model)
    n_heads = int(model.config.n_heads)
    heads = {s: (workload.stack_layers(model, s), n_heads) for s in ("encoder", "decoder") if _has_stack(model, s)}
    if isinstance(model, EncoderDecoder):
        heads["cross"] = heads["decoder"]
    return heads


def _has_stack(model: TracedModel, stack: str) -> bool:
    return isinstance(getattr(model, stack, None), nn.Module)


def head_importance_workload(
    model: TracedModel, heads: dict[str, tuple[int, int]], tokens: int, stack_tokens: dict[str, int] | None = None
) -> Workload:
    """What `head_importance` computes for a probe of `heads` (Probe.heads) and `tokens` positions a pass
    (Probe.tokens), before anything runs: its passes as `_plan` cuts them, each row through the layers it runs
    (a row that ablates a head of layer l joins the batch at l; an encoder-decoder's other stack runs one row, or
    every row after the encoder grew them). stack_tokens: the positions each stack runs where they differ (a
    translator's encoder reads the source, its decoder the target so far). tformer_core.workload says what is
    counted."""
    model_stacks = [s for s in ("encoder", "decoder") if _has_stack(model, s)]
    per_stack = {s: (stack_tokens or {}).get(s, tokens) for s in model_stacks}
    rows_through: dict[str, list[int]] = {s: [0] * workload.stack_layers(model, s) for s in model_stacks}
    total = finals = memory_rows = 0
    for branched, layers in _plan(heads, tokens):
        grow = {layer: len(units) for layer, units in layers}
        rows, final = 1, 1 + sum(grow.values())
        for stack in model_stacks:
            for layer in range(len(rows_through[stack])):
                if stack == branched:
                    rows += grow.get(layer, 0)
                    rows_through[stack][layer] += rows
                else:  # the encoder before a branched decoder: one row; the decoder after a branched encoder: all
                    rows_through[stack][layer] += 1 if stack == "encoder" else final
        total, finals = total + final, finals + final
        memory_rows += final if branched == "encoder" else 1  # the encoder's output a decoder's pass reads
    memory = per_stack["encoder"] if len(model_stacks) == 2 else 0  # what a translator's decoder reads
    parts = [
        workload.of_passes(model, s, per_stack[s], rows_through[s], memory=memory if s == "decoder" else 0)
        for s in model_stacks
    ]
    head = workload.head_flops(model, finals)
    if memory:
        head += memory_rows * workload.cross_kv_flops(model, "decoder", memory)
    depth = sum(len(r) for r in rows_through.values())
    return Workload("Ablating every head", total, tokens, depth, sum(p.flops for p in parts) + head)


def _pass_edits(branched: str, layers: list[tuple[int, list[Head]]], how: str) -> list[Edit]:
    """Branch at each layer's input, one new row per head of that layer, and ablate each row's head."""
    edits, rows = [], 1
    for layer, units in layers:
        edits.append(branch(f"{branched}.{layer}.resid_pre", len(units)))
        for stack in dict.fromkeys(u.stack for u in units):
            mine = [(rows + i, u.head) for i, u in enumerate(units) if u.stack == stack]
            factors = torch.ones(rows + len(units), max(h for _, h in mine) + 1)
            for row, head in mine:
                factors[row, head] = 0.0
            edits.append(scale_heads(Head(stack, layer, 0).block, factors, how))
        rows += len(units)
    return edits


def _ticks(n_layers: int, branched: str, done: list[int], total: int, progress: Progress) -> list[Edit]:
    """Identity edits at each layer's input that report the layers run so far (one pass can take seconds)."""

    def tick(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        done[0] += 1  # a sentence pair's probe runs each layer twice a pass: the fraction stops at 1
        progress(min(done[0] / total, 1.0), "Ablating every head, one batch row each")
        return x

    return [Edit(f"{branched}.{layer}.resid_pre", tick) for layer in range(n_layers)]


def head_importance(probe: Probe, how: str = "zero", progress: Progress | None = None) -> HeadImportance:
    """Ablate every head of the probe's model, one per batch row (zero: z <- 0; mean: z <- its mean over the
    positions), in as few passes as ROW_TOKENS allows; see the module docstring. progress(fraction, message):
    called as each layer of each pass runs."""
    if how not in ABLATIONS:
        raise ValueError(f"how must be one of {ABLATIONS}, got {how!r}")
    scores = {s: np.full(shape, np.nan) for s, shape in probe.heads.items()}
    start = time.perf_counter()
    clean, rows, passes = None, 0, 0
    chunks, done = _chunks(probe), [0]
    total = sum(probe.heads[branched][0] for branched, _ in chunks)
    for branched, layers in chunks:
        ticks = [] if progress is None else _ticks(probe.heads[branched][0], branched, done, total, progress)
        measured = probe.measure([*_pass_edits(branched, layers, how), *ticks])
        passes, rows, clean = passes + 1, rows + len(measured), float(measured[0])
        units = [u for _, us in layers for u in us]
        for u, value in zip(units, measured[1:], strict=True):
            scores[u.stack][u.layer, u.head] = value
    seconds = time.perf_counter() - start
    assert clean is not None
    return HeadImportance(probe.what, how, clean, scores, seconds, passes, rows)
