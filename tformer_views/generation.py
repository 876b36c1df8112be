"""What the Text attention page shows of a decoder-only model writing: computed from the core's traces, no Streamlit.

    c = continue_text(model, "The capital of France is", 16)                # greedy
    c = continue_text(model, prompt, 16, tc.Sampling(temperature=0.8, top_k=50, seed=1))
    c.generated_tokens, c.text               # the new tokens, and as text
    step = c.step(0)                         # what the model computed when it chose the first new token
    step.rows                                # [layers, heads, keys]: the attention row of the position it read last
    step.grid()                              # that as one matrix [layers * heads, keys] with labels, for a heatmap
    step.top                                 # the model's top-k at that step: (token as shown, probability)
    next_token_frame(prompt_trace, 5)        # the top 5 after every position of a prompt, as a table

Steps and positions: the prompt has positions 0 .. n_prompt - 1. Step t (0-based) is the pass that chose
generated token t, which lands at position n_prompt + t; the query that chose it is the position before,
n_prompt - 1 + t (the last prompt token at step 0, the token written at step t - 1 afterwards), and it
attends to the keys 0 .. n_prompt - 1 + t. With a key/value cache (the core's decoders) each step after the
first runs that one token; the core's `Generation` keeps its attention in every layer and head.

A `Continuation` keeps only what the page draws (each step's attention rows and top-k), not the step traces:
for smollm2 (30 layers x 9 heads) 20 new tokens after a 13-token prompt are under 1 MB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.generation import Sampling, next_token_table
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import CausalLM
from tformer_core.numerics import head_scores_tensor, top_k_scores
from tformer_core.trace import Trace, to_host

from .tokens import display_next, display_tokens, ends_inside_a_character

__all__ = [
    "MAX_NEW_TOKENS",
    "MAX_PROMPT_TOKENS",
    "STEP_TOP_K",
    "Continuation",
    "Step",
    "continue_text",
    "next_token_frame",
    "sampling_of",
    "step_keep",
    "supports_sampling",
]

MAX_NEW_TOKENS = 64  # new tokens one continuation may write (each is a traced pass)
MAX_PROMPT_TOKENS = 256  # a longer prompt is refused: every step's attention row spans the whole prompt
STEP_TOP_K = 10  # predictions kept per step


# What a step's trace keeps: the attention weights (a cached step's are one row per head) and the logits.
step_keep = matching("**.attn.weights", "head.logits")


def supports_sampling(model: TracedModel) -> bool:
    """True when the model's generate() draws with a temperature and a top-k (the core's own decoders);
    the decoders transformers runs decode greedily only. Declared by the model: `capabilities.sampling`."""
    return model.capabilities.sampling


def sampling_of(temperature: float, top_k: int | None, seed: int) -> Sampling | None:
    """The page's settings as a `Sampling`, or None for greedy decoding (temperature 0: seed and top-k play no
    part, so every greedy request shares one cached result)."""
    if temperature <= 0:
        return None
    return Sampling(float(temperature), int(top_k) if top_k else None, int(seed))


@dataclass(frozen=True, eq=False)
class Step:
    """Step t of a continuation: the query at position `query` read tokens 0..query and chose `produced`.

    rows: [layers, heads, query + 1] float32, each row summing to 1.
    top: the model's most probable next tokens (as shown, probability of its softmax), most probable first.
    probability: of the chosen token in the distribution it was drawn from (greedy: the softmax; sampling:
    after the temperature and the top-k); model_probability: in the model's own softmax.
    """

    t: int
    query: int
    keys: tuple[str, ...]  # the tokens read, as shown
    produced: str  # as shown
    rows: np.ndarray
    top: tuple[tuple[str, float], ...]
    probability: float
    model_probability: float

    @property
    def query_token(self) -> str:
        return self.keys[self.query]

    def grid(self) -> tuple[np.ndarray, list[str], list[str]]:
        """(matrix [layers * heads, keys] float64, row labels "L{layer} H{head}", key labels) for a heatmap."""
        n_layers, n_heads, n_keys = self.rows.shape
        labels = [f"L{layer} H{head}" for layer in range(n_layers) for head in range(n_heads)]
        return self.rows.reshape(n_layers * n_heads, n_keys).astype(np.float64), labels, list(self.keys)

    def top_frame(self, k: int = 5) -> pd.DataFrame:
        """The top-k as a table: token, probability, and whether it is the one written."""
        rows = [(token, p, token == self.produced) for token, p in self.top[:k]]
        return pd.DataFrame(rows, columns=["token", "probability", "written"])


@dataclass(frozen=True, eq=False)
class Continuation:
    """A prompt and what a decoder-only model wrote after it.

    tokens: the whole sequence (prompt, then the new tokens) as the tokenizer writes them; n_prompt: how
    many were given. text: the new tokens as text. rows[t]: [layers, heads, n_prompt + t] (see `Step`).
    top_ids / top_probs: [steps, STEP_TOP_K] the model's own most probable tokens at each step; top_labels
    their labels. probabilities / model_probabilities: the chosen tokens' (see `Step`).
    finished: the model wrote its end token; path: "tformer" or "transformers" (how the model ran).
    """

    prompt: str
    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    n_prompt: int
    text: str
    rows: tuple[np.ndarray, ...]
    top_ids: np.ndarray
    top_probs: np.ndarray
    top_labels: tuple[tuple[str, ...], ...]
    probabilities: tuple[float, ...]
    model_probabilities: tuple[float, ...]
    finished: bool
    sampling: Sampling | None
    path: str

    @property
    def n_steps(self) -> int:
        return len(self.ids) - self.n_prompt

    @property
    def generated_tokens(self) -> tuple[str, ...]:
        return self.tokens[self.n_prompt :]

    def step(self, t: int) -> Step:
        """Step t (0-based); ValueError outside 0 .. n_steps - 1."""
        if not 0 <= t < self.n_steps:
            raise InputError(f"step {t} is out of range: this continuation has {self.n_steps} steps")
        query = self.n_prompt - 1 + t
        before = self.tokens[: query + 1]  # what the model has read: shown as it stands at this step
        top = tuple((display_next(before, label), float(p)) for label, p in zip(self.top_labels[t], self.top_probs[t]))
        return Step(
            t,
            query,
            tuple(display_tokens(before)),
            display_next(before, self.tokens[query + 1]),
            self.rows[t],
            top,
            self.probabilities[t],
            self.model_probabilities[t],
        )

    def tokens_frame(self) -> pd.DataFrame:
        """One row per new token: step (1-based), token as shown, its probabilities."""
        return pd.DataFrame(
            {
                "step": np.arange(1, self.n_steps + 1),
                "token": display_tokens(self.generated_tokens),
                "probability": self.probabilities,
                "model probability": self.model_probabilities,
            }
        )


def continue_text(
    model: TracedModel, prompt: str, max_new_tokens: int, sampling: Sampling | None = None
) -> Continuation:
    """Let a decoder-only model continue `prompt` for at most `max_new_tokens` tokens (greedy, or drawn with
    `sampling`), keeping each step's attention rows and top-k. ValueError with a message for the page for a
    model that cannot, an empty or over-long prompt, or a number of tokens outside 1..MAX_NEW_TOKENS."""
    if not isinstance(model, CausalLM) or model.tokenizer is None:
        raise InputError("only a decoder-only model with a tokenizer continues a text")
    if isinstance(max_new_tokens, bool) or not 1 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
        raise InputError(f"the number of new tokens must be 1 to {MAX_NEW_TOKENS}, got {max_new_tokens}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("the text to continue is empty: type at least one word")
    n = model.tokenizer.count(prompt)
    if n > MAX_PROMPT_TOKENS:
        raise InputError(
            f"the text to continue has {n:,} tokens; a continuation starts from at most {MAX_PROMPT_TOKENS} "
            "(each new token's attention spans the whole prompt): shorten it"
        )
    if sampling is not None and sampling.greedy:
        sampling = None
    if sampling is not None and not model.capabilities.sampling:
        raise InputError("this model runs through transformers' own code, which tformer decodes greedily only")
    # Only the steps are read: no final pass over the whole text (130 MB for smollm2 at 270 tokens).
    gen = model.generate(prompt, int(max_new_tokens), sampling=sampling, keep=step_keep, final_trace=False)
    rows, top_ids, top_probs, top_labels, model_probs = [], [], [], [], []
    for t, trace in enumerate(gen.steps):
        with torch.inference_mode():  # on the device; the step's rows and top tokens come to the host in one transfer
            row = torch.stack([trace.block_tensor("weights", layer)[:, -1, :] for layer in range(trace.n_layers)])
            logits = trace.tensor("head.logits")[-1]
            ids, probs = top_k_scores(logits, STEP_TOP_K)
            chosen = head_scores_tensor(logits)[gen.ids[gen.n_prompt + t]]
        row_host, top, top_p, chosen_p = to_host([row, ids, probs, chosen])
        labels = trace.meta.labels
        rows.append(row_host.astype(np.float32))
        top_ids.append(top.astype(np.int64))
        top_probs.append(top_p.astype(np.float32))
        top_labels.append(tuple(str(labels[i]) if labels is not None else str(i) for i in top))
        model_probs.append(float(chosen_p))
    probabilities = tuple(gen.probabilities) if len(gen.probabilities) == len(gen.steps) else tuple(model_probs)
    k = STEP_TOP_K
    return Continuation(
        prompt,
        tuple(int(i) for i in gen.ids),
        tuple(gen.tokens),
        int(gen.n_prompt),
        _whole_characters(model.tokenizer.decode(list(gen.generated_ids)), gen.tokens),
        tuple(rows),
        np.asarray(top_ids, dtype=np.int64).reshape(-1, k) if top_ids else np.zeros((0, k), np.int64),
        np.asarray(top_probs, dtype=np.float32).reshape(-1, k) if top_probs else np.zeros((0, k), np.float32),
        tuple(top_labels),
        probabilities,
        tuple(model_probs),
        bool(gen.finished),
        sampling,
        model.path,
    )


def _whole_characters(text: str, tokens: Sequence[str]) -> str:
    """The text without the "�" a decoder writes for a character whose first bytes are the last tokens written
    (a byte-level model stopped inside one): the tokens table shows that last piece for what it is."""
    return text.rstrip("\ufffd") if ends_inside_a_character(tokens) else text


def next_token_frame(trace: Trace, k: int = 5) -> pd.DataFrame:
    """The model's top-k next tokens after every position of one decoder pass: a row per position with the
    position, its token and k cells "token  probability" (most probable first)."""
    ids, probs = next_token_table(trace, k)
    labels = trace.meta.labels
    start = trace.meta.query_start
    tokens = display_tokens(trace.tokens)[start:]
    frame = pd.DataFrame({"position": np.arange(start, start + len(tokens)), "token": tokens})
    for j in range(ids.shape[1]):
        frame[f"#{j + 1}"] = [
            f"{display_next(trace.tokens[: start + row + 1], labels[i] if labels is not None else str(i))}  {p:.3f}"
            for row, (i, p) in enumerate(zip(ids[:, j], probs[:, j]))
        ]
    return frame
