"""Autoregressive decoding with a trace of every step: greedy, or sampled with a temperature and a top-k.

Each step is one traced pass whose last row of logits scores the next token. Decoder-only models keep a
key/value cache (`layers.KVCache`): the first pass runs the prompt (its trace is the prompt's own, every
position), each later pass runs the one new token against the cached keys and values, so its trace holds
that token's attention row in every layer and head. Encoder-decoder models and `use_cache=False` rerun
the whole prefix at each step, so step t's trace holds the masked self-attention of the whole prefix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .errors import InputError
from .trace import Trace, to_host, top_k_tokens

__all__ = [
    "Decoded",
    "Generation",
    "GenerationSettings",
    "Sampling",
    "choose_next",
    "decode_steps",
    "next_token_probabilities",
    "next_token_table",
    "traced_steps",
]


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


@dataclass(frozen=True)
class Sampling:
    """Drawing the next token at random instead of taking the most probable one.

    temperature: the logits are divided by it before the softmax (below 1 sharper, above 1 flatter);
        0 means greedy (the most probable token, no randomness).
    top_k: only the k most probable tokens can be drawn (their probabilities renormalised); None: any token.
    seed: the random generator's seed: the same seed, prompt and model give the same tokens.
    """

    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise InputError(f"temperature must be a number >= 0 (0 = greedy), got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InputError(f"top_k must be a whole number >= 1 or None (every token), got {k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InputError(f"seed must be a whole number, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True, eq=False)
class Generation:
    """The result of decoding.

    ids / tokens: the decoder sequence, including the start token (encoder-decoder) or the prompt
    (decoder-only), and every generated token. n_prompt: how many of them were given, not generated.
    steps[t]: the trace of the pass that chose generated token t (its logits' last row scored it). With a
    key/value cache (decoder-only models, by default), steps[0] is the prompt's own pass (attention
    [heads, n_prompt, n_prompt], next-token logits after every prompt position) and steps[t > 0] the pass
    of token n_prompt + t - 1 alone: attention [heads, 1, n_prompt + t] in every layer, K and V of every
    position so far, `meta.query_start` = its position. Without a cache, every step runs the whole prefix.
    trace: one teacher-forced pass over the final sequence (with the encoder, for seq2seq); by the
    causal mask, its row n_prompt - 1 + t equals step t's last row.
    finished: True when EOS was generated, False when the length limit stopped it.
    probabilities[t]: the probability generated token t had in the distribution it was chosen from
    (the softmax of the logits; with sampling, after the temperature and the top-k).
    sampling: how tokens were chosen (None: greedy).
    """

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    n_prompt: int
    steps: tuple[Trace, ...]
    trace: Trace | None  # None when the caller asked for no final pass (Decoder.generate(final_trace=False))
    finished: bool
    probabilities: tuple[float, ...] = ()
    sampling: Sampling | None = None

    @property
    def generated_ids(self) -> tuple[int, ...]:
        return self.ids[self.n_prompt :]

    @property
    def generated_tokens(self) -> tuple[str, ...]:
        return self.tokens[self.n_prompt :]


def next_token_probabilities(logits: torch.Tensor, sampling: Sampling | None = None) -> torch.Tensor:
    """The distribution the next token is drawn from: logits [B, vocab] -> probabilities [B, vocab], float32.

    Greedy (None, or temperature 0): the model's softmax (the most probable token is taken from it).
    Sampling: softmax(logits / temperature), tokens outside the top-k set to 0 (ties with the k-th kept, as
    transformers keeps them) and the rest renormalised.
    """
    logits = logits.float()
    if sampling is None or sampling.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _suppressed(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """The logits with the tokens a checkpoint never generates at -inf."""
    if not settings.suppress_ids:
        return logits
    logits = logits.clone()
    logits[:, list(settings.suppress_ids)] = -torch.inf
    return logits


def _forced(logits: torch.Tensor, settings: GenerationSettings, step: int, is_last_allowed: bool) -> int | None:
    if step == 0 and settings.forced_bos_id is not None:
        return settings.forced_bos_id
    if settings.forced_eos and is_last_allowed and settings.eos_id is not None:
        return settings.eos_id
    return None


def choose_next(
    logits: torch.Tensor,
    settings: GenerationSettings,
    step: int,
    is_last_allowed: bool,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The choice for each row of logits [B, vocab] at generation step `step` (0 = first new token),
    honouring the checkpoint's generation rules; returns the chosen ids [B] (long).

    Greedy unless `sampling` is given (then drawn with `generator`, on the logits' device). The one
    decoding rule of the project: traced generation (one sequence, a trace per step) and the bundled
    models' batched evaluation both call it.
    """
    forced = _forced(logits, settings, step, is_last_allowed)
    if forced is not None:
        return torch.full((logits.shape[0],), forced, dtype=torch.long, device=logits.device)
    logits = _suppressed(logits, settings)
    if sampling is None or sampling.greedy:
        return logits.argmax(dim=-1)
    probabilities = next_token_probabilities(logits, sampling)
    return torch.multinomial(probabilities, 1, generator=generator)[:, 0]


@dataclass(frozen=True)
class Decoded:
    """What `decode_steps` returns: the sequence with the new tokens, a trace per step, each new token's
    probability in the distribution it was chosen from, and whether the end token was produced."""

    sequence: list[int]
    steps: tuple[Trace, ...]
    probabilities: tuple[float, ...]
    finished: bool


def decode_steps(
    trace_step: Callable[[list[int]], Trace],
    sequence: list[int],
    settings: GenerationSettings,
    budget: int,
    sampling: Sampling | None = None,
) -> Decoded:
    """Decoding with a trace per step: trace_step(ids so far) traces one pass whose last row of head.logits
    scores the next token. At most `budget` new tokens; stops after the end token.
    """
    generator = torch.Generator().manual_seed(sampling.seed) if sampling is not None else None
    sequence, steps, chosen = list(sequence), [], []
    for t in range(budget):
        step = trace_step(sequence)
        # The last row's float32 logits, on the CPU: the seeded generator draws there (the same tokens on any device).
        last = step.tensor("head.logits")[-1:].float().cpu()  # [1, vocab]
        next_id = int(choose_next(last, settings, t, t == budget - 1, sampling, generator)[0])
        chosen.append(float(next_token_probabilities(_suppressed(last, settings), sampling)[0, next_id]))
        steps.append(step)
        sequence.append(next_id)
        if next_id == settings.eos_id:
            return Decoded(sequence, tuple(steps), tuple(chosen), True)
    return Decoded(sequence, tuple(steps), tuple(chosen), False)


def traced_steps(
    trace_step: Callable[[list[int]], Trace], sequence: list[int], settings: GenerationSettings, budget: int
) -> tuple[list[int], tuple[Trace, ...], bool]:
    """Greedy decoding with a trace per step (see `decode_steps`): (the sequence with the new tokens, the
    step traces, whether the end token was produced)."""
    decoded = decode_steps(trace_step, sequence, settings, budget)
    return decoded.sequence, decoded.steps, decoded.finished


def next_token_table(trace: Trace, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The model's top-k next tokens after every position of one traced pass of a decoder:
    (ids [positions, k] int64, probabilities [positions, k] float32), most probable first.

    Reads full logits or a compact trace's kept top tokens (at most its TOP_K); labels: trace.meta.labels.
    """
    if "head.top_ids" in trace.activations:
        k = min(int(k), trace.activations["head.top_ids"].shape[1])
        ids, probs = trace.fetch("head.top_ids", "head.top_probs")
        return ids[:, :k].astype(np.int64), probs[:, :k].astype(np.float32)
    logits = trace.activations.get("head.logits")
    if logits is None or logits.ndim != 2:
        raise ValueError("this trace has no next-token logits per position (a decoder's head.logits)")
    # Ranked on the trace's device, a few positions at a time; k per position leave it.
    host_ids, host_probs = to_host(top_k_tokens(logits, k))
    return host_ids.astype(np.int64), host_probs.astype(np.float32)
