"""Greedy autoregressive decoding with a trace of every step.

Each step runs the decoder over the whole prefix (no key/value cache) under capture, so step t's
trace holds exactly what the model computed when it chose token t: the masked self-attention of
the prefix and, for encoder-decoder models, the new token's cross-attention over the source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .trace import Trace


@dataclass(frozen=True)
class GenerationSettings:
    """How a checkpoint generates, read from its config: start, stop and forbidden tokens.

    start_id: the decoder's first input (encoder-decoder) or None (decoder-only: the prompt starts).
    forced_bos_id: a token forced as the first generated one (mBART's language code), or None.
    forced_eos: BART forces EOS as the last token when the length limit is reached.
    suppress_ids: tokens never generated (Marian never emits its padding token).
    """

    eos_id: int | None = None
    start_id: int | None = None
    pad_id: int | None = None
    suppress_ids: tuple[int, ...] = ()
    forced_bos_id: int | None = None
    forced_eos: bool = False
    max_new_tokens: int = 64


@dataclass(frozen=True, eq=False)
class Generation:
    """The result of greedy decoding.

    ids / tokens: the decoder sequence, including the start token (encoder-decoder) or the prompt
    (decoder-only), and every generated token. n_prompt: how many of them were given, not generated.
    steps[t]: the trace of the pass that chose generated token t (its logits are the last row).
    trace: one teacher-forced pass over the final sequence (with the encoder, for seq2seq); by the
    causal mask, its row n_prompt - 1 + t equals step t's last row.
    finished: True when EOS was generated, False when the length limit stopped it.
    """

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    n_prompt: int
    steps: tuple[Trace, ...]
    trace: Trace
    finished: bool

    @property
    def generated_ids(self) -> tuple[int, ...]:
        return self.ids[self.n_prompt :]

    @property
    def generated_tokens(self) -> tuple[str, ...]:
        return self.tokens[self.n_prompt :]


def choose_next(logits: torch.Tensor, settings: GenerationSettings, step: int, is_last_allowed: bool) -> torch.Tensor:
    """Greedy choice for each row of logits [B, vocab] at generation step `step` (0 = first new token),
    honouring the checkpoint's generation rules; returns the chosen ids [B] (long).

    The one decoding rule of the project: traced generation (one sequence, a trace per step) and the
    bundled models' batched evaluation both call it.
    """
    batch = logits.shape[0]
    if step == 0 and settings.forced_bos_id is not None:
        return torch.full((batch,), settings.forced_bos_id, dtype=torch.long, device=logits.device)
    if settings.forced_eos and is_last_allowed and settings.eos_id is not None:
        return torch.full((batch,), settings.eos_id, dtype=torch.long, device=logits.device)
    if settings.suppress_ids:
        logits = logits.clone()
        logits[:, list(settings.suppress_ids)] = -torch.inf
    return logits.argmax(dim=-1)


def traced_steps(
    trace_step: Callable[[list[int]], Trace], sequence: list[int], settings: GenerationSettings, budget: int
) -> tuple[list[int], tuple[Trace, ...], bool]:
    """Greedy decoding with a trace per step: trace_step(ids so far) traces one pass whose last row of
    head.logits scores the next token. Returns (the sequence with the new tokens, the step traces,
    whether the end token was produced). At most `budget` new tokens.
    """
    sequence, steps = list(sequence), []
    for t in range(budget):
        step = trace_step(sequence)
        last = torch.from_numpy(np.array(step["head.logits"][-1:]))  # [1, vocab]
        next_id = int(choose_next(last, settings, t, is_last_allowed=t == budget - 1)[0])
        steps.append(step)
        sequence.append(next_id)
        if next_id == settings.eos_id:
            return sequence, tuple(steps), True
    return sequence, tuple(steps), False
