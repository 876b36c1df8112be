"""What the text-attention views show, computed from a `Trace`: no Streamlit here.

Every function takes a trace and a stack name ("encoder", "decoder", or "cross" for the
cross-attention of an encoder-decoder model; None means the trace's main stack), so the
Text attention page and an encoder-decoder page draw from the same code.

    fitted = fit_to_model(model, text)                 # truncated to the model's maximum, with a count
    trace = model.trace(fitted.text)
    m = head_matrix(trace, layer=2, head=5, hide_special=True)
    chart = head_view_chart(head_view(trace, 2, heads=[0, 5]))
    picture = overview(trace)                          # one PNG of every layer x head, thumbnails <= 64 px
    why = why_this_weight(trace, 2, 5, query=7)        # q, every k_j, q.k_j, scale, softmax, sum_j w_j v_j
    distance_frame(trace)                              # mean |i - j| per layer and head, in tokens

Hiding special tokens ([CLS], [SEP], <s>, </s>, BOS...) drops their rows and columns and
renormalises every remaining row to sum to 1: the views then show how a token shares the attention
it gives to real words. The share that went to the hidden tokens is reported beside them (in BERT
it is often most of it), so nothing is hidden silently.
"""

from __future__ import annotations

import io
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from tformer_core.metrics import mean_token_distance
from tformer_core.trace import Trace

from .charts.spec import channel, layered, named_data

DEFAULT_SENTENCE = "The animal didn't cross the street because it was too tired."

# Labels that mark sequence boundaries rather than words (BERT, RoBERTa/BART, GPT-2, the toy models).
# [MASK] is a word slot, not a boundary: it is never hidden.
SPECIAL_TOKENS = frozenset(
    {"[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>", "<|endoftext|>", "<bos>", "<eos>", "<cls>", "<sep>"}
)

# Detail views (head view, heatmap, Q/K/V) draw every cell as data: beyond this many tokens they show
# a window of the input, so a 512-token input does not send megabytes of chart data per view.
MAX_DETAIL_TOKENS = 64
THUMBNAIL_PX = 64  # the largest side of one head's thumbnail in the overview picture
HEAD_VIEW_MAX_LINES = 6000  # the head view draws at most this many lines (the strongest ones)
HEAD_VIEW_MIN_WEIGHT = 0.01  # lines below this weight are invisible anyway (opacity = weight)

# One colour per head, the same in every view (Tableau 20: distinct enough for 16 heads).
HEAD_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#c7c7c7",
    "#dbdb8d",
    "#9edae5",
)
MASKED_RGB = (187, 187, 187)  # grey, as charts.heatmap draws masked cells
# Viridis at ten evenly spaced stops; the lookup table interpolates between them.
_VIRIDIS_STOPS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)


# ---- models and inputs ---------------------------------------------------------------------------
class FittedInput(NamedTuple):
    """Text (and second segment) cut so the model can read it; counts in tokens, special tokens included."""

    text: str
    pair: str | None
    n_tokens: int  # tokens the model reads
    n_dropped: int  # tokens cut off the end(s) of the input
    max_tokens: int | None  # the model's maximum (None: no limit)


def text_model_problem(model: Any) -> str | None:
    """Why `model` cannot be shown on a page for encoder and decoder-only text models, or None when it can."""
    kind = getattr(model, "kind", "")
    name = getattr(model, "source", "") or "this model"
    if kind == "encoder-decoder":
        return (
            f"**{name}** is an encoder-decoder (translation / summarisation) model: its encoder, decoder and "
            "cross-attention are shown on the encoder-decoder page."
        )
    if kind == "vit":
        return f"**{name}** is a Vision Transformer: it reads images, not text. Open the Vision Transformer page."
    if kind not in ("encoder", "decoder"):
        return f"**{name}** is a {kind or 'model of an unknown kind'}, not an encoder or decoder-only text model."
    if getattr(model, "tokenizer", None) is None:
        return f"**{name}** has no tokenizer, so it cannot read text."
    return None


# verbose=False: a Hugging Face tokenizer otherwise warns that a long input exceeds the model, which is
# exactly what these functions are measuring.
def _count(tokenizer: Any, text: str, pair: str | None) -> int:
    """Tokens the model will see, special tokens included: the ids the core's trace() builds."""
    if callable(tokenizer):
        return len(tokenizer(text, pair, verbose=False)["input_ids"])
    return len(tokenizer.encode(text))


def _content_count(tokenizer: Any, text: str) -> int:
    if callable(tokenizer):
        return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    return len(tokenizer.encode(text))


def _cut_points(tokenizer: Any, text: str) -> list[int]:
    """Character offsets where a token ends (fast tokenizers), else where a word ends."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = encoded["offset_mapping"]
        points = sorted({int(end) for _, end in offsets if end > 0})
    except Exception:  # slow or custom tokenizers have no offsets: cut between words
        points = [i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()]
    if not points or points[-1] != len(text):
        points.append(len(text))
    return points


def _prefix(tokenizer: Any, text: str, keep: int) -> str:
    """The longest prefix of `text` cut at a token end that tokenizes to at most `keep` tokens."""
    if keep <= 0:
        return ""
    points = _cut_points(tokenizer, text)
    lo, hi = 0, min(len(points), keep + 1)  # the k-th token end covers about k tokens
    best = ""
    while lo < hi:  # binary search: token counts grow with the prefix
        mid = (lo + hi) // 2
        candidate = text[: points[mid]]
        if _content_count(tokenizer, candidate) <= keep:
            best, lo = candidate, mid + 1
        else:
            hi = mid
    return best.rstrip()


def _split_budget(budget: int, n_a: int, n_b: int) -> tuple[int, int]:
    """Longest first (as BERT's tokenizers truncate pairs): cut the longer segment until both fit."""
    if n_a + n_b <= budget:
        return n_a, n_b
    short = min(n_a, n_b)
    if short <= budget // 2:
        return (n_a, budget - n_a) if n_a == short else (budget - n_b, n_b)
    return budget - budget // 2, budget // 2


def fit_to_model(model: Any, text: str, pair: str | None = None) -> FittedInput:
    """`text` (and `pair`, BERT's sentence B) cut at a token boundary so the whole input fits the model.

    Decoder-only models take no second segment (it is ignored). Raises ValueError for an empty
    sentence. n_dropped counts the tokens cut off, so the page can say so.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the sentence is empty: type at least one word")
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("this model has no tokenizer, so it cannot read text")
    pair = pair if (pair and pair.strip() and getattr(model, "kind", "") == "encoder") else None
    text = text.strip()
    pair = pair.strip() if pair else None
    limit = getattr(model.config, "max_positions", None)
    total = _count(tokenizer, text, pair)
    if limit is None or total <= limit:
        return FittedInput(text, pair, total, 0, limit)
    n_a = _content_count(tokenizer, text)
    n_b = _content_count(tokenizer, pair) if pair is not None else 0
    budget = limit - (total - n_a - n_b)  # room left after [CLS], [SEP]...
    if budget < (2 if pair is not None else 1):
        raise ValueError(f"this model reads at most {limit} tokens, too few for this input")
    for _ in range(8):  # re-tokenizing a cut text can merge pieces differently: shrink until it fits
        keep_a, keep_b = _split_budget(budget, n_a, n_b)
        cut_a = _prefix(tokenizer, text, keep_a)
        cut_b = _prefix(tokenizer, pair, keep_b) if pair is not None else None
        if cut_a and (pair is None or cut_b):
            n = _count(tokenizer, cut_a, cut_b)
            if n <= limit:
                return FittedInput(cut_a, cut_b, n, total - n, limit)
            budget -= n - limit
        else:
            budget -= 1
    raise ValueError(f"this input cannot be cut to the model's {limit} tokens")


def local_model_folders(dirs: Sequence[Path] | None = None) -> list[str]:
    """Model folders (with a config.json) directly inside the configured model folders, as paths."""
    from tformer_core.checkpoints.sources import model_dirs

    found = []
    for root in dirs if dirs is not None else model_dirs():
        root = Path(root)
        if (root / "config.json").is_file():
            found.append(str(root))
        if root.is_dir():
            try:
                found += sorted(str(p) for p in root.iterdir() if (p / "config.json").is_file())
            except OSError:
                continue
    return found[:100]


def mask_token(model: Any) -> str | None:
    """The text that marks a word to guess ("[MASK]", "<mask>") when the model has a masked-word head."""
    if getattr(model, "kind", "") != "encoder" or not getattr(model.config, "mlm_head", False):
        return None
    return getattr(getattr(model, "tokenizer", None), "mask_token", None)


# ---- tokens ----------------------------------------------------------------------------------------
def display_token(token: str) -> str:
    """A token as shown: byte-level BPE / sentencepiece space markers become a visible space '␣'."""
    token = str(token).replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "↵")
    return token if token else "∅"


def display_tokens(tokens: Sequence[str]) -> list[str]:
    return [display_token(t) for t in tokens]


_MARKDOWN_SPECIAL = set("\\`*_{}[]()<>#+-.!|~$&")


def escape_markdown(text: str) -> str:
    """User text made safe inside st.markdown: every markdown / HTML character backslash-escaped."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in str(text))


def visible_positions(tokens: Sequence[str], hide_special: bool) -> np.ndarray:
    """Positions shown: all, or all but the special tokens (int array)."""
    keep = [i for i, t in enumerate(tokens) if not (hide_special and t in SPECIAL_TOKENS)]
    return np.asarray(keep if keep else range(len(tokens)), dtype=np.int64)


def token_window(n: int, start: int, size: int = MAX_DETAIL_TOKENS) -> slice:
    """Positions [start, start + size) clipped to n tokens (detail views of long inputs)."""
    start = int(min(max(start, 0), max(n - size, 0)))
    return slice(start, min(n, start + size))


# ---- one layer ---------------------------------------------------------------------------------------
def _stack(trace: Trace, stack: str | None) -> str:
    return stack or trace.main_stack


def allowed_mask(trace: Trace, layer: int, stack: str | None = None) -> np.ndarray | None:
    """[n_q, n_k] bool, False where the mask forbids attending (causal, padding); None when unmasked."""
    try:
        return np.asarray(trace.block("mask", layer, None, _stack(trace, stack))[0], dtype=bool)
    except KeyError:
        return None


def _renormalise(w: np.ndarray, kept_total: np.ndarray) -> np.ndarray:
    return np.divide(w, kept_total, out=np.zeros_like(w), where=kept_total > 0)


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

    def for_heatmap(self) -> np.ndarray:
        """The weights with forbidden cells as -inf (charts.heatmap draws them grey, labelled -inf)."""
        if self.allowed is None:
            return self.weights
        return np.where(self.allowed, self.weights, -np.inf)

    def window(self, rows: slice, cols: slice | None = None) -> "HeadMatrix":
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
) -> HeadMatrix:
    """The attention weights of `head` (None: every head) in `layer` of `stack`, special tokens hidden or not.

    window: which of the shown tokens to return (rows and columns); rows are renormalised over all
    shown keys first, so a window is a piece of the full matrix, not a matrix of its own.
    """
    return _head_matrix(trace, layer, head, stack, hide_special, window, widen=True)


def _head_matrix(
    trace: Trace, layer: int, head: int | None, stack: str | None, hide_special: bool, window: slice | None, widen: bool
) -> HeadMatrix:
    """head_matrix; widen=False keeps the stored float32 weights when nothing is renormalised (no copy)."""
    stack = _stack(trace, stack)
    q_tokens, k_tokens = trace.tokens_for(stack)
    queries, keys = visible_positions(q_tokens, hide_special), visible_positions(k_tokens, hide_special)
    if window is not None:
        queries = queries[window]
    w = trace.attention(layer, head, stack)  # float32, read-only; index before widening to float64
    rows = w if len(queries) == w.shape[-2] else w[..., queries, :]
    if len(keys) < len(k_tokens):
        kept = rows[..., keys].astype(np.float64)
        total = kept.sum(-1, keepdims=True)
        hidden = np.clip(1.0 - total[..., 0], 0.0, 1.0)
        kept = _renormalise(kept, total)
        if window is not None:
            kept, keys = kept[..., window], keys[window]
    else:
        if window is not None:
            keys = keys[window]
        kept = rows if len(keys) == w.shape[-1] else rows[..., keys]
        kept = kept.astype(np.float64) if widen else kept
        hidden = np.zeros(kept.shape[:-1])
    allowed = allowed_mask(trace, layer, stack)
    if allowed is not None:
        allowed = allowed[np.ix_(queries, keys)]
    labels_q, labels_k = display_tokens(q_tokens), display_tokens(k_tokens)
    return HeadMatrix(
        kept, queries, keys, tuple(labels_q[i] for i in queries), tuple(labels_k[i] for i in keys), allowed, hidden
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
    values = np.asarray(trace.block(part, layer, head, _stack(trace, stack)), dtype=np.float64)
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
    stack = _stack(trace, stack)
    q_tokens, k_tokens = (display_tokens(t) for t in trace.tokens_for(stack))
    out = {}
    for name, part, labels in (("Q", "q", q_tokens), ("K", "k", k_tokens), ("V", "v", k_tokens)):
        m = np.asarray(trace.block(part, layer, head, stack))
        rows = np.arange(m.shape[0]) if positions is None else np.asarray(positions)
        rows = rows[rows < m.shape[0]]
        out[name] = (m[rows], [labels[i] for i in rows], [f"d{j}" for j in range(m.shape[1])])
    return out


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


def head_colour_scale(n_heads: int) -> dict:
    return {"domain": list(range(n_heads)), "range": [HEAD_COLOURS[h % len(HEAD_COLOURS)] for h in range(n_heads)]}


def head_view_chart(view: HeadView, n_heads: int, title: str = "", row_px: int = 18) -> dict:
    """Head view (Vega-Lite): hover a query token (left) to see only its lines; opacity = weight."""
    n = max(len(view.queries), len(view.keys), 1)
    left_x, right_x, width = 150, 450, 600
    y_scale = {"domain": [-0.5, n - 0.5], "reverse": True, "nice": False, "zero": False}  # first token on top
    datasets: dict[str, Any] = {}
    focused = {"param": "focus", "empty": True}
    lines = {
        "data": named_data(view.lines, datasets),
        "mark": {"type": "rule", "strokeWidth": 2},
        "encoding": {
            "x": {"value": left_x},
            "x2": {"value": right_x},
            "y": channel("y_query", "quantitative", scale=y_scale, axis=None),
            "y2": {"field": "y_key"},
            "color": channel("head", "nominal", scale=head_colour_scale(n_heads), title="head"),
            "opacity": {
                "condition": {
                    **focused,
                    **channel("weight", "quantitative", legend=None, scale={"domain": [0, 1], "range": [0, 1]}),
                },
                "value": 0.0,
            },
            "tooltip": [
                channel("query_token", "nominal", title="query"),
                channel("key_token", "nominal", title="key"),
                channel("head", "nominal", title="head"),
                channel("weight", "quantitative", format=".3f", title="weight"),
            ],
        },
    }
    query_labels = {
        "name": "query_tokens",
        "data": named_data(view.queries, datasets),
        "mark": {"type": "text", "align": "right", "baseline": "middle", "dx": -6, "fontSize": 12},
        "encoding": {
            "x": {"value": left_x},
            "y": channel("y", "quantitative", scale=y_scale, axis=None),
            "text": channel("token", "nominal"),
            "opacity": {"condition": {**focused, "value": 1.0}, "value": 0.35},
            "tooltip": [channel("token", "nominal", title="query"), channel("query", "quantitative", title="position")],
        },
    }
    key_labels = {
        "data": named_data(view.keys, datasets),
        "mark": {"type": "text", "align": "left", "baseline": "middle", "dx": 6, "fontSize": 12},
        "encoding": {
            "x": {"value": right_x},
            "y": channel("y", "quantitative", scale=y_scale, axis=None),
            "text": channel("token", "nominal"),
            "tooltip": [channel("token", "nominal", title="key"), channel("key", "quantitative", title="position")],
        },
    }
    focus = {
        "name": "focus",
        "views": ["query_tokens"],
        "select": {"type": "point", "fields": ["query"], "on": "pointerover", "clear": "pointerout"},
    }
    return layered([lines, query_labels, key_labels], datasets, title, width=width, height=row_px * n, params=[focus])


# ---- overview: every layer x head as one picture --------------------------------------------------------
def block_mean(a: np.ndarray, size: int = THUMBNAIL_PX) -> np.ndarray:
    """Average [..., n_q, n_k] over blocks so that neither side exceeds `size` (no change when it fits).

    Blocks are ceil(n / size) positions wide; the last block of a side may be narrower, and is
    averaged over the positions it has.
    """
    out = np.asarray(a)
    for axis in (-2, -1):
        n = out.shape[axis]
        b = -(-n // size)
        if b == 1:
            continue
        m = -(-n // b)
        pad = [(0, 0)] * out.ndim
        pad[axis] = (0, m * b - n)
        padded = np.pad(out, pad) if m * b != n else out
        if axis == -2:
            summed = padded.reshape(*padded.shape[:-2], m, b, padded.shape[-1]).sum(-2, dtype=np.float64)
            counts = np.minimum(b, n - np.arange(m) * b)[:, None]
        else:
            summed = padded.reshape(*padded.shape[:-1], m, b).sum(-1, dtype=np.float64)
            counts = np.minimum(b, n - np.arange(m) * b)
        out = summed / counts
    return np.asarray(out, dtype=np.float64)


def viridis_lut() -> np.ndarray:
    """[256, 3] uint8 viridis colours (interpolated between ten stops)."""
    stops = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in _VIRIDIS_STOPS], dtype=np.float64)
    x = np.linspace(0, 1, len(stops))
    t = np.linspace(0, 1, 256)
    return np.stack([np.interp(t, x, stops[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


_LUT = viridis_lut()


def colourise(thumb: np.ndarray) -> np.ndarray:
    """[h, w] values (NaN = masked) -> [h, w, 3] uint8: viridis scaled to the thumbnail's own maximum."""
    finite = np.isfinite(thumb)
    top = float(thumb[finite].max()) if finite.any() else 0.0
    scaled = np.where(finite, thumb, 0.0) / top if top > 0 else np.zeros(thumb.shape)
    rgb = _LUT[np.clip(np.rint(scaled * 255), 0, 255).astype(np.int64)]
    rgb[~finite] = MASKED_RGB
    return rgb


@dataclass(frozen=True)
class Overview:
    """Every head of every layer as one PNG picture.

    thumbs: [layers, heads, m_q, m_k] block-averaged weights (NaN where every cell is masked);
    block: tokens per thumbnail pixel before upscaling; zoom: screen pixels per thumbnail pixel
    (short inputs are enlarged to about THUMBNAIL_PX); origin: top-left pixel of thumbnail (0, 0).
    """

    png: bytes
    thumbs: np.ndarray
    block: int
    zoom: int
    origin: tuple[int, int]
    gap: int
    n_tokens: tuple[int, int]
    hidden_share: np.ndarray = field(repr=False)  # [layers, heads] mean share of attention on hidden tokens

    @property
    def cell_px(self) -> tuple[int, int]:
        """(height, width) of one thumbnail on screen, in pixels."""
        return self.thumbs.shape[-2] * self.zoom, self.thumbs.shape[-1] * self.zoom

    def box(self, layer: int, head: int) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) pixels of one thumbnail in the picture (PIL crop box)."""
        h, w = self.cell_px
        left = self.origin[0] + head * (w + self.gap)
        top = self.origin[1] + layer * (h + self.gap)
        return left, top, left + w, top + h


def overview_thumbnails(
    trace: Trace, stack: str | None = None, hide_special: bool = False, size: int = THUMBNAIL_PX
) -> tuple[np.ndarray, np.ndarray, int]:
    """([layers, heads, m_q, m_k] block means of the shown weights, [layers, heads] hidden share, block size).

    One layer at a time, so a 512-token, 12 x 12 model never holds all its weights twice.
    Blocks in which every cell is masked are NaN (drawn grey).
    """
    stack = _stack(trace, stack)
    thumbs, shares = [], []
    for layer in range(trace.layers_in(stack)):
        m = _head_matrix(trace, layer, None, stack, hide_special, None, widen=False)
        thumb = block_mean(m.weights, size)
        if m.allowed is not None:
            thumb = np.where(block_mean(m.allowed.astype(np.float64), size) > 0, thumb, np.nan)
        thumbs.append(thumb)
        shares.append(m.hidden_share.mean(-1))
    n_tokens = max(len(m.queries), len(m.keys))
    return np.stack(thumbs), np.stack(shares), -(-n_tokens // size)


def _font(size: int = 11) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow built without FreeType: the bitmap font takes no size
        return ImageFont.load_default()


def overview(
    trace: Trace, stack: str | None = None, hide_special: bool = False, size: int = THUMBNAIL_PX, gap: int = 3
) -> Overview:
    """The layers x heads overview as one PNG: rows are layers, columns heads, each thumbnail <= `size` px.

    Each thumbnail is coloured on its own scale (viridis, 0 = dark, its largest weight = yellow):
    the point is the pattern of each head, which a shared scale would hide for diffuse heads.
    """
    stack = _stack(trace, stack)
    thumbs, shares, block = overview_thumbnails(trace, stack, hide_special, size)
    n_layers, n_heads, mq, mk = thumbs.shape
    zoom = max(1, size // max(mq, mk))
    ch, cw = mq * zoom, mk * zoom
    left, top = 34, 16
    width = left + n_heads * (cw + gap)
    height = top + n_layers * (ch + gap)
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    for layer in range(n_layers):
        for head in range(n_heads):
            rgb = colourise(thumbs[layer, head])
            if zoom > 1:
                rgb = rgb.repeat(zoom, 0).repeat(zoom, 1)
            y0, x0 = top + layer * (ch + gap), left + head * (cw + gap)
            canvas[y0 : y0 + ch, x0 : x0 + cw] = rgb
    image = Image.fromarray(canvas)
    draw, font = ImageDraw.Draw(image), _font()
    for head in range(n_heads):
        draw.text((left + head * (cw + gap) + cw // 2, top // 2), f"H{head}", fill=(60, 60, 60), font=font, anchor="mm")
    for layer in range(n_layers):
        y = top + layer * (ch + gap) + ch // 2
        draw.text((left - 4, y), f"L{layer}", fill=(60, 60, 60), font=font, anchor="rm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    q_tokens, k_tokens = trace.tokens_for(stack)
    n_q = len(visible_positions(q_tokens, hide_special))
    n_k = len(visible_positions(k_tokens, hide_special))
    return Overview(buffer.getvalue(), thumbs, block, zoom, (left, top), gap, (n_q, n_k), shares)


def head_grid_chart(
    values: np.ndarray,
    selected: tuple[int, int] | None = None,
    title: str = "",
    value_title: str = "value",
    cell_px: int = 22,
) -> dict:
    """A clickable layers x heads grid (Vega-Lite; selection parameter "cell" with fields layer, head)."""
    values = np.asarray(values, dtype=np.float64)
    layers, heads = np.meshgrid(np.arange(values.shape[0]), np.arange(values.shape[1]), indexing="ij")
    frame = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "value": values.ravel()})
    chosen = (
        frame.iloc[0:0] if selected is None else frame[(frame["layer"] == selected[0]) & (frame["head"] == selected[1])]
    )
    x, y = channel("head", "ordinal", title="head"), channel("layer", "ordinal", title="layer")
    datasets: dict[str, Any] = {}
    cells = {
        "name": "cells",
        "data": named_data(frame, datasets),
        "mark": {"type": "rect", "stroke": "white", "strokeWidth": 1},
        "encoding": {
            "x": x,
            "y": y,
            "color": channel("value", "quantitative", scale={"scheme": "blues"}, title=value_title),
            "tooltip": [
                channel("layer", "ordinal", title="layer"),
                channel("head", "ordinal", title="head"),
                channel("value", "quantitative", format=".2f", title=value_title),
            ],
        },
    }
    outline = {
        "data": named_data(chosen.reset_index(drop=True), datasets),
        "mark": {"type": "rect", "fill": None, "stroke": "#d62728", "strokeWidth": 2.5},
        "encoding": {"x": x, "y": y},
    }
    cell = {"name": "cell", "views": ["cells"], "select": {"type": "point", "fields": ["layer", "head"], "on": "click"}}
    return layered(
        [cells, outline],
        datasets,
        title,
        width=cell_px * values.shape[1],
        height=cell_px * values.shape[0],
        params=[cell],
    )


def clicked_cell(event: Any, param: str = "cell") -> tuple[int, int] | None:
    """(layer, head) from a chart selection event ({"selection": {param: [{"layer": l, "head": h}]}}), or None."""
    try:
        points = event["selection"][param]
    except (KeyError, TypeError, IndexError):
        return None
    if isinstance(points, Mapping):  # interval-like payload {"layer": [...], "head": [...]}
        points = [points]
    for point in points or []:
        try:
            layer, head = point["layer"], point["head"]
            layer = layer[0] if isinstance(layer, (list, tuple)) else layer
            head = head[0] if isinstance(head, (list, tuple)) else head
            return int(layer), int(head)
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return None


# ---- why this weight ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WhyWeight:
    """Every number behind row `query` of one head's attention, from the trace's own Q, K and V.

    q: [d_head]; k, v: [n_k, d_head]; dots = k q: [n_k] (q . k_j); scale: 1/sqrt(d_k) (1 for T5);
    bias: [n_k] added to the scaled scores (T5's relative position bias) or None; allowed: [n_k],
    False where the mask forbids, or None; logits: the softmax input, -inf where masked; weights:
    softmax(logits) in float64; z = sum_j weights_j v_j: [d_head]. stored_weights and stored_z
    are what the model computed (float32), to compare with.
    """

    query: int
    query_label: str
    key_labels: tuple[str, ...]
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dots: np.ndarray
    scale: float
    bias: np.ndarray | None
    allowed: np.ndarray | None
    logits: np.ndarray
    weights: np.ndarray
    z: np.ndarray
    stored_weights: np.ndarray
    stored_z: np.ndarray

    @property
    def exps(self) -> np.ndarray:
        """exp(logit_j - max logit): the softmax numerators (the shift cancels in the ratio)."""
        finite = np.isfinite(self.logits)
        top = self.logits[finite].max() if finite.any() else 0.0
        return np.where(finite, np.exp(np.where(finite, self.logits, top) - top), 0.0)

    def table(self) -> pd.DataFrame:
        """One row per key: token, q.k_j, times the scale, + bias, softmax input, exp, weight, |v_j|, |w_j v_j|."""
        frame = {"key": list(self.key_labels), "q·k": self.dots, "× 1/√d_k": self.dots * self.scale}
        if self.bias is not None:
            frame["+ bias"] = self.bias
        frame["softmax input"] = self.logits
        frame["exp(input − max)"] = self.exps
        frame["weight"] = self.weights
        frame["‖v_j‖"] = np.linalg.norm(self.v, axis=1)
        frame["‖w_j·v_j‖"] = self.weights * frame["‖v_j‖"]
        out = pd.DataFrame(frame)
        if self.allowed is not None:
            out.insert(1, "allowed", self.allowed)
        return out

    def products(self, key: int) -> pd.DataFrame:
        """q, k_j and their elementwise product per dimension: the terms of q . k_j."""
        return pd.DataFrame(
            {"q": self.q, "k_j": self.k[key], "q × k_j": self.q * self.k[key]},
            index=[f"d{i}" for i in range(len(self.q))],
        )

    def max_errors(self) -> tuple[float, float]:
        """(max |weights - stored weights|, max |z - stored z|): how well the recomputation matches."""
        weights = float(np.max(np.abs(self.weights - self.stored_weights)))
        return weights, float(np.max(np.abs(self.z - self.stored_z)))


def why_this_weight(trace: Trace, layer: int, head: int, query: int, stack: str | None = None) -> WhyWeight:
    """Recompute row `query` of (layer, head) from the trace's Q, K, V in float64: see WhyWeight."""
    stack = _stack(trace, stack)
    q_tokens, k_tokens = trace.tokens_for(stack)
    if not 0 <= query < len(q_tokens):
        n = len(q_tokens)
        raise ValueError(f"query position {query} is out of range: the input has {n} tokens (0..{n - 1})")
    q = np.asarray(trace.q(layer, head, stack)[query], dtype=np.float64)
    k = np.asarray(trace.k(layer, head, stack), dtype=np.float64)
    v = np.asarray(trace.v(layer, head, stack), dtype=np.float64)
    dots = k @ q
    scale = float(trace.meta.get("attention_scale", 1.0))
    logits = dots * scale
    bias = None
    position_bias = trace.activations.get(f"{'decoder' if stack == 'cross' else stack}.position_bias")
    if position_bias is not None and stack != "cross":  # T5 biases self-attention only
        bias = np.asarray(position_bias[head % trace.n_heads, query], dtype=np.float64)
        logits = logits + bias
    allowed = allowed_mask(trace, layer, stack)
    allowed = None if allowed is None else allowed[query]
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    finite = np.isfinite(logits)
    weights = np.zeros_like(logits)
    if finite.any():
        e = np.exp(logits[finite] - logits[finite].max())
        weights[finite] = e / e.sum()
    return WhyWeight(
        query,
        display_token(q_tokens[query]),
        tuple(display_tokens(k_tokens)),
        q,
        k,
        v,
        dots,
        scale,
        bias,
        allowed,
        logits,
        weights,
        weights @ v,
        np.asarray(trace.attention(layer, head, stack)[query], dtype=np.float64),
        np.asarray(trace.block("z", layer, head, stack)[query], dtype=np.float64),
    )


# ---- attention distance ----------------------------------------------------------------------------------
def distance_frame(trace: Trace, stack: str | None = None, hide_special: bool = False) -> pd.DataFrame:
    """Mean attention distance in tokens per layer and head (tc.mean_token_distance of the shown weights).

    Columns: layer, head, distance. With hidden special tokens, distances are over the shown
    tokens with renormalised rows (positions counted among the shown tokens).
    """
    stack = _stack(trace, stack)
    rows = []
    for layer in range(trace.layers_in(stack)):
        d = mean_token_distance(_head_matrix(trace, layer, None, stack, hide_special, None, widen=False).weights)
        rows += [(layer, head, float(d[head])) for head in range(len(d))]
    return pd.DataFrame(rows, columns=["layer", "head", "distance"])


def uniform_distance(trace: Trace, stack: str | None = None, hide_special: bool = False) -> float:
    """The mean distance of uniform attention over the keys each query may see (layer 0's mask)."""
    m = head_matrix(trace, 0, 0, stack, hide_special)
    allowed = np.ones(m.weights.shape, dtype=bool) if m.allowed is None else m.allowed
    counts = allowed.sum(-1, keepdims=True)
    uniform = np.divide(allowed, counts, out=np.zeros(allowed.shape), where=counts > 0)
    return float(mean_token_distance(uniform))


def distance_chart(
    frame: pd.DataFrame,
    baseline: float,
    n_heads: int,
    selected: tuple[int, int] | None = None,
    title: str = "",
    unit: str = "tokens",
) -> dict:
    """Scatter (Vega-Lite): x layer, y mean distance (in `unit`), one dot per head; a dashed rule at the uniform
    baseline. As the ViT paper draws it (Fig. 7, right) for pixels."""
    frame = frame.copy()
    frame["chosen"] = False
    if selected is not None:
        frame["chosen"] = (frame["layer"] == selected[0]) & (frame["head"] == selected[1])
    y = channel("distance", "quantitative", title=f"mean attention distance ({unit})")
    datasets: dict[str, Any] = {}
    dots = {
        "data": named_data(frame, datasets),
        "mark": {"type": "circle", "opacity": 0.85},
        "encoding": {
            "x": channel("layer", "quantitative", title="layer", axis={"tickMinStep": 1, "format": "d"}),
            "y": y,
            "color": channel("head", "nominal", scale=head_colour_scale(n_heads), title="head"),
            "size": {"condition": {"test": "datum.chosen", "value": 180}, "value": 60},
            "tooltip": [
                channel("layer", "quantitative", title="layer"),
                channel("head", "nominal", title="head"),
                channel("distance", "quantitative", format=".2f", title=f"distance ({unit})"),
            ],
        },
    }
    base = named_data(pd.DataFrame({"distance": [baseline], "label": [f"uniform attention: {baseline:.2f}"]}), datasets)
    rule = {"data": base, "mark": {"type": "rule", "strokeDash": [6, 4], "color": "#555"}, "encoding": {"y": y}}
    text = {
        "data": base,
        "mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "color": "#555"},
        "encoding": {"y": y, "x": {"value": 0}, "text": channel("label", "nominal")},
    }
    return layered([dots, rule, text], datasets, title, width=480, height=280)


# ---- predictions --------------------------------------------------------------------------------------
def top_predictions(trace: Trace, k: int = 5, position: int | None = None) -> list[tuple[str, float]]:
    """Top-k (token as shown, probability) from the model's own head at `position` (see Trace.predictions)."""
    return [(display_token(label.replace(" ", "Ġ")), p) for label, p in trace.predictions(k, position)]


def prediction_kind(trace: Trace) -> str | None:
    """ "next-token" (decoder-only), "masked-word" (an encoder with a masked-LM head), or None (no head)."""
    if "head.logits" not in trace.activations:
        return None
    return "next-token" if trace.kind == "decoder" else "masked-word" if trace.kind == "encoder" else None


# ---- derived values kept with their trace -----------------------------------------------------------
# A trace is immutable, so what is derived from it only once (the overview picture, the distance table)
# can live as long as the trace does: keyed weakly, it goes when the app's trace cache drops the trace.
_derived: "weakref.WeakKeyDictionary[Trace, dict]" = weakref.WeakKeyDictionary()
_derived_lock = threading.Lock()


def derived(trace: Trace, key: tuple, compute: Callable[[], Any]) -> Any:
    """compute() once per (trace, key); later calls with the same trace and key return the same object."""
    with _derived_lock:
        store = _derived.setdefault(trace, {})
        if key in store:
            return store[key]
    value = compute()
    with _derived_lock:
        return _derived.setdefault(trace, {}).setdefault(key, value)
