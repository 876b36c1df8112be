"""Why this weight: the softmax input of one attention cell split exactly into a sources x sources table.

    trace = model.trace("The animal didn't cross the street because it was too tired.", keep=SOURCES_KEPT)
    s = score_sources(model, trace, Cell("encoder", layer=2, head=5, query=9, key=2))
    s.table                     # [query sources, key sources]: what each pair adds to the softmax input
    s.total, s.score, s.error   # the sum of every term, the model's own softmax input, |difference|
    s.query_totals, s.key_totals  # each query-side source's row of the table summed, each key-side one's column
    s.linear_weight_without("L1.H3")           # the softmax recomputed with that source's terms taken out
    remove_source(model, s, "L1.H3", text)     # the same source taken out of a real forward pass

The residual stream a query (or a key) is computed from is a sum of the parts that wrote it: the token embedding,
the position embedding (and BERT's segment embedding), every earlier head's output z_h W_O[h], every attention
layer's output bias b_O, every FFN's output (its bias included). A norm is not linear: it divides by the stream's
own spread. Here each norm's divisor (LayerNorm's sqrt(var + eps), RMSNorm's root mean square) is FROZEN at its value
in this pass; then the norm is linear (LayerNorm's mean-centring is linear too), each part passes through it on its
own, and its beta becomes one more part. A post-norm model (BERT, MiniLM, the original Transformer) normalises after
every sub-layer: every part goes through every later norm, and every norm's beta is a source. A pre-norm model
(GPT-2, Llama, ViT) normalises only what a sub-layer reads: the parts pass through the one norm before the
attention. Then q = x W_Q + b_Q and k = y W_K + b_K are sums of one projection per part (the projection biases are
sources of one side only), a rotary model turns each part's projection at its position (a rotation is linear), and

    softmax input = scale * q_i . k_j (+ T5's position bias) = sum over (query part a, key part b) of
                    scale * q_a . k_b  (+ the bias, a term of its own)

exactly, with the divisors frozen. A source's number is what it adds to this score given everything else; removing
it from a real pass also changes every later layer and every divisor, which `remove_source` runs to compare.

Names of the sources: "embed.tok" (a ViT's "embed.patch": the patch embedding, or the class token),
"embed.pos", "embed.segment", "embed.ln.beta", "L3.H5" (head 5 of layer 3), "L3.attn.b_O", "L3.ln_attn.beta",
"L3.mlp", "L3.ln_mlp.beta", "L3.b_Q" and "L3.b_K" (the attention read's own projection biases, of one head;
"L3.cross.b_Q" for cross-attention); an encoder-decoder's decoder also has "L3.cross.H2", "L3.cross.b_O",
"L3.ln_cross.beta", and its names start with "enc." or "dec." (cross-attention: queries from the decoder's stream,
keys from the encoder's output). Sources a model does not have (Llama's biases) are left out. The parts are read from
the trace's own tensors and summed, normalised and projected in float64; the heads' z W_O products are taken in the
model's dtype (at least float32), as the model took them. A float64 model's parts sum to its score within 1e-12.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from .capture import Edit, Hook, matching
from .errors import InputError
from .interventions import Head, ablate_heads
from .models.base import TracedModel
from .models.layers import BlockConfig
from .models.weights import AttentionWeights, NormWeights, StackWeights
from .trace import ATTENTION_STACKS, Trace

__all__ = ["SOURCES_KEPT", "Cell", "Removal", "ScoreSources", "SourceSite", "remove_source", "score_sources"]

# What `score_sources` reads from a trace: pass it as `keep` (a trace with everything stored works too).
SOURCES_KEPT = matching(
    "**.embed.tok",
    "**.embed.tokens",
    "**.embed.pos",
    "**.embed.segment",
    "**.attn.z",
    "**.cross_attn.z",
    "**.mlp.out",
    "**.attn.q",
    "**.attn.k",
    "**.cross_attn.q",
    "**.cross_attn.k",
    "**.attn.mask",
    "**.cross_attn.mask",
    "*.position_bias",
)
_CHUNK = 32  # key positions walked at once: the parts of a long input's stream are [sources, positions, d_model]


@dataclass(frozen=True)
class Cell:
    """One cell of one head's attention: stack "encoder", "decoder" or "cross" (as `trace.attention` names them),
    layer, query head, query position (the row) and key position (the column)."""

    stack: str
    layer: int
    head: int
    query: int
    key: int


@dataclass(frozen=True, eq=False)
class SourceSite:
    """Where a source enters the forward pass, and so how a real pass takes it out: at activation `hook`,
    `head` (a head's output: its z zeroed at every position), or `subtract` (a bias: this vector subtracted at every
    position, of head `head_index` only for a projection bias [B, h, T, dh]), else the whole activation zeroed (an
    embedding, an FFN's output)."""

    hook: str
    head: Head | None = None
    subtract: np.ndarray | None = None
    head_index: int | None = None

    def edits(self) -> list[Edit]:
        """The edits that take this source out of a pass (`model.trace(..., edits=...)`)."""
        if self.head is not None:
            return ablate_heads([self.head])
        if self.subtract is None:
            return [Edit(self.hook, lambda x, hook: torch.zeros_like(x))]
        vector, index = torch.as_tensor(self.subtract), self.head_index

        def take_out(x: torch.Tensor, hook: Hook) -> torch.Tensor:
            out = x.clone()
            if index is None:
                return out - vector.to(x.device, x.dtype)
            out[:, index] -= vector.to(x.device, x.dtype)  # (B, h, T, dh): one head's slice
            return out

        return [Edit(self.hook, take_out)]


@dataclass(frozen=True, eq=False)
class ScoreSources:
    """One cell's softmax input split into sources (module docstring), float64.

    table [query sources, key sources]: scale * q_a . k_b, what each pair adds to the softmax input; bias: T5's
    relative position bias at the cell (0 without one), a term of its own. score: the model's softmax input at
    the cell, from its stored q_i and k_j; weight: the model's attention weight there. q_parts [query sources,
    d_head], k_parts [key sources, keys, d_head]: each source's share of q_i and of every key (rotated where the
    model rotates), from which the row's scores without a source are recomputed; row_bias [keys] or None; allowed
    [keys], False where the mask hides a key, or None. sites: where each source enters the pass.
    """

    cell: Cell
    query_label: str
    key_label: str
    query_sources: tuple[str, ...]
    key_sources: tuple[str, ...]
    table: np.ndarray
    bias: float
    score: float
    weight: float
    scale: float
    q_parts: np.ndarray
    k_parts: np.ndarray
    row_bias: np.ndarray | None
    allowed: np.ndarray | None
    sites: Mapping[str, SourceSite]

    @property
    def total(self) -> float:
        """Every term summed: the table and the bias. Equals `score` up to float rounding of the model's pass."""
        return float(self.table.sum() + self.bias)

    @property
    def error(self) -> float:
        """|total - score|: how far the sum of the parts is from the model's own softmax input."""
        return abs(self.total - self.score)

    @property
    def query_totals(self) -> np.ndarray:
        """[query sources]: each query-side source's row of the table summed (what it adds through q_i)."""
        return self.table.sum(axis=1)

    @property
    def key_totals(self) -> np.ndarray:
        """[key sources]: each key-side source's column summed (what it adds through k_j)."""
        return self.table.sum(axis=0)

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source of either side, once: query side first, then the key side's others."""
        return tuple(dict.fromkeys(self.query_sources + self.key_sources))

    def row_scores_without(self, name: str | None = None) -> np.ndarray:
        """[keys] the query's softmax inputs over every key, recomputed from the parts with source `name` taken out
        of both sides (None: nothing taken out; the divisors stay frozen); -inf where the mask hides a key."""
        if name is not None and name not in self.sites:
            raise InputError(f"no source {name!r} in this cell; its sources are {', '.join(self.sources)}")
        q = self.q_parts.sum(axis=0) - (
            self.q_parts[self.query_sources.index(name)] if name in self.query_sources else 0
        )
        k = self.k_parts.sum(axis=0) - (self.k_parts[self.key_sources.index(name)] if name in self.key_sources else 0)
        scores = self.scale * (k @ q) + (self.row_bias if self.row_bias is not None else 0.0)
        return scores if self.allowed is None else np.where(self.allowed, scores, -np.inf)

    def linear_weight_without(self, name: str | None = None) -> float:
        """The cell's weight from the softmax of `row_scores_without(name)`: the linear prediction of removing it."""
        scores = self.row_scores_without(name)
        top = scores.max()
        exps = np.exp(scores - top)
        return float(exps[self.cell.key] / exps.sum())


@dataclass(frozen=True)
class Removal:
    """One source taken out. weight: the model's weight at the cell; linear_weight: the softmax recomputed with
    the source's terms removed (divisors and every other part unchanged); real_weight: the weight a real forward
    pass without the source gives; linear_score, real_score: the cell's softmax input in each."""

    name: str
    weight: float
    linear_weight: float
    real_weight: float
    linear_score: float
    real_score: float


class _Parts:
    """The residual stream at some positions as named parts, each [positions, d_model] float64."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.values: list[np.ndarray] = []
        self.sites: dict[str, SourceSite] = {}

    def add(self, name: str, value: np.ndarray, site: SourceSite) -> None:
        self.names.append(name)
        self.values.append(value)
        self.sites[name] = site

    def add_bias(self, name: str, vector: torch.Tensor | None, n: int, site_hook: str) -> None:
        """A bias vector [D] added at every position; left out when the model has none (all zeros)."""
        if vector is None:
            return
        b = vector.detach().double().cpu().numpy()
        if np.any(b):
            self.add(name, np.broadcast_to(b, (n, b.shape[0])), SourceSite(site_hook, subtract=b))

    def normed(self, norm: NormWeights) -> None:
        """Every part through `norm` with its divisor frozen at the sum's (its beta is added by the caller)."""
        x = np.stack(self.values)  # [S, P, D]
        total = x.sum(axis=0)
        if norm.kind == "layernorm":
            divisor = np.sqrt(total.var(axis=-1, keepdims=True) + norm.eps)
            x = x - x.mean(axis=-1, keepdims=True)
        else:
            divisor = np.sqrt((total * total).mean(axis=-1, keepdims=True) + norm.eps)
        self.values = list(x * (norm.w.double().cpu().numpy() / divisor))


def _f64(trace: Trace, name: str, positions: np.ndarray, axis: int = 0) -> np.ndarray:
    if name not in trace.activations:
        raise ValueError(f"the trace does not hold {name!r}: trace with keep=score_sources.SOURCES_KEPT")
    return np.take(np.asarray(trace[name], dtype=np.float64), positions, axis=axis)


def _embedding(trace: Trace, w: StackWeights, stack: str, positions: np.ndarray, p: str) -> _Parts:
    parts = _Parts()
    vision = w.patch is not None
    tok = f"{stack}.embed.tokens" if vision else f"{stack}.embed.tok"
    parts.add(f"{p}embed.patch" if vision else f"{p}embed.tok", _f64(trace, tok, positions), SourceSite(tok))
    for kind in ("segment", "pos"):
        name = f"{stack}.embed.{kind}"
        if name in trace.activations:
            parts.add(f"{p}embed.{kind}", _f64(trace, name, positions), SourceSite(name))
    if w.embed_ln is not None:  # BERT: LayerNorm over the embeddings' sum
        parts.normed(w.embed_ln)
        parts.add_bias(f"{p}embed.ln.beta", w.embed_ln.b, len(positions), f"{stack}.embed.out")
    return parts


def _after_norm(parts: _Parts, norm: NormWeights, name: str, hook: str, n: int) -> None:
    parts.normed(norm)
    parts.add_bias(name, norm.b, n, hook)


def _add_attention(
    parts: _Parts, trace: Trace, attn: AttentionWeights, stack: str, layer: int, sub: str, p: str, pos: np.ndarray
) -> None:
    """Every head's z W_O[h] and the output bias, as parts. The products are taken in the model's dtype (at least
    float32: a float32 model computed them so, and torch's batched product is fast there), then summed in float64."""
    z = trace.tensor(f"{stack}.{layer}.{sub}.z")[:, torch.as_tensor(pos)]  # [h, P, dh]
    work = torch.promote_types(z.dtype, torch.float32)
    with torch.inference_mode():
        written = torch.matmul(z.to(work), attn.W_O.to(z.device, work)).double().cpu().numpy()  # [h, P, D]
    cross = sub == "cross_attn"
    label = f"{p}L{layer}.cross" if cross else f"{p}L{layer}"
    head_stack = "cross" if cross else stack
    for h in range(written.shape[0]):
        parts.add(f"{label}.H{h}", written[h], SourceSite(f"{stack}.{layer}.{sub}.z", head=Head(head_stack, layer, h)))
    parts.add_bias(f"{label}.b_O" if cross else f"{label}.attn.b_O", attn.b_O, len(pos), f"{stack}.{layer}.{sub}.out")


def _stream(
    model: TracedModel, trace: Trace, stack: str, pos: np.ndarray, read: tuple[int, str] | None, p: str
) -> _Parts:
    """The residual stream of `stack` at positions `pos` as parts, as the sub-layer `read` = (layer, "attn" or
    "cross_attn") reads it (through its norm in a pre-norm model); read None: the stack's output."""
    w = model.weights(stack)
    config = model.config
    pre = isinstance(config, BlockConfig) and config.norm == "pre"
    parts, n = _embedding(trace, w, stack, pos, p), len(pos)
    for layer in range(w.n_layers):
        block = w.block(layer)
        subs = [
            ("attn", block.attn, block.ln_attn, "ln_attn"),
            ("cross_attn", block.cross_attn, block.ln_cross, "ln_cross"),
        ]
        for sub, attn, ln, ln_name in subs:
            if attn is None or ln is None:
                continue
            if read == (layer, sub):
                if pre:
                    _after_norm(parts, ln, f"{p}L{layer}.{ln_name}.beta", f"{stack}.{layer}.{ln_name}", n)
                return parts
            _add_attention(parts, trace, attn, stack, layer, sub, p, pos)
            if not pre:
                _after_norm(parts, ln, f"{p}L{layer}.{ln_name}.beta", f"{stack}.{layer}.{ln_name}", n)
        mlp = f"{stack}.{layer}.mlp.out"
        parts.add(f"{p}L{layer}.mlp", _f64(trace, mlp, pos), SourceSite(mlp))
        if not pre:
            _after_norm(parts, block.ln_mlp, f"{p}L{layer}.ln_mlp.beta", f"{stack}.{layer}.ln_mlp", n)
    if read is not None:
        raise ValueError(f"the {stack} has no {read[1]} in layer {read[0]}")
    if w.ln_final is not None:
        _after_norm(parts, w.ln_final, f"{p}ln_final.beta", f"{stack}.out", n)
    return parts


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [..., dh] turned as `positional.apply_rotary` turns it: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    return x * cos + np.concatenate((-x[..., half:], x[..., :half]), axis=-1) * sin


def _projected(
    parts: _Parts, W: torch.Tensor, b: torch.Tensor, bias_name: str, site: SourceSite
) -> tuple[list[str], np.ndarray]:
    """(names, [S, P, dh]): each part times W [D, dh], with the projection's bias b [dh] as a part of its own."""
    names = list(parts.names)
    stacked = np.stack(parts.values)  # [S, P, D]
    W64 = W.double().cpu().numpy()
    projected = (stacked.reshape(-1, stacked.shape[-1]) @ W64).reshape(*stacked.shape[:2], W64.shape[1])  # [S, P, dh]
    bias = b.detach().double().cpu().numpy()
    if np.any(bias):
        names.append(bias_name)
        projected = np.concatenate([projected, np.broadcast_to(bias, (1, *projected.shape[1:]))])
        parts.sites[bias_name] = site
    return names, projected


def _check(model: TracedModel, trace: Trace, cell: Cell) -> None:
    if not model.capabilities.weights:
        raise InputError("this model runs through transformers: its weights cannot be read, so its scores not split")
    if cell.stack not in trace.attention_stacks:
        raise InputError(f"this {trace.kind} trace has no {cell.stack!r} attention; it has {trace.attention_stacks}")
    if trace.meta.query_start:
        raise InputError("a generation step's trace holds its new token only: split a full pass's scores")
    n_q, n_k = (len(t) for t in trace.tokens_for(cell.stack))
    if not (0 <= cell.query < n_q and 0 <= cell.key < n_k):
        raise InputError(f"cell ({cell.query}, {cell.key}) is outside the {n_q} x {n_k} attention")


def _model_row(trace: Trace, cell: Cell) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, float]:
    """(the model's softmax inputs of the query's row [keys] from its stored q and k, the bias row, the allowed row,
    the model's weight at the cell)."""
    q = np.asarray(trace.block("q", cell.layer, cell.head, cell.stack), dtype=np.float64)[cell.query]
    k = np.asarray(trace.block("k", cell.layer, cell.head, cell.stack), dtype=np.float64)
    bias = trace.attention_bias(cell.layer, cell.head, cell.stack)
    row_bias = None if bias is None else np.asarray(bias, dtype=np.float64)[cell.query]
    mask_name = f"{ATTENTION_STACKS[cell.stack].format(layer=cell.layer)}.mask"
    allowed = np.asarray(trace[mask_name][0, cell.query], dtype=bool) if mask_name in trace.activations else None
    scores = trace.meta.attention_scale * (k @ q) + (row_bias if row_bias is not None else 0.0)
    weight = float(trace.attention(cell.layer, cell.head, cell.stack)[cell.query, cell.key])
    return scores, row_bias, allowed, weight


@dataclass(frozen=True)
class _Read:
    """How the cell's head reads the streams: which stacks give queries and keys, its weights, its rotation."""

    q_stack: str
    k_stack: str
    sub: str
    q_prefix: str
    k_prefix: str
    attn: AttentionWeights
    cos_sin: tuple[np.ndarray, np.ndarray] | None  # [T, dh] each, where the model rotates q and k


def _read(model: TracedModel, trace: Trace, cell: Cell, n_k: int) -> _Read:
    cross = cell.stack == "cross"
    q_stack, k_stack = ("decoder", "encoder") if cross else (cell.stack, cell.stack)
    sub = "cross_attn" if cross else "attn"
    two = trace.kind == "encoder-decoder"  # two streams: their sources are told apart by "enc." and "dec."
    q_prefix, k_prefix = (("dec.", "enc.") if cross else (f"{cell.stack[:3]}.",) * 2) if two else ("", "")
    block = model.weights(q_stack).block(cell.layer)
    attn = block.cross_attn if cross else block.attn
    if attn is None or attn.q_norm is not None:
        raise ValueError("this attention normalises q and k per head (Qwen3): its scores are not split here")
    rotary = model.stack(q_stack).rotary if attn.rotary else None
    cos_sin = None
    if rotary is not None:  # the model's own table, in float64
        cos, sin = rotary(max(n_k, cell.query + 1), 0, torch.float64)
        cos_sin = (cos[0, 0].cpu().numpy(), sin[0, 0].cpu().numpy())
    return _Read(q_stack, k_stack, sub, q_prefix, k_prefix, attn, cos_sin)


def _bias_site(hook: str, bias: torch.Tensor, head: int) -> SourceSite:
    return SourceSite(hook, subtract=bias.detach().double().cpu().numpy(), head_index=head)


def _sides(model: TracedModel, trace: Trace, cell: Cell, r: _Read, n_k: int):
    """(query source names, q parts [Sq, dh], key source names, k parts [Sk, keys, dh], every source's site)."""
    attn, kv = r.attn, r.attn.kv_head(cell.head)
    block = f"{r.q_stack}.{cell.layer}.{r.sub}"
    pre_rope = ".q_pre_rope" if attn.rotary else ".q"
    q_site = _bias_site(block + pre_rope, attn.b_Q[cell.head], cell.head)
    k_site = _bias_site(block + (".k_pre_rope" if attn.rotary else ".k"), attn.b_K[kv], kv)
    cross = r.sub == "cross_attn"
    own = f"{r.q_prefix}L{cell.layer}" + (".cross" if cross else "")  # the projections' biases are the read's
    k_read = None if cross else (cell.layer, r.sub)
    q_names: list[str] = []
    k_names: list[str] = []
    q_parts: np.ndarray | None = None
    chunks: list[np.ndarray] = []
    sites: dict[str, SourceSite] = {}
    if cross:  # the query reads the decoder's stream, the keys the encoder's output: two walks
        query = _stream(model, trace, r.q_stack, np.array([cell.query]), (cell.layer, r.sub), r.q_prefix)
        q_names, projected = _projected(query, attn.W_Q[cell.head], attn.b_Q[cell.head], own + ".b_Q", q_site)
        q_parts, sites = projected[:, 0], dict(query.sites)
    for start in range(0, n_k, _CHUNK):
        pos = np.arange(start, min(n_k, start + _CHUNK))
        keys = _stream(model, trace, r.k_stack, pos, k_read, r.k_prefix)
        if not cross and start <= cell.query < start + len(pos):  # self-attention: the query's stream is here
            query = _Parts()
            query.names, query.values = list(keys.names), [v[cell.query - start][None] for v in keys.values]
            query.sites = dict(keys.sites)
            q_names, projected = _projected(query, attn.W_Q[cell.head], attn.b_Q[cell.head], own + ".b_Q", q_site)
            q_parts = projected[:, 0]
            sites.update(query.sites)
        k_names, projected = _projected(keys, attn.W_K[kv], attn.b_K[kv], own + ".b_K", k_site)
        if r.cos_sin is not None:
            projected = _rotate(projected, r.cos_sin[0][pos], r.cos_sin[1][pos])
        chunks.append(projected)
        sites.update(keys.sites)
    if q_parts is None:
        raise ValueError(f"query {cell.query} is not among the {n_k} positions of its stream")
    if r.cos_sin is not None:
        q_parts = _rotate(q_parts, r.cos_sin[0][cell.query], r.cos_sin[1][cell.query])
    return q_names, q_parts, k_names, np.concatenate(chunks, axis=1), sites


def score_sources(model: TracedModel, trace: Trace, cell: Cell) -> ScoreSources:
    """Split the softmax input of `cell` into sources x sources (module docstring). `trace` is `model`'s trace of
    one input holding what SOURCES_KEPT names. InputError for a masked cell (its input is -inf, no sum of parts)."""
    _check(model, trace, cell)
    scores, row_bias, allowed, weight = _model_row(trace, cell)
    if allowed is not None and not allowed[cell.key]:
        raise InputError(f"cell ({cell.query}, {cell.key}) is masked: its softmax input is -inf and its weight 0")
    q_tokens, k_tokens = trace.tokens_for(cell.stack)
    r = _read(model, trace, cell, len(k_tokens))
    q_names, q_parts, k_names, k_parts, sites = _sides(model, trace, cell, r, len(k_tokens))
    scale = trace.meta.attention_scale
    return ScoreSources(
        cell,
        q_tokens[cell.query],
        k_tokens[cell.key],
        tuple(q_names),
        tuple(k_names),
        scale * (q_parts @ k_parts[:, cell.key].T),
        0.0 if row_bias is None else float(row_bias[cell.key]),
        float(scores[cell.key]),
        weight,
        scale,
        q_parts,
        k_parts,
        row_bias,
        allowed,
        sites,
    )


def remove_source(model: TracedModel, sources: ScoreSources, name: str, *inputs: Any, **options: Any) -> Removal:
    """Take source `name` out of a real forward pass of `inputs` (what `model.trace` takes: the text, the ids, the
    picture, the source and target sentences; `options` its keywords, such as `pair`) where it enters, at every
    position (a head's z zeroed, an embedding or an FFN's output zeroed, a bias subtracted), and read the cell's
    weight and softmax input there, beside the linear prediction (`ScoreSources.linear_weight_without`)."""
    if name not in sources.sites:
        raise InputError(f"no source {name!r} in this cell; its sources are {', '.join(sources.sources)}")
    cell = sources.cell
    block = ATTENTION_STACKS[cell.stack].format(layer=cell.layer)
    keep = matching(f"{block}.q", f"{block}.k", f"{block}.mask", "*.position_bias")
    run = cast("Callable[..., Trace]", model.trace)  # every kind with attention traces one input
    edited = run(*inputs, keep=keep, edits=sources.sites[name].edits(), **options)
    real = edited.block("scaled", cell.layer, cell.head, cell.stack)[cell.query, cell.key]
    real_weight = edited.attention(cell.layer, cell.head, cell.stack)[cell.query, cell.key]
    return Removal(
        name,
        sources.weight,
        sources.linear_weight_without(name),
        float(real_weight),
        float(sources.row_scores_without(name)[cell.key]),
        float(real),
    )
