"""Induction heads on a language model: what the "Does this head matter?" page shows of them.

    found = study(model, length=24, seed=0)         # a repeated random sequence, traced once
    found.scores                                    # [layers, heads] induction scores
    found.first, found.second                       # the loss (nats) on the first repeat and on the second
    test = ablation(model, 24, 0, found.top(5))     # the top 5 ablated together, and 5 random heads (8 draws)
    test.second                                     # [rows] the second repeat's loss: clean, top, each draw

The numbers are the core's (tformer_core.induction); here they are put together for a page: the heads ranked,
the random baseline drawn (the same seed, so a link shows the same draws), the losses per position as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tformer_core import induction as ind
from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.interventions import Head
from tformer_core.models.base import TracedModel
from tformer_core.models.decoder import Decoder

from .tokens import display_token

__all__ = ["DRAWS", "InductionAblation", "InductionStudy", "ablation", "loss_table", "study"]

DRAWS = 8  # random sets of k heads (the baseline's spread shows beside its mean); 24-token repeats: one pass


def _decoder(model: TracedModel) -> Decoder:
    if not isinstance(model, Decoder):
        raise InputError("induction heads are looked for in a language model run by tformer (decoder-only)")
    return model


@dataclass(frozen=True, eq=False)
class InductionStudy:
    """A repeated random sequence through a language model. seq: the tokens (tformer_core.induction); tokens:
    their labels as shown; scores [layers, heads]: each head's induction score; losses [T - 1]: each next
    token's cross-entropy (nats); first, second: the mean loss on the first and on the second repeat;
    pattern [T, T]: the attention weights of the head of highest score (its stripe: one diagonal, length - 1 left
    of the main one)."""

    seq: ind.RepeatedTokens
    tokens: tuple[str, ...]
    scores: np.ndarray
    losses: np.ndarray
    first: float
    second: float
    pattern: np.ndarray

    def top(self, k: int) -> list[Head]:
        """The k heads of highest induction score, the highest first."""
        order = np.argsort(-self.scores, axis=None, kind="stable")[:k]
        heads = self.scores.shape[1]
        return [Head("decoder", int(i) // heads, int(i) % heads) for i in order]


def study(model: TracedModel, length: int, seed: int) -> InductionStudy:
    """`length` random tokens (seeded) twice; one traced pass keeping the attention weights and the logits."""
    decoder = _decoder(model)
    try:
        seq = ind.repeated_tokens(decoder, length, seed)
    except ValueError as error:
        raise InputError(str(error)) from error
    trace = decoder.trace(list(seq.ids), keep=matching("decoder.*.attn.weights", "head.logits"))
    scores = ind.induction_scores(trace.all_attention("decoder"), seq)
    losses = ind.token_losses(np.asarray(trace["head.logits"]), seq.ids)
    first, second = (float(ind.repeat_loss(losses, seq, r)) for r in (0, 1))
    best = np.unravel_index(int(np.argmax(scores)), scores.shape)
    pattern = np.asarray(trace.attention(int(best[0]), int(best[1]), "decoder"), dtype=np.float32)
    tokens = tuple(display_token(t) for t in trace.tokens)
    return InductionStudy(seq, tokens, scores, losses, first, second, pattern)


@dataclass(frozen=True, eq=False)
class InductionAblation:
    """Heads ablated (zero) on the study's sequence. top: the k heads of highest score; draws: DRAWS sets of k
    heads drawn at random from the others; losses [2 + DRAWS, T - 1]: clean, top ablated, each draw ablated;
    first, second [2 + DRAWS]: each row's loss on the first and on the second repeat."""

    seq: ind.RepeatedTokens
    top: tuple[Head, ...]
    draws: tuple[tuple[Head, ...], ...]
    losses: np.ndarray
    first: np.ndarray
    second: np.ndarray

    @property
    def random_second(self) -> float:
        """The second repeat's loss with k random heads ablated, the mean over the draws."""
        return float(self.second[2:].mean())


def ablation(model: TracedModel, length: int, seed: int, top: list[Head] | tuple[Head, ...]) -> InductionAblation:
    """The heads `top` ablated together on the sequence of `study(model, length, seed)`, and as a baseline
    DRAWS sets of as many heads drawn (with `seed`) from the other heads; one batched pass per ROW_TOKENS."""
    decoder = _decoder(model)
    seq = ind.repeated_tokens(decoder, length, seed)
    c = decoder.config
    others = [Head("decoder", layer, h) for layer in range(c.n_layers) for h in range(c.n_heads)]
    others = [h for h in others if h not in set(top)]
    rng = np.random.default_rng([seed, len(top)])
    picks = [sorted(rng.choice(len(others), len(top), replace=False)) for _ in range(DRAWS)]
    draws = tuple(tuple(others[i] for i in pick) for pick in picks)
    losses = ind.ablated_losses(decoder, seq, [[], list(top), *draws])
    first, second = (ind.repeat_loss(losses, seq, r) for r in (0, 1))
    return InductionAblation(seq, tuple(top), draws, losses, first, second)


def loss_table(found: InductionStudy, ablated: InductionAblation) -> pd.DataFrame:
    """Each predicted token's loss (nats), by position: clean, the top heads ablated, random heads ablated (the
    mean over the draws); `counted in`: the repeat whose loss the token counts in ("-": a repeat's first token,
    which no repeat counts)."""
    seq = found.seq
    repeat = ["-"] * (len(seq.ids) - 1)
    for r in range(seq.repeats):
        for p in list(seq.positions(r))[1:]:
            repeat[p - 1] = f"repeat {r + 1}"
    k = len(ablated.top)
    return pd.DataFrame(
        {
            "position": np.arange(1, len(seq.ids)),
            "token": list(found.tokens[1:]),
            "counted in": repeat,
            "clean": ablated.losses[0],
            f"top {k} ablated": ablated.losses[1],
            f"{k} random ablated (mean)": ablated.losses[2:].mean(axis=0),
        }
    )
