"""Activation patching of the residual stream: which layer x position carries the difference between two inputs.

    grid = residual_patching(model, "The capital of France is", "The capital of Italy is")
    grid.answers                    # ("' Paris'", "' Rome'"): A's answer, B's answer
    grid.patched[4, 3]              # logit(B's answer) - logit(A's answer) for A with layer 4's input at
                                    # position 3 taken from B
    grid.moved                      # the same, 0 where patching leaves A's difference, 1 where it gives B's

Input A runs again with one cell of its residual stream replaced by B's: the stream entering layer l
(`decoder.l.resid_pre`) at position p, and as a last row the stream leaving the last layer. The measure is the
logit difference at the last position between B's answer and A's answer (Wang et al. 2022, Meng et al. 2022):
patching the last row's last position gives B's difference exactly (nothing after it reads A), and patching
the embedding of the one token in which A and B differ gives B's whole pass. Both inputs must have the same
number of tokens (positions are patched one to one).

Every cell is one batch row of the same pass, branched at its layer (`interventions.branch`): the layers
below a patch run once. Passes are cut so that one holds at most probes.ROW_TOKENS rows x tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import probes, workload
from .capture import Edit, Hook
from .errors import InputError
from .interventions import branch
from .models.decoder import Decoder
from .workload import Workload

__all__ = [
    "Progress",
    "ResidualPatching",
    "UnequalInputs",
    "answers_of",
    "patching_workload",
    "residual_patching",
    "unequal_inputs_message",
]

Progress = Callable[[float, str], None]


class UnequalInputs(InputError):
    """A and B split into different numbers of tokens: position p of B cannot be patched into position p of A.
    tokens_a, tokens_b: each input's tokens as its tokenizer writes them (a page shows them readable)."""

    def __init__(self, tokens_a: tuple[str, ...], tokens_b: tuple[str, ...]) -> None:
        self.tokens_a, self.tokens_b = tokens_a, tokens_b
        super().__init__(unequal_inputs_message(tokens_a, tokens_b))


def unequal_inputs_message(tokens_a: Sequence[str], tokens_b: Sequence[str]) -> str:
    """What is wrong and what to do, with both inputs' tokens (joined by " | ")."""
    return (
        f"A has {len(tokens_a)} tokens and B has {len(tokens_b)}: patching puts B's token at each position into "
        "A's at the same position, one to one, so both inputs need the same number of tokens. "
        f"A: {' | '.join(tokens_a)}. B: {' | '.join(tokens_b)}. Change a word of one of them so that both split "
        "into as many tokens (e.g. a word the tokenizer keeps whole for one it splits)."
    )


@dataclass(frozen=True, eq=False)
class ResidualPatching:
    """A layer x position grid of patches from input B into input A (see the module docstring).

    tokens: A's tokens (B's differ where the inputs do); layers: "0".."L-1" (the stream entering that layer),
    then "out" (leaving the last one); answers: (A's answer, B's answer) as labels, answer_ids their ids;
    clean, source: the logit difference logit(B's answer) - logit(A's answer) on A and on B; patched
    [layers + 1, T]: that difference on A with the cell patched from B. seconds, passes, rows: the work done.
    """

    tokens: tuple[str, ...]
    source_tokens: tuple[str, ...]
    layers: tuple[str, ...]
    answers: tuple[str, str]
    answer_ids: tuple[int, int]
    clean: float
    source: float
    patched: np.ndarray
    seconds: float
    passes: int
    rows: int

    @property
    def moved(self) -> np.ndarray:
        """[layers + 1, T]: (patched - clean) / (source - clean): 0 = A's difference, 1 = B's."""
        span = self.source - self.clean
        return (self.patched - self.clean) / (span if span != 0 else np.nan)


def answers_of(logits_a: np.ndarray, logits_b: np.ndarray, k: int = 10) -> tuple[int, int]:
    """(A's answer, B's answer) from the two inputs' next-token logits [vocab]: their own top-1 when they
    differ; when both predict the same token, the token of A's top-k whose log-probability falls most from A
    to B, and the token of B's top-k whose log-probability rises most (what B says instead of A)."""
    a, b = int(np.argmax(logits_a)), int(np.argmax(logits_b))
    if a != b:
        return a, b
    log_a = logits_a - np.logaddexp.reduce(logits_a)
    log_b = logits_b - np.logaddexp.reduce(logits_b)
    top_a, top_b = np.argsort(-logits_a)[:k], np.argsort(-logits_b)[:k]
    a = int(top_a[np.argmax((log_a - log_b)[top_a])])
    b = int(top_b[np.argmax((log_b - log_a)[top_b])])
    if a == b:
        raise ValueError("the two inputs predict the same next tokens: there is no difference to trace")
    return a, b


def _label(model: Decoder, output: int) -> str:
    labels = model.output_labels
    return str(labels[output]) if labels is not None and output < len(labels) else str(output)


def _cells(layers: int, tokens: int) -> list[list[tuple[int, int]]]:
    """The passes: lists of (row, position) cells, row L being the stream after the last layer, each pass
    holding at most probes.ROW_TOKENS rows x tokens (row 0 of every pass is A unpatched)."""
    per_pass = max(1, probes.ROW_TOKENS // tokens - 1)
    cells = [(layer, p) for layer in range(layers + 1) for p in range(tokens)]
    return [cells[i : i + per_pass] for i in range(0, len(cells), per_pass)]


def _diagonal_patch(name: str, source: torch.Tensor, first_row: int, positions: list[int]) -> Edit:
    """Rows first_row + i of the batch take B's stream at positions[i] (one copy of the stream, not one a row)."""

    def apply(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        out = x.clone()
        rows = torch.arange(first_row, first_row + len(positions), device=x.device)
        cols = torch.as_tensor(positions, device=x.device)
        out[rows, cols] = source.to(x.device, x.dtype)[cols]
        return out

    return Edit(name, apply)


def _pass_edits(cells: list[tuple[int, int]], n_layers: int, streams: list[torch.Tensor]) -> list[Edit]:
    edits, rows = [], 1
    for layer in sorted({layer for layer, _ in cells}):
        positions = [p for row, p in cells if row == layer]
        name = f"decoder.{layer}.resid_pre" if layer < n_layers else f"decoder.{n_layers - 1}.resid_post"
        edits += [branch(name, len(positions)), _diagonal_patch(name, streams[layer], rows, positions)]
        rows += len(positions)
    return edits


def patching_workload(model: Decoder, tokens: int) -> Workload:
    """What `residual_patching` computes for two inputs of `tokens` positions, before anything runs: B traced and
    A run once (one row each, every layer), then its passes as `_cells` cuts them, each cell's row joining the
    batch at its layer (tformer_core.workload says what is counted)."""
    n_layers = workload.stack_layers(model, "decoder")
    rows_through, total = [2] * n_layers, 2
    for cells in _cells(n_layers, tokens):
        rows = 1
        for layer in range(n_layers):
            rows += sum(1 for row, _ in cells if row == layer)
            rows_through[layer] += rows
        total += 1 + len(cells)
    cost = workload.of_passes(model, "decoder", tokens, rows_through, head_rows=total)
    return Workload("Patching every layer × position", total, tokens, n_layers, cost.flops)


def residual_patching(
    model: Decoder,
    a: str | list[int],
    b: str | list[int],
    answers: tuple[int, int] | None = None,
    progress: Progress | None = None,
) -> ResidualPatching:
    """Patch B's residual stream into A at every layer x position, one cell a batch row (see the module
    docstring). answers: (A's answer, B's answer) token ids, default `answers_of` the two inputs' logits."""
    probes.require_core(model)
    c = model.config
    with torch.inference_mode(False):
        ids_a, tokens_a = model._ids(a, c.vocab_size, c.max_positions)
        ids_b, tokens_b = model._ids(b, c.vocab_size, c.max_positions)
    if ids_a.shape[1] != ids_b.shape[1]:
        raise UnequalInputs(tuple(map(str, tokens_a)), tuple(map(str, tokens_b)))
    names = [f"decoder.{layer}.resid_pre" for layer in range(c.n_layers)] + [f"decoder.{c.n_layers - 1}.resid_post"]
    trace_b = model.trace(ids_b[0].tolist(), keep=lambda name: name in names or name == "head.logits")
    streams = [torch.as_tensor(np.array(trace_b[n])) for n in names]
    last = Edit("decoder.out", lambda x, hook: x[:, -1:])  # only the last position reaches the unembedding
    with torch.inference_mode(), model.intervene([last]):
        logits_a = model(ids_a)[0, -1].double().cpu().numpy()
    logits_b = np.asarray(trace_b["head.logits"], dtype=np.float64)[-1]
    a_id, b_id = answers if answers is not None else answers_of(logits_a, logits_b)
    start, patched = time.perf_counter(), np.full((c.n_layers + 1, ids_a.shape[1]), np.nan)
    passes = _cells(c.n_layers, ids_a.shape[1])
    for i, cells in enumerate(passes):
        with torch.inference_mode(), model.intervene([*_pass_edits(cells, c.n_layers, streams), last]):
            out = model(ids_a)[:, -1].double()
        diff = (out[:, b_id] - out[:, a_id]).cpu().numpy()
        for (layer, p), value in zip(cells, diff[1:], strict=True):
            patched[layer, p] = value
        if progress is not None:
            progress((i + 1) / len(passes), f"Patching: pass {i + 1} of {len(passes)}")
    return ResidualPatching(
        tuple(map(str, tokens_a)),
        tuple(map(str, tokens_b)),
        (*map(str, range(c.n_layers)), "out"),
        (_label(model, a_id), _label(model, b_id)),
        (a_id, b_id),
        float(logits_a[b_id] - logits_a[a_id]),
        float(logits_b[b_id] - logits_b[a_id]),
        patched,
        time.perf_counter() - start,
        len(passes),
        sum(len(cells) + 1 for cells in passes),
    )
