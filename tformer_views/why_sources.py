"""Why this weight, from its sources: one cell's softmax input split into (query-side, key-side) sources
(tformer_core.score_sources), ranked as tables a page shows, and a source removed in a real pass.

    s = cell_sources(model, ("The animal didn't cross the street because it was too tired.",), (), cell)
    ranked_sources(s, "query")    # source, what it is, what it adds to the score, its share
    ranked_pairs(s)               # the largest (query source, key source) terms
    cell_removal(model, inputs, (), cell, "L2.H7")   # the weight without it: linear prediction and real pass

A share is a term divided by the sum of the absolute values of its family's terms (the query sources' row sums, the
key sources' column sums, or every pair): signed, and the shares' absolute values sum to 1, even where large
terms cancel and the score itself is near 0.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import CausalLM, EncoderDecoderModel, EncoderModel, VisionModel
from tformer_core.score_sources import SOURCES_KEPT, Cell, Removal, ScoreSources, remove_source, score_sources
from tformer_core.trace import Trace

from .tokens import display_token

__all__ = [
    "SIDES",
    "cell_removal",
    "cell_sources",
    "describe",
    "ranked_pairs",
    "ranked_sources",
    "shares",
    "traced_for_split",
]

SIDES = ("query", "key")
Options = tuple[tuple[str, Any], ...]  # keyword arguments of model.trace, as hashable pairs (("pair", "..."),)
_HEAD = re.compile(r"^L(\d+)\.(cross\.)?H(\d+)$")
_NAMED = {
    "embed.tok": "token embedding",
    "embed.patch": "patch embedding (class token)",
    "embed.pos": "position embedding",
    "embed.segment": "segment embedding",
    "embed.ln.beta": "embedding LayerNorm's β",
    "ln_final.beta": "final norm's β",
}


def describe(name: str) -> str:
    """A source's name in words: "L3.H5" -> "layer 3, head 5"; "enc.L1.mlp" -> "encoder: layer 1's FFN"."""
    stack, _, rest = name.partition(".") if name.startswith(("enc.", "dec.")) else ("", "", name)
    where = {"enc": "encoder: ", "dec": "decoder: "}.get(stack, "")
    if rest in _NAMED:
        return where + _NAMED[rest]
    head = _HEAD.match(rest)
    if head:
        layer, cross, h = head.groups()
        return f"{where}layer {layer}, {'cross-attention ' if cross else ''}head {h}"
    layer, _, part = rest.partition(".")
    words = {
        "mlp": "FFN (its bias included)",
        "attn.b_O": "attention output bias b_O",
        "cross.b_O": "cross-attention output bias b_O",
        "ln_attn.beta": "attention LayerNorm's β",
        "ln_cross.beta": "cross-attention LayerNorm's β",
        "ln_mlp.beta": "FFN LayerNorm's β",
        "b_Q": "query bias b_Q (this head)",
        "b_K": "key bias b_K (this head)",
        "cross.b_Q": "cross-attention query bias b_Q (this head)",
        "cross.b_K": "cross-attention key bias b_K (this head)",
    }
    return f"{where}layer {layer[1:]}'s {words.get(part, part)}" if layer.startswith("L") else where + rest


def shares(values: np.ndarray) -> np.ndarray:
    """values / sum(|values|): signed shares whose absolute values sum to 1 (zeros when every value is 0)."""
    mass = float(np.abs(values).sum())
    return np.zeros_like(values) if mass == 0 else values / mass


def traced_for_split(model: TracedModel, inputs: tuple, options: Options = ()) -> Trace:
    """One pass of `model` over `inputs` (what its trace takes; options: its keywords) keeping what the split
    reads (SOURCES_KEPT). InputError for a kind whose scores the split does not read (before Transformers, MAE,
    DETR)."""
    if not isinstance(model, (EncoderModel, CausalLM, EncoderDecoderModel, VisionModel)):
        raise InputError(f"a {model.kind} model's attention scores are not split into sources here")
    keywords: dict[str, Any] = {**dict(options), "keep": SOURCES_KEPT}
    return model.trace(*inputs, **keywords)


def cell_sources(model: TracedModel, inputs: tuple, options: Options, cell: Cell) -> ScoreSources:
    """`cell` of the pass over `inputs` (what model.trace takes; options: its keywords) split into sources: one
    traced pass keeping what the split reads (SOURCES_KEPT), then `score_sources`."""
    return score_sources(model, traced_for_split(model, inputs, options), cell)


def cell_removal(model: TracedModel, inputs: tuple, options: Options, cell: Cell, name: str) -> Removal:
    """Source `name` of `cell` removed: the linear prediction and a real forward pass without it (two passes:
    the split's and the edited one)."""
    return remove_source(model, cell_sources(model, inputs, options, cell), name, *inputs, **dict(options))


def ranked_sources(s: ScoreSources, side: str, n: int = 8) -> pd.DataFrame:
    """The `n` sources of `side` ("query" or "key") adding the most to the score in absolute value: source,
    what it adds (its row or column of the table summed, in softmax-input units), its share, what it is."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    names, totals = (s.query_sources, s.query_totals) if side == "query" else (s.key_sources, s.key_totals)
    share = shares(totals)
    order = np.argsort(-np.abs(totals), kind="stable")[:n]
    return pd.DataFrame(
        {
            "source": [names[i] for i in order],
            "adds": totals[order],
            "share": share[order],
            "what": [describe(names[i]) for i in order],  # last: at 1280 px two tables side by side cut the last
        }
    ).rename_axis(f"{side} side")


def ranked_pairs(s: ScoreSources, n: int = 10) -> pd.DataFrame:
    """The `n` largest terms of the table in absolute value: query source, key source, the term, its share of all
    the terms' absolute sum."""
    flat = s.table.ravel()
    order = np.argsort(-np.abs(flat), kind="stable")[:n]
    share = shares(flat)
    n_k = s.table.shape[1]
    return pd.DataFrame(
        {
            f"query source ({display_token(s.query_label)})": [s.query_sources[i // n_k] for i in order],
            f"key source ({display_token(s.key_label)})": [s.key_sources[i % n_k] for i in order],
            "adds": flat[order],
            "share": share[order],
        }
    ).rename_axis("pairs")
