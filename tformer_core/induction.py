"""Induction heads (Olsson et al. 2022): heads that find the previous occurrence of the current token and copy
the token that came after it. A repeated random sequence shows them plainly.

    seq = repeated_tokens(model, length=24, seed=0)       # [BOS?] r_1 .. r_24 r_1 .. r_24
    trace = model.trace(list(seq.ids))
    scores = induction_scores(trace.all_attention("decoder"), seq)   # [layers, heads]
    losses = ablated_losses(model, seq, [[], [Head("decoder", 3, 5)]])  # [2, T - 1]: clean, head 3.5 ablated
    repeat_loss(losses, seq, 1)                                          # [2]: the second repeat's loss

The sequence: the tokenizer's own prefix (what it puts before any text: a BOS for Llama's tokenizer, nothing for
SmolLM2's), then `length` distinct random tokens (no special token), then the same tokens again. Random tokens
cannot be predicted the first time; the second time a model that copies from the first repeat predicts them.

Induction score of a head (as TransformerLens defines it): the mean, over the queries of the second repeat, of
the attention from the token at position q to the position right after the token's previous occurrence,
q - length + 1. (TransformerLens's `pattern.diagonal(offset=1 - length)` also averages two queries of the
first repeat, whose key there is not an induction target; here only the second repeat's `length` queries.)

Loss of a repeat: the mean next-token cross-entropy (nats) of predicting its tokens from what comes before,
its first token left out: that token follows the previous repeat's last one by chance, in either repeat.
So both repeats average the same `length - 1` predictions: the first repeat's r_2..r_L, the second's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .interventions import Head, scale_heads
from .models.decoder import Decoder
from .models.kinds import CausalLM

__all__ = [
    "ROW_TOKENS",
    "RepeatedTokens",
    "ablated_losses",
    "induction_scores",
    "repeat_loss",
    "repeated_tokens",
    "token_losses",
]

ROW_TOKENS = 512  # rows x tokens of one pass: SmolLM2's logits for them take 100 MB


@dataclass(frozen=True)
class RepeatedTokens:
    """ids: prefix + repeats x the same `length` random tokens; prefix: how many tokens come before the first
    repeat (the tokenizer's BOS, or none); seed: the random generator's seed that drew them."""

    ids: tuple[int, ...]
    prefix: int
    length: int
    repeats: int
    seed: int

    def positions(self, repeat: int) -> range:
        """The positions of repeat `repeat` (0 = the first) in `ids`."""
        if not 0 <= repeat < self.repeats:
            raise ValueError(f"repeat must be in 0..{self.repeats - 1}, got {repeat}")
        start = self.prefix + repeat * self.length
        return range(start, start + self.length)


def _ordinary(model: CausalLM, token: int) -> bool:
    """Not a special token: neither a generation setting's (EOS, padding, start) nor one the tokenizer leaves
    out of its text (its decode of a special token is empty)."""
    g = model.generation
    if token in (g.eos_id, g.pad_id, g.start_id):
        return False
    return model.tokenizer is None or model.tokenizer.decode([token]) != ""


def repeated_tokens(model: CausalLM, length: int, seed: int, repeats: int = 2) -> RepeatedTokens:
    """`length` distinct random ordinary tokens drawn with `seed` (numpy's default generator), repeated
    `repeats` times after the tokenizer's own prefix. ValueError for a length the model cannot hold or a
    vocabulary too small."""
    if length < 2 or repeats < 2:
        raise ValueError(f"a repeated sequence needs length >= 2 and repeats >= 2, got {length} x {repeats}")
    prefix = list(model.tokenizer.encode("")) if model.tokenizer is not None else []
    limit = model.token_limit  # its positions, or the fewer tokens one pass reads on this server
    if limit is not None and len(prefix) + repeats * length > limit:
        raise ValueError(f"{repeats} x {length} tokens do not fit in one pass of this model ({limit} tokens)")
    rng = np.random.default_rng(seed)
    vocab = model.output_vocab_size
    drawn: list[int] = []
    for token in rng.permutation(vocab).tolist():  # distinct, in a seeded order; special ones skipped
        if token not in prefix and _ordinary(model, token):
            drawn.append(int(token))
            if len(drawn) == length:
                break
    if len(drawn) < length:
        raise ValueError(f"the vocabulary has fewer than {length} ordinary tokens")
    return RepeatedTokens(tuple(prefix + drawn * repeats), len(prefix), length, repeats, seed)


def induction_scores(attention: np.ndarray, seq: RepeatedTokens, repeat: int = 1) -> np.ndarray:
    """attention [..., T, T] (e.g. [layers, heads, T, T] from `trace.all_attention`) -> [...]: the mean weight
    from each query of repeat `repeat` (default the second) to the position after its token's previous
    occurrence, q - length + 1 (see the module docstring)."""
    if repeat < 1:
        raise ValueError("the first repeat has no previous occurrence to look back to")
    n = len(seq.ids)
    if attention.shape[-2:] != (n, n):
        raise ValueError(f"attention of shape {attention.shape} does not match the {n} tokens of the sequence")
    queries = np.asarray(seq.positions(repeat))
    return np.asarray(attention)[..., queries, queries - seq.length + 1].mean(axis=-1)


def token_losses(logits: torch.Tensor | np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """logits [..., T, vocab] -> [..., T - 1]: the cross-entropy (nats) of each next token, ids[p + 1] predicted
    at position p (in float64)."""
    x = torch.from_numpy(np.array(logits, dtype=np.float64)) if isinstance(logits, np.ndarray) else logits.double()
    target = torch.as_tensor(list(ids[1:]), device=x.device)
    log_probs = torch.log_softmax(x[..., :-1, :], dim=-1)
    picked = log_probs.gather(-1, target.expand(*log_probs.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return (-picked).cpu().numpy()


def repeat_loss(losses: np.ndarray, seq: RepeatedTokens, repeat: int) -> np.ndarray:
    """losses [..., T - 1] (`token_losses`) -> [...]: the mean loss of predicting repeat `repeat`'s tokens but
    its first, i.e. tokens at positions start + 1 .. start + length - 1, predicted at the positions before."""
    targets = np.asarray(seq.positions(repeat))[1:]
    return np.asarray(losses)[..., targets - 1].mean(axis=-1)


def ablated_losses(model: Decoder, seq: RepeatedTokens, head_sets: Sequence[Sequence[Head]]) -> np.ndarray:
    """One row per set of heads ablated together (zero; [] = the clean pass) -> [sets, T - 1] token losses
    (`token_losses`). The rows run batched, at most ROW_TOKENS rows x tokens a pass: the logits of every
    position are read, [rows, T, vocab] floats (SmolLM2: 200 KB a position)."""
    c = model.config
    factors = torch.ones(c.n_layers, len(head_sets), c.n_heads)
    for row, heads in enumerate(head_sets):
        for h in heads:
            if h.stack != "decoder" or not (0 <= h.layer < c.n_layers and 0 <= h.head < c.n_heads):
                raise ValueError(f"{h} is not a head of this model ({c.n_layers} layers x {c.n_heads} heads)")
            factors[h.layer, row, h.head] = 0.0
    per_pass = max(1, ROW_TOKENS // len(seq.ids))
    losses: list[np.ndarray] = []
    for start in range(0, len(head_sets), per_pass):
        rows = factors[:, start : start + per_pass]  # [layers, rows, heads]
        edits = [scale_heads(Head("decoder", layer, 0).block, rows[layer]) for layer in range(c.n_layers)]
        ids = torch.tensor([list(seq.ids)] * rows.shape[1], dtype=torch.long, device=model.device)
        with torch.inference_mode(), model.intervene(edits):
            logits = model(ids)  # (rows, T, vocab)
        losses.extend(token_losses(row, seq.ids) for row in logits)  # float64 one row at a time
    return np.stack(losses)
