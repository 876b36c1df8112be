"""What the text-attention views show, computed from a `Trace`: matrices, Q/K/V, the head view's lines.

Every function takes a trace and a stack name ("encoder", "decoder", or "cross" for the
cross-attention of an encoder-decoder model; None means the trace's main stack), so the
Text attention page and the encoder-decoder page draw from the same code.

    m = head_matrix(trace, layer=2, head=5, hide_special=True)
    view = head_view(trace, 2, heads=[0, 5])          # charts.attention.head_view_chart(view, n_heads)

Hiding special tokens ([CLS], [SEP], <s>, </s>, BOS...) drops their rows and columns and
renormalises every remaining row to sum to 1: the views then show how a token shares the attention
it gives to real words. The share that went to the hidden tokens is reported beside them (in BERT
it is often most of it), so nothing is hidden silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from tformer_core.inputs.text import FittedInput, fit_to_model
from tformer_core.models.base import TracedModel
from tformer_core.models.encoder import class_scores as tc_class_scores
from tformer_core.models.encoder import first_token_attention as tc_first_token_attention
from tformer_core.tokenizers import Tokenizer
from tformer_core.trace import Trace, reduces_on_device, to_host

from .tokens import display_next, display_tokens, visible_positions

__all__ = [
    "DEFAULT_SENTENCE",
    "HEAD_VIEW_MAX_LINES",
    "HEAD_VIEW_MIN_WEIGHT",
    "PAGE_MAX_TOKENS",
    "FirstTokenAttention",
    "HeadMatrix",
    "HeadView",
    "allowed_cells",
    "allowed_mask",
    "class_scores",
    "difference",
    "first_token_view",
    "fit_text",
    "head_matrix",
    "head_view",
    "mask_tensor",
    "mask_token",
    "peak_weights",
    "prediction_kind",
    "qkv",
    "score_matrix",
    "shown_weights",
    "text_model_problem",
    "top_predictions",
]

DEFAULT_SENTENCE = "The animal didn't cross the street because it was too tired."
HEAD_VIEW_MAX_LINES = 6000  # the head view draws at most this many lines (the strongest ones)
HEAD_VIEW_MIN_WEIGHT = 0.01  # lines below this weight are invisible anyway (opacity = weight)


def text_model_problem(model: TracedModel) -> str | None:
    """Why `model` cannot be shown on the Text attention page (plain text), or None when it can."""
    name = model.source or "this model"
    if model.kind == "encoder-decoder":
        return (
            f"{name} is an encoder-decoder (translation / summarisation) model: its encoder, decoder and "
            "cross-attention are shown on the Encoder-decoder page."
        )
    if model.kind == "vit":
        return f"{name} is a Vision Transformer: it reads images, not text. Open the Vision Transformer page."
    if model.kind not in ("encoder", "decoder"):
        return f"{name} is a {model.kind or 'model of an unknown kind'}, not an encoder or decoder-only text model."
    if model.tokenizer is None:
        return f"{name} has no tokenizer, so it cannot read text."
    return None


def mask_token(model: TracedModel) -> str | None:
    """The text that marks a word to guess ("[MASK]", "<mask>") when the model has a masked-word head."""
    if model.kind != "encoder" or model.output_vocab_size == 0 or model.tokenizer is None:
        return None
    return model.tokenizer.mask_token


# ---- one layer ---------------------------------------------------------------------------------------
def mask_tensor(trace: Trace, layer: int, stack: str) -> torch.Tensor | None:
    """[n_q, n_k] bool on the trace's device, False where the mask forbids attending; None when unmasked."""
    try:
        return trace.block_tensor("mask", layer, None, stack)[0]
    except KeyError:
        return None


def allowed_mask(trace: Trace, layer: int, stack: str | None = None) -> np.ndarray | None:
    """[n_q, n_k] bool, False where the mask forbids attending (causal, padding); None when unmasked."""
    mask = mask_tensor(trace, layer, stack or trace.main_stack)
    return None if mask is None else np.asarray(to_host([mask])[0], dtype=bool)


def _select(t: torch.Tensor, rows: np.ndarray, cols: np.ndarray) -> torch.Tensor:
    """t[..., rows, :][..., cols] on t's device; no copy where every row (column) is selected."""
    if len(rows) < t.shape[-2]:
        t = t.index_select(-2, torch.as_tensor(rows, device=t.device))
    if len(cols) < t.shape[-1]:
        t = t.index_select(-1, torch.as_tensor(cols, device=t.device))
    return t


def allowed_cells(trace: Trace, layer: int, stack: str, queries: np.ndarray, keys: np.ndarray) -> torch.Tensor | None:
    """The mask over the shown queries and keys, [q, k] bool on the trace's device; None when unmasked."""
    mask = mask_tensor(trace, layer, stack)
    return None if mask is None else _select(mask, queries, keys)


def _renormalise(w: np.ndarray, kept_total: np.ndarray) -> np.ndarray:
    return np.divide(w, kept_total, out=np.zeros_like(w), where=kept_total > 0)


def shown_weights(
    trace: Trace, layer: int, stack: str, queries: np.ndarray, keys: np.ndarray, renormalise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's weights over the shown queries and keys, on the trace's device, float32: ([heads, q, k],
    [heads, q] the share of each row on the keys left out). renormalise: rows rescaled over the shown keys
    (hidden special tokens), as `head_matrix` shows them. For views that reduce every layer there (the
    overview's thumbnails, the distances), so that only their small results are copied to the host."""
    w = _select(trace.block_tensor("weights", layer, None, stack), queries, keys).float()
    if not renormalise:
        return w, w.new_zeros(w.shape[:-1])
    total = w.sum(-1, keepdim=True)
    hidden = (1.0 - total[..., 0]).clamp(0.0, 1.0)
    return torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), 0.0), hidden


@dataclass(frozen=True)
class HeadMatrix:
    """Attention of one head (or all heads) of one layer, restricted to the shown tokens.

    weights: [n_q, n_k] (or [heads, n_q, n_k]) float64; rows renormalised over the shown keys
        when special tokens are hidden. queries / keys: their positions in the input.
    allowed: [n_q, n_k] bool, False where the mask forbids attending, or None.
    hidden_share: [n_q] (or [heads, n_q]) share of each row's attention on hidden tokens.
    """

    weights: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    query_labels: tuple[str, ...]
    key_labels: tuple[str, ...]
    allowed: np.ndarray | None
    hidden_share: np.ndarray

    @property
    def masked(self) -> np.ndarray | None:
        """[n_q, n_k] True where the mask forbids the cell (its weight is 0), for charts.heatmap; None: no mask."""
        return None if self.allowed is None else ~self.allowed

    def window(self, rows: slice, cols: slice | None = None) -> HeadMatrix:
        """A window of shown queries (and keys; default the same window): no renormalisation."""
        cols = rows if cols is None else cols
        allowed = None if self.allowed is None else self.allowed[rows, cols]
        return HeadMatrix(
            self.weights[..., rows, cols],
            self.queries[rows],
            self.keys[cols],
            self.query_labels[rows],
            self.key_labels[cols],
            allowed,
            self.hidden_share[..., rows],
        )


def head_matrix(
    trace: Trace,
    layer: int,
    head: int | None,
    stack: str | None = None,
    hide_special: bool = False,
    window: slice | None = None,
    widen: bool = True,
) -> HeadMatrix:
    """The attention weights of `head` (None: every head) in `layer` of `stack`, special tokens hidden or not.

    window: which of the shown tokens to return (rows and columns); rows are renormalised over all
    shown keys first, so a window is a piece of the full matrix, not a matrix of its own.
    widen=False keeps the stored float32 weights when nothing is renormalised (no copy: the overview
    and the distances read every layer of long inputs).
    """
    stack = stack or trace.main_stack
    q_tokens, k_tokens = trace.tokens_for(stack)
    queries, keys = visible_positions(q_tokens, hide_special), visible_positions(k_tokens, hide_special)
    if window is not None:
        queries = queries[window]
    # The shown rows and columns are picked on the device; they come to the host with the mask in one transfer.
    weights = _select(trace.block_tensor("weights", layer, head, stack), queries, keys)
    mask = mask_tensor(trace, layer, stack)
    parts = to_host([weights] if mask is None else [weights, _select(mask, queries, keys)])
    rows = parts[0]  # float32 (the model's half precision widened), read-only
    if len(keys) < len(k_tokens):
        kept = rows.astype(np.float64)
        total = kept.sum(-1, keepdims=True)
        hidden = np.clip(1.0 - total[..., 0], 0.0, 1.0)
        kept = _renormalise(kept, total)
    else:
        kept = rows.astype(np.float64) if widen else rows
        hidden = np.zeros(kept.shape[:-1])
    allowed = None if mask is None else np.asarray(parts[1], dtype=bool)
    if window is not None:
        kept, keys = kept[..., window], keys[window]
        allowed = None if allowed is None else allowed[:, window]
    labels_q, labels_k = display_tokens(q_tokens), display_tokens(k_tokens)
    return HeadMatrix(
        kept, queries, keys, tuple(labels_q[i] for i in queries), tuple(labels_k[i] for i in keys), allowed, hidden
    )


def difference(first: HeadMatrix, second: HeadMatrix) -> HeadMatrix | None:
    """second - first, cell by cell, when the two show as many queries and keys (None: they do not line up).
    Labels: a token where both inputs have it, "first→second" where they differ; masked where either is."""
    if first.weights.shape != second.weights.shape:
        return None

    def labels(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(x if x == y else f"{x}→{y}" for x, y in zip(a, b, strict=True))

    masks = [m.allowed for m in (first, second) if m.allowed is not None]
    allowed = np.logical_and.reduce(masks) if masks else None
    return HeadMatrix(
        second.weights - first.weights,
        first.queries,
        first.keys,
        labels(first.query_labels, second.query_labels),
        labels(first.key_labels, second.key_labels),
        allowed,
        second.hidden_share - first.hidden_share,
    )


def score_matrix(
    trace: Trace,
    layer: int,
    head: int,
    part: str,
    stack: str | None = None,
    hide_special: bool = False,
    window: slice | None = None,
) -> HeadMatrix:
    """Q K^T ("scores") or the softmax input ("scaled": scaled, biased, masked = -inf) on the shown tokens."""
    if part not in ("scores", "scaled"):
        raise ValueError(f"part must be 'scores' or 'scaled', got {part!r}")
    m = head_matrix(trace, layer, head, stack, hide_special, window)
    values = np.asarray(trace.block(part, layer, head, stack or trace.main_stack), dtype=np.float64)
    return HeadMatrix(
        values[np.ix_(m.queries, m.keys)], m.queries, m.keys, m.query_labels, m.key_labels, m.allowed, m.hidden_share
    )


def qkv(
    trace: Trace, layer: int, head: int, stack: str | None = None, positions: np.ndarray | None = None
) -> dict[str, tuple[np.ndarray, list[str], list[str]]]:
    """{"Q": (matrix [n, d_head], row labels, column labels), "K": ..., "V": ...} of one head.

    Q rows are the stack's queries, K and V rows its keys (they differ for cross-attention).
    `positions`: rows to keep (the same positions for queries and keys of self-attention).
    """
    stack = stack or trace.main_stack
    q_tokens, k_tokens = (display_tokens(t) for t in trace.tokens_for(stack))
    out = {}
    for name, part, labels in (("Q", "q", q_tokens), ("K", "k", k_tokens), ("V", "v", k_tokens)):
        m = np.asarray(trace.block(part, layer, head, stack))
        rows = np.arange(m.shape[0]) if positions is None else np.asarray(positions)
        rows = rows[rows < m.shape[0]]
        out[name] = (m[rows], [labels[i] for i in rows], [f"d{j + 1}" for j in range(m.shape[1])])
    return out


def peak_weights(trace: Trace, stack: str | None = None) -> np.ndarray:
    """[layers, heads]: the mean over queries of each row's largest weight (how sharply a head looks).

    For cross-attention, where a distance in tokens means nothing (queries and keys are two sentences).
    """
    stack = stack or trace.main_stack
    layers = range(trace.layers_in(stack))
    if not reduces_on_device(trace.device):
        return np.stack([trace.attention(layer, None, stack).max(-1).mean(-1) for layer in layers])
    with torch.inference_mode():  # every layer on the device; [layers, heads] comes to the host
        peaks = [trace.block_tensor("weights", layer, None, stack).float().amax(-1).mean(-1) for layer in layers]
        grid = torch.stack(peaks)
    return to_host([grid])[0].astype(np.float64)


# ---- head view -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadView:
    """Lines from each query (left) to the keys it attends to (right), one colour per head.

    lines: head, query, key (positions), y_query, y_key (rows on screen), weight.
    queries / keys: y, position, token, for the two columns of labels.
    threshold: the smallest weight drawn (raised above `min_weight` when there were too many lines).
    """

    lines: pd.DataFrame
    queries: pd.DataFrame
    keys: pd.DataFrame
    heads: tuple[int, ...]
    threshold: float
    hidden_share: float  # mean share of attention on hidden tokens, over the heads and queries drawn


def head_view(
    trace: Trace,
    layer: int,
    heads: Sequence[int],
    stack: str | None = None,
    hide_special: bool = False,
    window: slice | None = None,
    focus: int | None = None,
    min_weight: float = HEAD_VIEW_MIN_WEIGHT,
    max_lines: int = HEAD_VIEW_MAX_LINES,
) -> HeadView:
    """Data of the head view of `layer` for the chosen `heads`.

    window: rows of the shown tokens to draw (long inputs); focus: draw only the lines of the
    query at this input position. At most `max_lines` lines: the strongest ones.
    """
    heads = tuple(sorted({int(h) % trace.n_heads for h in heads}))
    m = head_matrix(trace, layer, None, stack, hide_special, window)
    w = m.weights[list(heads)] if heads else np.zeros((0, len(m.queries), len(m.keys)))
    keep = w >= min_weight
    if focus is not None:
        keep &= (m.queries == focus)[None, :, None]
    hi, qi, ki = np.nonzero(keep)
    values = w[hi, qi, ki]
    threshold = float(min_weight)
    if len(values) > max_lines:
        order = np.argsort(-values, kind="stable")[:max_lines]
        threshold = float(values[order[-1]])
        hi, qi, ki, values = hi[order], qi[order], ki[order], values[order]
    lines = pd.DataFrame(
        {
            "head": np.asarray(heads, dtype=np.int64)[hi] if heads else np.zeros(0, np.int64),
            "query": m.queries[qi],
            "key": m.keys[ki],
            "y_query": qi,
            "y_key": ki,
            "weight": values,
            "query_token": np.asarray(m.query_labels, dtype=object)[qi],
            "key_token": np.asarray(m.key_labels, dtype=object)[ki],
        }
    )
    queries = pd.DataFrame({"y": np.arange(len(m.queries)), "query": m.queries, "token": list(m.query_labels)})
    keys = pd.DataFrame({"y": np.arange(len(m.keys)), "key": m.keys, "token": list(m.key_labels)})
    share = float(m.hidden_share[list(heads)].mean()) if heads and m.hidden_share.size else 0.0
    return HeadView(lines, queries, keys, heads, threshold, share)


# ---- predictions --------------------------------------------------------------------------------------
def top_predictions(trace: Trace, k: int = 5, position: int | None = None) -> list[tuple[str, float]]:
    """Top-k (token as shown, probability) from the model's own head at `position` (see Trace.predictions)."""
    before = trace.tokens if position is None else trace.tokens[: position + 1]
    return [(display_next(before, label), p) for label, p in trace.predictions(k, position)]


def prediction_kind(trace: Trace) -> str | None:
    """ "next-token" (decoder-only), "masked-word" (an encoder with a masked-LM head), "classification" (a
    sequence classifier: one set of labels for the whole input), or None (no head)."""
    if not trace.has_head:
        return None
    if trace.meta.head == "classification":
        return "classification"
    return "next-token" if trace.kind == "decoder" else "masked-word" if trace.kind == "encoder" else None


def class_scores(trace: Trace) -> tuple[list[tuple[str, float]], str]:
    """A sequence classifier's labels with their scores, highest first, and what the scores are: "probability"
    (a softmax over the labels), "probability of each label" (multi-label: a sigmoid each, they need not sum
    to 1) or "score" (a regression head's number)."""
    how = trace.meta.probabilities
    name = {"sigmoid": "probability of each label", "none": "score"}.get(how, "probability")
    return tc_class_scores(trace), name


@dataclass(frozen=True)
class FirstTokenAttention:
    """Where the first token ([CLS] / <s>, the one a classifier reads) looks in one layer: weights [heads, n]."""

    weights: np.ndarray
    layer: int
    head_labels: tuple[str, ...]
    token_labels: tuple[str, ...]

    @property
    def token(self) -> str:
        return self.token_labels[0]


def first_token_view(trace: Trace, layer: int = -1) -> FirstTokenAttention:
    """The first token's attention in `layer` (default the last), every head: what a sequence classifier's
    token gathered before the head read it."""
    layer = layer % trace.n_layers
    w = np.asarray(tc_first_token_attention(trace, layer), dtype=np.float64)
    labels = tuple(display_tokens(trace.tokens_for()[1]))
    return FirstTokenAttention(w, layer, tuple(f"head {h}" for h in range(w.shape[0])), labels)


# ---- how much text the page reads ---------------------------------------------------------------------
PAGE_MAX_TOKENS = 512  # the page traces at most this many tokens (smollm2 reads 8,192: 0.5 MB of trace per token)


class _Limited:
    """What `fit_to_model` reads of a model (its tokenizer, kind and maximum), with a lower maximum."""

    def __init__(self, model: TracedModel, limit: int) -> None:
        self.tokenizer: Tokenizer | None = model.tokenizer
        self.kind: str = model.kind
        self.max_tokens: int | None = limit


def fit_text(model: TracedModel, text: str, pair: str | None = None, limit: int = PAGE_MAX_TOKENS) -> FittedInput:
    """`text` (and `pair`) cut to what the model reads, and to at most `limit` tokens (see tc.fit_to_model:
    ValueError for an empty input). FittedInput.max_tokens is the limit applied."""
    most = model.token_limit
    if most is not None and most <= limit:
        return fit_to_model(model, text, pair)
    return fit_to_model(_Limited(model, limit), text, pair)
