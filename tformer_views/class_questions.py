"""Questions a lecturer asks about the view on the projector, and the class's answers drawn for it (no Streamlit).

A question is tied to a view: its choices are what that view shows (the sentence's tokens, the picture's
patches, the model's heads) and the model's own answer is computed from the same trace, so the lecturer can
reveal it beside the class's. The store (tformer_app.class_store) keeps questions and answers; the pages offer
the questions their view can ask (`text_questions`, `vision_questions`); the projector draws `answer_chart`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from tformer_core.trace import Trace

KINDS = ("token", "patch", "head", "number")
MAX_PROMPT = 300  # characters of a question
MAX_CHOICES = 1024  # tokens of a sentence, patches of a picture, heads of a model


class ClassError(ValueError):
    """What a lecturer or a student is told (a code that expired, an answer out of range, too many requests)."""


@dataclass(frozen=True)
class Question:
    """A question tied to a view. choices: what an answer picks from (tokens; patches "row,col"; heads
    "layer,head"), empty for a number, which lies in lo..hi. answer: the model's answer (a choice's index, or
    the number), shown to students only once revealed."""

    kind: str
    prompt: str
    choices: list[str] = field(default_factory=list)
    answer: float | int | None = None
    lo: float = 0.0
    hi: float = 1.0
    grid: tuple[int, int] | None = None  # patches: (rows, cols); heads: (layers, heads)
    page: str = ""
    params: dict[str, str] = field(default_factory=dict)
    qid: int = 0
    revealed: bool = False
    closed: bool = False

    def label(self, value: float | int) -> str:
        """An answer as the class reads it: the token or patch or head it picks, or the number."""
        if self.kind == "number":
            return f"{float(value):.4g}"
        return self.choices[int(value)]


def check_question(q: Question) -> Question:
    """The question as asked, or ClassError: a known kind, a short prompt, choices that fit, an answer among them."""
    if q.kind not in KINDS:
        raise ClassError(f"a question is one of {', '.join(KINDS)}, not {q.kind!r}")
    prompt = " ".join(str(q.prompt).split())
    if not prompt or len(prompt) > MAX_PROMPT:
        raise ClassError(f"a question needs a prompt of 1 to {MAX_PROMPT} characters")
    if q.kind == "number":
        if not (math.isfinite(q.lo) and math.isfinite(q.hi) and q.lo < q.hi):
            raise ClassError("a number question needs a range lo < hi")
        if q.answer is not None and not (math.isfinite(float(q.answer)) and q.lo <= float(q.answer) <= q.hi):
            raise ClassError("the model's number is outside the question's range")
    else:
        if not 1 <= len(q.choices) <= MAX_CHOICES:
            raise ClassError(f"a {q.kind} question needs 1 to {MAX_CHOICES} choices")
        if q.answer is not None and not (float(q.answer).is_integer() and 0 <= int(q.answer) < len(q.choices)):
            raise ClassError("the model's answer is not one of the choices")
    choices = [str(c)[:80] for c in q.choices]
    return Question(**{**asdict(q), "prompt": prompt, "choices": choices})


def parse_answer(q: Question, raw: str) -> float | int:
    """A student's answer, checked against the question: a choice's index, or a finite number in lo..hi."""
    text = str(raw).strip()[:40]
    try:
        value = float(text)
    except ValueError:
        raise ClassError("an answer is a number") from None
    if not math.isfinite(value):
        raise ClassError("an answer is a finite number")
    if q.kind == "number":
        if not q.lo <= value <= q.hi:
            raise ClassError(f"the answer must lie between {q.lo:g} and {q.hi:g}")
        return value
    if not value.is_integer() or not 0 <= value < len(q.choices):
        raise ClassError("that is not one of the choices")
    return int(value)


def histogram(q: Question, values: Sequence[float | int], bins: int = 10) -> list[tuple[str, int]]:
    """(label, count) for the class's answers: every choice in order (zeros included), or a number's range cut
    into `bins` equal bins (a value on a bin's upper edge counts in the next one; the last bin includes hi)."""
    if q.kind != "number":
        counts = [0] * len(q.choices)
        for v in values:
            counts[int(v)] += 1
        return list(zip(q.choices, counts))
    width = (q.hi - q.lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((float(v) - q.lo) / width), bins - 1)] += 1
    return [(f"{q.lo + i * width:.3g}–{q.lo + (i + 1) * width:.3g}", c) for i, c in enumerate(counts)]


def _quoted(label: str) -> str:
    return "“" + label.strip() + "”"


def text_questions(
    labels: Sequence[str], weights: np.ndarray, layer: int, head: int, query: int, page: str = "text"
) -> list[Question]:
    """The questions a text attention view can ask, with the model's answers.

    labels: the tokens as shown [tokens]; weights: every head's attention [layers, heads, tokens, tokens] (rows
    sum to 1); layer, head, query: the view's. The key token of the head and number questions is the one the
    view's head attends to most from the query (the token question's answer).
    """
    n_layers, n_heads = weights.shape[:2]
    row = weights[layer, head, query]
    top = int(np.argmax(row))
    q, k = _quoted(labels[query]), _quoted(labels[top])
    best = int(np.argmax(weights[:, :, query, top]))  # layer * heads + head
    heads = [f"L{i} H{j}" for i in range(n_layers) for j in range(n_heads)]
    return [
        Question("token", f"Which token does {q} attend to most in layer {layer}, head {head}?",
                 choices=list(labels), answer=top, page=page),
        Question("head", f"Which head links {q} to {k} most strongly?", choices=heads, answer=best,
                 grid=(n_layers, n_heads), page=page),
        Question("number", f"How much of its attention does {q} give {k} in layer {layer}, head {head}?",
                 answer=round(float(row[top]), 4), lo=0.0, hi=1.0, page=page),
    ]  # fmt: skip


def from_trace(trace: Trace, stack: str, layer: int, head: int, query: int, labels: Sequence[str]) -> list[Question]:
    """`text_questions` for a trace's attention stack (every layer, for "which head links them?")."""
    weights = np.stack([np.asarray(trace.attention(i, stack=stack), dtype=np.float64) for i in range(trace.n_layers)])
    return text_questions(labels, weights, layer, head, query)


def vision_questions(grid: np.ndarray, layer: int, head: int | None, who: str, page: str = "vision") -> list[Question]:
    """The patch question a Vision Transformer view can ask: which patch the query (`who`: "the class token")
    attends to most. grid: [rows, cols] its attention over the patches (`tformer_views.vision.attention_map`)."""
    rows, cols = grid.shape
    which = "the mean of the heads" if head is None else f"head {head}"
    return [
        Question("patch", f"Which patch does {who} attend to most in layer {layer}, {which}?",
                 choices=[f"row {r}, col {c}" for r in range(rows) for c in range(cols)],
                 answer=int(np.argmax(grid)), grid=(rows, cols), page=page),
        Question("number", f"How much of its attention does {who} give the brightest patch (layer {layer}, {which})?",
                 answer=round(float(grid.max()), 4), lo=0.0, hi=1.0, page=page),
    ]  # fmt: skip


def answer_chart(q: Question, counts: Sequence[int], revealed: bool, scale: float = 1.0) -> dict:
    """The class's answers for the projector, a Vega-Lite spec titled "Class answers": bars over the tokens in
    their order (token, number), or a heat over the patch grid or the layers x heads (patch, head); the model's
    answer outlined (a number: its bin in blue) once revealed. counts: per choice, or per bin of a number."""
    font = {"labelFontSize": round(13 * scale), "titleFontSize": round(13 * scale)}
    answer = q.answer if revealed else None
    if q.kind in ("patch", "head") and q.grid:
        return _grid_chart(q, counts, answer, scale, font)
    if q.kind == "number":
        labels = [label for label, _ in histogram(q, [])]
        if answer is not None:  # the bin the model's number falls in
            answer = [n for _, n in histogram(q, [answer])].index(1)
    else:
        labels = [f"{i}: {c}" for i, c in enumerate(q.choices)]
    values = [
        {"choice": label, "answers": int(n), "model": i == answer} for i, (label, n) in enumerate(zip(labels, counts))
    ]
    bars = {
        "mark": {"type": "bar", "stroke": "#0066ff"},
        "encoding": {
            "x": {"field": "choice", "type": "nominal", "sort": None, "title": None,
                  "axis": {**font, "labelAngle": -40, "labelLimit": 160, "labelOverlap": False}},
            "y": {"field": "answers", "type": "quantitative", "title": "answers", "axis": {**font, "tickMinStep": 1}},
            "color": {"condition": {"test": "datum.model", "value": "#0066ff"}, "value": "#f28e2b"},
            "strokeWidth": {"condition": {"test": "datum.model", "value": 3}, "value": 0},
            "tooltip": [{"field": "choice"}, {"field": "answers"}],
        },
    }  # fmt: skip
    text = {
        "mark": {"type": "text", "dy": -8, "fontSize": round(13 * scale)},
        "transform": [{"filter": "datum.answers > 0"}],
        "encoding": {"x": {"field": "choice", "type": "nominal", "sort": None}, "y": {"field": "answers",
                     "type": "quantitative"}, "text": {"field": "answers"}},
    }  # fmt: skip
    model = {  # the model's answer named above its bar (a bar of 0 answers is no bar)
        "mark": {"type": "text", "dy": round(-26 * scale), "fontSize": round(14 * scale), "fontWeight": "bold",
                 "color": "#0066ff"},
        "transform": [{"filter": "datum.model"}],
        "encoding": {"x": {"field": "choice", "type": "nominal", "sort": None}, "y": {"field": "answers",
                     "type": "quantitative"}, "text": {"value": "▼ the model"}},
    }  # fmt: skip
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "title": "Class answers",
        "data": {"name": "answers"},
        "datasets": {"answers": pd.DataFrame(values)},
        "width": min(1100, max(240, round(40 * scale) * len(values))),
        "height": round(220 * scale),
        "layer": [bars, text, model],
    }


def _grid_chart(q: Question, counts: Sequence[int], answer: float | int | None, scale: float, font: dict) -> dict:
    """`answer_chart` for patches (the picture's rows x cols) and heads (layers x heads): a heat of the counts."""
    if q.grid is None:
        raise ValueError(f"a {q.kind} question has no grid")
    rows, cols = q.grid
    r, c = np.divmod(np.arange(rows * cols), cols)
    values = [
        {"row": int(i), "col": int(j), "label": q.choices[k], "answers": int(counts[k]), "model": k == answer}
        for k, (i, j) in enumerate(zip(r, c))
    ]
    cell = max(8, min(round(36 * scale), 640 // max(cols, 1)))
    y, x = ("layer", "head") if q.kind == "head" else ("row", "col")
    layers = [
        {"mark": {"type": "rect", "stroke": "#ddd", "strokeWidth": 0.5},
         "encoding": {"color": {"field": "answers", "type": "quantitative", "scale": {"scheme": "oranges"},
                                "title": "answers"},
                      "tooltip": [{"field": "label"}, {"field": "answers"}]}},
        {"mark": {"type": "text", "fontSize": round(11 * scale)}, "transform": [{"filter": "datum.answers > 0"}],
         "encoding": {"text": {"field": "answers"}}},
        {"mark": {"type": "rect", "fill": None, "stroke": "#0066ff", "strokeWidth": 3},
         "transform": [{"filter": "datum.model"}]},
    ]  # fmt: skip
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "title": "Class answers",
        "data": {"name": "answers"},
        "datasets": {"answers": pd.DataFrame(values)},
        "width": cell * cols,
        "height": cell * rows,
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "title": x, "axis": font},
            "y": {"field": "row", "type": "ordinal", "title": y, "axis": font},
        },
        "layer": layers,
        "config": {"legend": font},
    }


def patch_answer_picker(q: Question, cell: int = 24) -> dict:
    """A patch question's answer, clicked: the picture's grid of patches (rows x cols cells) as a Vega-Lite spec
    with the selection parameter "patch" (field "patch": the row-major index), as `charts.pickers.patch_picker`."""
    rows, cols = q.grid or (1, len(q.choices))
    r, c = np.divmod(np.arange(rows * cols), cols)
    cells = pd.DataFrame({"patch": np.arange(rows * cols), "row": r, "col": c, "label": q.choices[: rows * cols]})
    hover = {"condition": {"param": "hover", "empty": False, "value": "#f28e2b"}, "value": "#e8e8e8"}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "title": "Click a patch",
        "data": {"name": "cells"},
        "datasets": {"cells": cells},
        "width": cell * cols,
        "height": cell * rows,
        "mark": {"type": "rect", "stroke": "#fff", "strokeWidth": 1, "cursor": "pointer"},
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "title": "column"},
            "y": {"field": "row", "type": "ordinal", "title": "row"},
            "fill": hover,
            "tooltip": [{"field": "label", "title": "patch"}],
        },
        "params": [
            {"name": "patch", "select": {"type": "point", "fields": ["patch"], "on": "click"}},
            {
                "name": "hover",
                "select": {"type": "point", "fields": ["patch"], "on": "pointerover", "clear": "pointerout"},
            },
        ],
    }
