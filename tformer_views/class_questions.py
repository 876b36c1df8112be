"""Questions a lecturer asks about the view on the projector, and the class's answers drawn for it (no Streamlit).

A question is tied to a view: its choices are what that view shows (the sentence's tokens, the picture's
patches, the model's heads) and the model's own answer is computed from the same trace, so the lecturer can
reveal it beside the class's. The store (tformer_app.class_store) keeps questions and answers; the pages offer
the questions their view can ask (`text_questions`, `vision_questions`); the projector draws `answer_chart`.

Predict, intervene, reveal: "Does this head matter?" asks which head, removed, changes the answer most (the
reveal ablates the head the class chose most, one intervention for the class, beside the model's answer:
`ablation_effect`), what the model predicts with a head removed, and from which layer the logit lens ranks the
answer first (`head_questions`); Text attention (a language model) and Vision ask the last two about the view's
head (`view_questions`, made when asked). A question may be voted on twice (peer instruction: `vote_shift`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tformer_core.trace import Trace

if TYPE_CHECKING:
    from tformer_views.head_matters import Ablation, HeadStudy

__all__ = [
    "ACTIONS",
    "KINDS",
    "MAX_CHOICES",
    "MAX_EFFECT",
    "MAX_PICTURE",
    "MAX_PROMPT",
    "PICTURE_PREFIX",
    "ROUNDS",
    "SPECIAL",
    "ClassError",
    "Deferred",
    "Question",
    "ablation_effect",
    "answer_chart",
    "check_question",
    "decimals",
    "effect_chart",
    "from_trace",
    "head_questions",
    "histogram",
    "key_token",
    "lens_question",
    "most_chosen",
    "output_question",
    "parse_answer",
    "patch_answer_picker",
    "question_picture",
    "text_questions",
    "view_questions",
    "vision_questions",
    "vote_shift",
]

# "output": one of the model's top outputs (what it will predict under an intervention); "layer": a layer of the
# logit lens. Both are answered as tokens are (a bar per choice).
KINDS = ("token", "patch", "head", "number", "output", "layer")
MAX_PROMPT = 300  # characters of a question
MAX_CHOICES = 1024  # tokens of a sentence, patches of a picture, heads of a model
ROUNDS = (1, 2)  # peer instruction: a first vote, the class talks, a second vote
# What a reveal runs: "ablate" the head the class chose most (of the question's `stack`), or nothing but showing.
ACTIONS = ("", "ablate")
PICTURE_PREFIX = "data:image/jpeg;base64,"
MAX_PICTURE = 48_000  # characters of a patch question's picture (a JPEG data URI): every student's page gets it
MAX_EFFECT = 12_000  # characters of a reveal's effect (JSON): a few lines, the grid of every head's effect


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
    round: int = 1  # the vote open now (2 after *Vote again*); round 1's answers are kept beside round 2's
    action: str = ""  # what the reveal runs (ACTIONS); "ablate" needs `stack`
    stack: str = ""  # a head question's attention stack ("decoder", "cross", ...)
    picture: str = ""  # a patch question's picture under the student's grid (JPEG data URI), or ""
    effect: dict[str, Any] = field(default_factory=dict)  # what the reveal showed (`ablation_effect`), JSON

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
    if q.round not in ROUNDS or q.action not in ACTIONS or (q.action == "ablate" and q.kind != "head"):
        raise ClassError("a question's round is 1 or 2, and only a head question's reveal ablates its choice")
    if q.picture and (not q.picture.startswith(PICTURE_PREFIX) or len(q.picture) > MAX_PICTURE):
        raise ClassError(f"a question's picture is a JPEG data URI of at most {MAX_PICTURE:,} characters")
    if len(json.dumps(q.effect)) > MAX_EFFECT:
        raise ClassError(f"a question's effect is at most {MAX_EFFECT:,} characters")
    choices = [str(c)[:80] for c in q.choices]
    return Question(**{**asdict(q), "prompt": prompt, "choices": choices, "stack": str(q.stack)[:20]})


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
    view's head attends to most from the query, other than a special token or the first one (`key_token`).
    """
    n_layers, n_heads = weights.shape[:2]
    row = weights[layer, head, query]
    top = int(np.argmax(row))
    key = key_token(labels, row)
    q, k = _quoted(labels[query]), _quoted(labels[key])
    best = int(np.argmax(weights[:, :, query, key]))  # layer * heads + head
    heads = [f"L{i} H{j}" for i in range(n_layers) for j in range(n_heads)]
    return [
        Question("token", f"Which token does {q} attend to most in layer {layer}, head {head}?",
                 choices=list(labels), answer=top, page=page),
        Question("head", f"Which head links {q} to {k} most strongly?", choices=heads, answer=best,
                 grid=(n_layers, n_heads), page=page),
        Question("number", f"How much of its attention does {q} give {k} in layer {layer}, head {head}?",
                 answer=round(float(row[key]), 4), lo=0.0, hi=1.0, page=page),
    ]  # fmt: skip


# [CLS], [SEP], [PAD]; <s>, </s>, <|im_start|>, <|endoftext|>, <bos>: tokens a head parks its attention on.
SPECIAL = re.compile(r"\[[A-Z]+\]|<\|?/?[A-Za-z_]*\|?>")


def key_token(labels: Sequence[str], row: np.ndarray) -> int:
    """The key a question about a pair of tokens names: the one the row attends to most among the ordinary tokens
    (not a special token, not the first: the sink a head parks attention on, [CLS] or a BOS, which makes "which
    head links 'it' to '[CLS]'?" a question about nothing), or the row's top when the row has no other (a causal
    query at the first position)."""
    ordinary = [i for i in range(1, len(row)) if row[i] > 0 and not SPECIAL.fullmatch(str(labels[i]).strip())]
    if not ordinary:
        return int(np.argmax(row))
    return max(ordinary, key=lambda i: (float(row[i]), -i))


def from_trace(trace: Trace, stack: str, layer: int, head: int, query: int, labels: Sequence[str]) -> list[Question]:
    """`text_questions` for a trace's attention stack (every layer, for "which head links them?")."""
    weights = np.stack([np.asarray(trace.attention(i, stack=stack), dtype=np.float64) for i in range(trace.n_layers)])
    return text_questions(labels, weights, layer, head, query)


def vision_questions(
    grid: np.ndarray, layer: int, head: int | None, who: str, page: str = "vision", picture: str = ""
) -> list[Question]:
    """The patch question a Vision Transformer view can ask: which patch the query (`who`: "the class token")
    attends to most. grid: [rows, cols] its attention over the patches (`tformer_views.vision.attention_map`);
    picture: the picture as the model saw it (`question_picture`), under the students' grid of patches."""
    rows, cols = grid.shape
    which = "the mean of the heads" if head is None else f"head {head}"
    return [
        Question("patch", f"Which patch does {who} attend to most in layer {layer}, {which}?",
                 choices=[f"row {r}, col {c}" for r in range(rows) for c in range(cols)],
                 answer=int(np.argmax(grid)), grid=(rows, cols), page=page, picture=picture),
        Question("number", f"How much of its attention does {who} give the brightest patch (layer {layer}, {which})?",
                 answer=round(float(grid.max()), 4), lo=0.0, hi=1.0, page=page),
    ]  # fmt: skip


def question_picture(image: Any, side: int = 192, quality: int = 70) -> str:
    """A picture for a patch question (a PIL image, as the view draws it): at most `side` pixels a side, JPEG, as
    a data URI of a few KB (each student's page gets it; MAX_PICTURE bounds it)."""
    import base64
    import io

    small = image.convert("RGB")
    small.thumbnail((side, side))
    for q in (quality, 50, 30):
        buffer = io.BytesIO()
        small.save(buffer, format="JPEG", quality=q)
        uri = PICTURE_PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii")
        if len(uri) <= MAX_PICTURE:
            return uri
    return ""  # a picture that will not shrink enough: the grid alone, as before


def _head_label(layer: int, head: int) -> str:
    return f"L{layer} H{head}"


@dataclass(frozen=True)
class Deferred:
    """A question the lecturer may ask whose model answer costs a pass or three (an ablation, a lens): offered by
    its kind and prompt, made (`make()`, cached by the app) only when asked."""

    kind: str
    prompt: str
    make: Callable[[], Question]


def head_questions(study: HeadStudy, stack: str, chosen: Ablation | None = None, page: str = "heads") -> list[Question]:
    """The questions "Does this head matter?" can ask about one study (tformer_views.head_matters), with the
    model's answers from the same study: which head of `stack`, removed, changes the number most (the reveal
    ablates the class's choice: `ablation_effect`); what the model predicts with `chosen`'s head removed (its top
    10 outputs; not for a similarity, which predicts nothing); from which layer the logit lens ranks the answer
    first (only where there is a lens). chosen: the page's own ablation of one head (its result, cached)."""
    effects = np.asarray(study.importance.effects[stack], dtype=np.float64)
    n_layers, n_heads = effects.shape
    of = "" if len(study.importance.effects) == 1 else f"{stack} "
    questions = [
        Question("head", f"Which {of}head, removed, changes {study.what} most?",
                 choices=[_head_label(i, j) for i in range(n_layers) for j in range(n_heads)],
                 answer=int(np.argmax(np.abs(effects))), grid=(n_layers, n_heads), page=page, action="ablate",
                 stack=stack),
    ]  # fmt: skip
    if chosen is not None and study.output is not None and chosen.prediction:
        top = study.trace.predictions(10)
        questions.append(output_question(top, str(chosen.head), chosen.prediction, page))
    if study.lens is not None:
        questions.append(lens_question(study.lens, page))
    return questions


def output_question(
    top: Sequence[tuple[str, float]], removed: str, after: Sequence[tuple[str, float]], page: str
) -> Question:
    """ "What will the model predict with `removed` removed?": the choices are its top outputs now (`top`, raw
    labels: up to 10), the model's answer the top output with the head ablated (`after`, as
    `head_matters.ablation` gives it: display labels), added as a choice if it was not among them."""
    from tformer_views.head_matters import display_token

    labels = [display_token(label) for label, _ in top[:10]]
    first = after[0][0]
    choices = labels if first in labels else [*labels, first]
    now = (labels[0], float(top[0][1]))
    shown = ", ".join(f"{label} ({p:.3f})" for label, p in after[:5])
    return Question("output", f"What will the model predict with {removed} removed? (Now: {now[0]}, "
                    f"p = {now[1]:.3f})", choices=choices, answer=choices.index(first), page=page,
                    effect={"lines": [f"With {removed} removed the model predicts: {shown}"]})  # fmt: skip


def lens_question(lens: Any, page: str) -> Question:
    """ "From which layer on does the logit lens rank the answer first?" (tformer_core.lens.LogitLens): the answer
    is the earliest layer from which the followed output stays first up to the end."""
    from tformer_views.head_matters import display_token

    rank = np.asarray(lens.rank)
    first = len(rank) - 1
    while first > 0 and rank[first - 1] == 0:
        first -= 1
    names = ["the embedding" if name == "embed" else f"layer {name}" for name in lens.layers]
    target = display_token(lens.target_label)
    ranks = ", ".join(f"{name.removeprefix('layer ')}: {int(r) + 1}" for name, r in zip(names, rank))
    return Question("layer", f"From which layer on does the logit lens rank {_quoted(target)} first?",
                    choices=names, answer=first, page=page,
                    effect={"lines": [f"The lens ranks {target} first from {names[first]} on.",
                                      f"Its rank after each: {ranks}"[:600]],
                            "ranks": [int(r) + 1 for r in rank]})  # fmt: skip


def view_questions(
    top: Sequence[tuple[str, float]],
    head: str,
    ablate: Callable[[], Ablation],
    lens: Callable[[], Any] | None,
    page: str,
) -> list[Deferred]:
    """The predict-then-intervene questions a view of one head can ask (Text attention's language model, a ViT's
    class): what the model predicts with the view's `head` removed (`ablate()`: that one ablation), and where
    there is a lens (`lens()`), from which layer it ranks the answer first. Made when asked: the page draws no
    pass for them. top: the model's top outputs now (raw labels)."""
    from tformer_views.head_matters import display_token

    now = (display_token(top[0][0]), float(top[0][1]))
    offered = [
        Deferred("output", f"What will the model predict with {head} removed? (Now: {now[0]}, p = {now[1]:.3f})",
                 lambda: output_question(top, head, ablate().prediction, page)),
    ]  # fmt: skip
    if lens is not None:
        where = f"From which layer on does the logit lens rank {_quoted(now[0])} first?"
        offered.append(Deferred("layer", where, lambda: lens_question(lens(), page)))
    return offered


def most_chosen(counts: Sequence[int]) -> int | None:
    """The choice the class chose most (the first of a tie), or None when nobody answered."""
    return int(np.argmax(counts)) if counts and max(counts) > 0 else None


def decimals(change: float) -> int:
    """Decimals that show a change's first two digits: 4, up to 8 for the tiny changes of a saturated prediction
    (p = 0.99999 moved by 4e-5 would read 1 → 1), as the /heads page's metric shows them."""
    if change == 0 or not math.isfinite(change) or abs(change) >= 1e-3:
        return 4
    return min(8, 1 - math.floor(math.log10(abs(change))))


def ablation_effect(
    q: Question,
    counts: Sequence[int],
    clean: float,
    ablate: Callable[[int, int], Ablation],
    grid: np.ndarray | None = None,
) -> dict:
    """What a head question's reveal shows: the head the class chose most ablated beside the model's answer
    ablated (one intervention each for the whole class; `ablate(layer, head)` runs or reads it, cached). clean:
    the number without ablation; grid: every head's drop [layers, heads] (the page's study), drawn beside the
    class's votes. JSON for the store: the number measured with each head removed, its change, the top output
    then, and the grid (6 significant digits)."""
    if q.grid is None or q.answer is None:
        raise ValueError("a head question with a grid and the model's answer")
    heads = q.grid[1]
    effect: dict[str, Any] = {"clean": float(clean)}
    lines = []
    for who, index in (("class", most_chosen(counts)), ("model", int(q.answer))):
        if index is None:
            lines.append("Nobody answered: no head of the class's to remove.")
            continue
        result = ablate(index // heads, index % heads)
        value = float(result.value)
        top = result.prediction[0][0] if result.prediction else ""
        effect[who] = {"choice": index, "value": value, "change": value - clean, "top": top}
        votes = f" ({counts[index]} of {sum(counts)} votes)" if who == "class" else ""
        name = "The class's choice" if who == "class" else "The model's answer"
        shown = f"; the top output: {top}" if top and top != "cosine similarity" else ""
        d = decimals(value - clean)
        lines.append(f"{name}, {q.choices[index]}{votes}, removed: {clean:.{d}f} → {value:.{d}f} "
                     f"({value - clean:+.{d}f}){shown}")  # fmt: skip
    effect["lines"] = lines
    if grid is not None:
        effect["grid"] = [[float(f"{v:.6g}") for v in row] for row in np.asarray(grid, dtype=np.float64)]
    return effect


def effect_chart(q: Question, scale: float = 1.0) -> dict | None:
    """The model's side of a revealed question, to draw beside the class's votes: the real ablation grid (every
    head's drop, the model's head outlined as in the votes) or the lens's rank of the answer after each layer;
    None for a question without one."""
    from tformer_views.charts.spec import heatmap

    font = {"labelFontSize": round(13 * scale), "titleFontSize": round(13 * scale)}
    if "grid" in q.effect and q.grid is not None:
        values = np.asarray(q.effect["grid"], dtype=np.float64)
        layers, heads = values.shape
        # At least ± a hundredth, as the /heads page's grid: a saturated answer (p = 0.99999) that no head moves by
        # 1e-4 must not glow dark red over nothing, nor print 0.00 in every cell.
        span = max(float(np.nanmax(np.abs(values))), 0.01)
        cell = max(8, min(round(36 * scale), 640 // max(heads, 1)))
        return heatmap(values, [f"L{i}" for i in range(layers)], [f"H{j}" for j in range(heads)],
                       ["The model: the drop with each head removed"], row_title="layer", col_title="head",
                       diverging=True, domain=(-span, span), cell_size=cell,
                       annotate=None if float(np.nanmax(np.abs(values))) >= 0.005 else False)  # fmt: skip
    if "ranks" in q.effect:
        frame = pd.DataFrame({"after": q.choices, "rank": q.effect["ranks"]})
        return {
            "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
            "title": "The model: the answer's rank after each layer (1 = first)",
            "data": {"name": "ranks"},
            "datasets": {"ranks": frame},
            "width": min(1100, max(240, round(40 * scale) * len(frame))),
            "height": round(220 * scale),
            "mark": {"type": "bar", "color": "#0066ff"},
            "encoding": {
                "x": {"field": "after", "type": "nominal", "sort": None, "title": None,
                      "axis": {**font, "labelAngle": -40}},
                "y": {"field": "rank", "type": "quantitative", "scale": {"type": "log"}, "title": "rank",
                      "axis": font},
                "tooltip": [{"field": "after"}, {"field": "rank"}],
            },
        }  # fmt: skip
    return None


def vote_shift(q: Question, first: dict[str, float | int], second: dict[str, float | int]) -> dict[str, int]:
    """Peer instruction's count: of the students who voted twice, how many were right in each vote and how many
    moved from a wrong first vote to the model's answer ("moved"), or away from it ("left")."""
    both = [s for s in second if s in first]
    if q.answer is None or q.kind == "number":
        return {"both": len(both), "first_right": 0, "second_right": 0, "moved": 0, "left": 0}
    model = int(q.answer)

    def right(value: float | int) -> bool:
        return int(value) == model

    return {
        "both": len(both),
        "first_right": sum(right(v) for v in first.values()),
        "second_right": sum(right(v) for v in second.values()),
        "moved": sum(not right(first[s]) and right(second[s]) for s in both),
        "left": sum(right(first[s]) and not right(second[s]) for s in both),
    }


def answer_chart(
    q: Question, counts: Sequence[int], revealed: bool, scale: float = 1.0, title: str = "Class answers"
) -> dict:
    """The class's answers for the projector, a Vega-Lite spec titled "Class answers": bars over the tokens in
    their order (token, number), or a heat over the patch grid or the layers x heads (patch, head); the model's
    answer outlined (a number: its bin in blue) once revealed. counts: per choice, or per bin of a number."""
    font = {"labelFontSize": round(13 * scale), "titleFontSize": round(13 * scale)}
    answer = q.answer if revealed else None
    if q.kind in ("patch", "head") and q.grid:
        return _grid_chart(q, counts, answer, scale, font, title)
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
        "title": title,
        "data": {"name": "answers"},
        "datasets": {"answers": pd.DataFrame(values)},
        "width": min(1100, max(240, round(40 * scale) * len(values))),
        "height": round(220 * scale),
        "layer": [bars, text, model],
    }


def _grid_chart(
    q: Question, counts: Sequence[int], answer: float | int | None, scale: float, font: dict, title: str
) -> dict:
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
        "title": title,
        "data": {"name": "answers"},
        "datasets": {"answers": pd.DataFrame(values)},
        # Cells of `cell` pixels: a layered chart given a width and height is fitted into them with its axes, and
        # drawn in a wide column it came out a few pixels high.
        "width": {"step": cell},
        "height": {"step": cell},
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "title": x, "axis": font, "scale": {"paddingInner": 0}},
            "y": {"field": "row", "type": "ordinal", "title": y, "axis": font, "scale": {"paddingInner": 0}},
        },
        "layer": layers,
        "config": {"legend": font},
    }


def patch_answer_picker(q: Question, width: int = 300, tallest: int = 600) -> dict:
    """A patch or head question's answer, clicked: the grid of patches (rows x cols) or of heads (layers x
    heads) as a Vega-Lite spec with the selection parameter "patch" (field "patch": the row-major index of the
    choice), as `charts.pickers.patch_picker`. Its cells fit `width` pixels (a phone's 390 px, less the page's
    margins and the axis) and at most `tallest` high; a patch question's picture lies under its grid."""
    rows, cols = q.grid or (1, len(q.choices))
    cell = max(10, min(28, width // max(cols, 1), tallest // max(rows, 1)))
    r, c = np.divmod(np.arange(rows * cols), cols)
    cells = pd.DataFrame({"patch": np.arange(rows * cols), "row": r, "col": c, "label": q.choices[: rows * cols]})
    picture = bool(q.picture) and q.kind == "patch"
    # Over a picture the cells are clear but for their outline and the one under the pointer.
    rest = {"value": "#ffffff", "opacity": 0.0} if picture else {"value": "#e8e8e8"}
    hover = {"condition": {"param": "hover", "empty": False, "value": "#f28e2b"}, "value": rest["value"]}
    opacity = {"condition": {"param": "hover", "empty": False, "value": 0.6}, "value": rest.get("opacity", 1.0)}
    y, x = ("layer", "head") if q.kind == "head" else ("row", "column")
    labels = {"labelExpr": "'L' + datum.value"} if q.kind == "head" else {}
    grid = {
        "mark": {"type": "rect", "stroke": "#fff", "strokeWidth": 1, "cursor": "pointer"},
        "encoding": {
            "x": {"field": "col", "type": "ordinal", "title": x, "scale": {"paddingInner": 0, "paddingOuter": 0}},
            "y": {
                "field": "row",
                "type": "ordinal",
                "title": y,
                "axis": labels,
                "scale": {"paddingInner": 0, "paddingOuter": 0},
            },
            "fill": hover,
            "fillOpacity": opacity,
            "tooltip": [{"field": "label", "title": q.kind}],
        },
        "params": [
            {"name": "patch", "select": {"type": "point", "fields": ["patch"], "on": "click"}},
            {
                "name": "hover",
                "select": {"type": "point", "fields": ["patch"], "on": "pointerover", "clear": "pointerout"},
            },
        ],
    }
    layers = [grid]
    if picture:
        layers.insert(0, {
            "data": {"values": [{"url": q.picture}]},
            "mark": {"type": "image", "width": cell * cols, "height": cell * rows, "aspect": False},
            "encoding": {"url": {"field": "url", "type": "nominal"}, "x": {"value": cell * cols / 2},
                         "y": {"value": cell * rows / 2}},
        })  # fmt: skip
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "title": "Click a patch" if q.kind == "patch" else "Click a head",
        "data": {"name": "cells"},  # the grid's; the picture's layer has its own
        "datasets": {"cells": cells},
        # Cells of `cell` pixels, whatever the container: a layered chart given a width and height is fitted into
        # them with its axes (the grid came out a few pixels high).
        "width": {"step": cell},
        "height": {"step": cell},
        "layer": layers,
    }
