"""The "Why here?" lesson: the lecture's sentence, "it" -> "animal", walked through its sources with the core's numbers.

    lesson = why_here(tc.load_model("minilm"))
    for title, text in lesson.steps: ...      # Markdown, every number from tformer_core.score_sources
    lesson.sources                            # the split itself (ranked by tformer_views.why_sources)

The head is found as Text attention finds the lecture's head (tformer_app.lecture): of every layer and head, the one
whose "it" weighs "animal" most. Its softmax input is split into query-side x key-side sources; the largest ones
are named, and the largest query-side source is removed in a real pass beside the linear prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.score_sources import Cell, Removal, ScoreSources, remove_source, score_sources
from tformer_core.trace import Trace

from ..search import default_key, ranked_heads
from ..tokens import display_token
from ..why_sources import describe, ranked_pairs, ranked_sources, traced_for_split

__all__ = ["LECTURE_SENTENCE", "WhyHere", "lecture_cell", "why_here"]

LECTURE_SENTENCE = "The animal didn't cross the street because it was too tired."


@dataclass(frozen=True, eq=False)
class WhyHere:
    """The lesson: its cell, the split, the top source removed, and its steps as (title, Markdown)."""

    sentence: str
    cell: Cell
    n_heads_searched: int
    sources: ScoreSources
    removal: Removal
    steps: tuple[tuple[str, str], ...]


def lecture_cell(trace: Trace) -> Cell:
    """The cell ("it", its lecture noun) of the head, of every layer and head, giving that noun the most weight."""
    words = [display_token(t).strip().lower() for t in trace.tokens]
    if "it" not in words:
        raise InputError("the lesson's sentence needs the word 'it'")
    query = words.index("it")
    key = default_key(trace.tokens, query, -1)
    if key < 0:
        raise InputError("the lesson's sentence needs a noun 'it' may refer to (animal, trophy, ...)")
    rows = trace.all_attention()[:, :, query, key]  # [layers, heads]
    layer, head, _ = ranked_heads(rows, 1)[0]
    return Cell(trace.main_stack, layer, head, query, key)


def _listed(frame, n: int = 3) -> str:
    return "; ".join(
        f"**{row.source}** ({describe(row.source)}) {row.adds:+.3f} ({row.share:+.0%})"
        for row in frame.head(n).itertuples()
    )


def _steps(s: ScoreSources, removed: Removal, n: int, top: str) -> tuple[tuple[str, str], ...]:
    cell = s.cell
    q, k = display_token(s.query_label), display_token(s.key_label)
    pairs = ranked_pairs(s, 3)
    pair_text = "; ".join(
        f"**{a}** × **{b}** {adds:+.3f}" for a, b, adds in zip(pairs.iloc[:, 0], pairs.iloc[:, 1], pairs["adds"])
    )
    return (
        ("The head", f"In layer {cell.layer}, head {cell.head}, “{q}” gives “{k}” {s.weight:.3f} of its attention: "
         f"more than any other of the {n} heads."),
        ("The score", f"That weight is the softmax of the row's scores; “{k}”'s is q·k/√d_k = **{s.score:.4f}**, "
         f"{s.score - float(np.max(np.delete(s.row_scores_without(), cell.key))):+.3f} above the next key's."),
        ("Split into sources", f"q is a sum of {len(s.query_sources)} parts, k of {len(s.key_sources)} (embeddings, "
         f"every earlier head and FFN, every bias and norm β, each norm's divisor frozen): the "
         f"{len(s.query_sources) * len(s.key_sources)} pairs sum to {s.total:.4f} (difference {s.error:.1e})."),
        ("The query side", f"What “{q}” brings: {_listed(ranked_sources(s, 'query'))}."),
        ("The key side", f"What makes “{k}” findable: {_listed(ranked_sources(s, 'key'))}."),
        ("The pairs", f"The largest terms: {pair_text}."),
        ("Remove the largest", f"Without **{top}** ({describe(top)}) the linear prediction is "
         f"{removed.linear_weight:.3f}; a real pass without it gives {removed.real_weight:.3f} "
         f"(from {removed.weight:.3f}): later layers and norms move too."),
    )  # fmt: skip


def why_here(model: TracedModel, sentence: str = LECTURE_SENTENCE) -> WhyHere:
    """The lesson for `model` (MiniLM, the lecture's) on `sentence`: one traced pass, the split, one real pass
    with the largest query-side source removed."""
    trace = traced_for_split(model, (sentence,))
    cell = lecture_cell(trace)
    s = score_sources(model, trace, cell)
    top = str(ranked_sources(s, "query", 1)["source"].iloc[0])
    removed = remove_source(model, s, top, sentence)
    n = trace.n_layers * trace.n_heads
    return WhyHere(sentence, cell, n, s, removed, _steps(s, removed, n, top))
