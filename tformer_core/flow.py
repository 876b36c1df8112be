"""Information flow to a prediction (Ferrando & Voita 2024, "Information flow routes"), from one traced pass.

    flow = information_flow(model, trace)            # every update's parts and their shares, every layer
    flow.attention.blocks[l, i, j]                   # share of source j (all heads) in position i's update at l
    flow.top_head[l, i, j]                           # the head with the largest share of that edge
    information_flow(model, trace, keep_heads=True).heads.blocks[l, i, j, h]   # the whole split by (j, h)
    flow.ffn.blocks[l, i, 0], flow.ffn.residual[l, i]   # the FFN's share, the residual's, at (l, i)
    graph = flow_graph(flow, threshold=0.04)         # edges above it that lead to the prediction
    graph.edges[0].layer, .source, .target, .share, .head
    held = flow_rollout(flow)                        # [2L + 1, T]: every route followed back, no threshold
    edges_into(flow)                                 # every attention edge into the prediction, unpruned

Each residual update is a sum of parts. At layer l and position i the attention block writes

    resid_after_attn_i = x_i + sum_j sum_h w^h_ij (v^h_j W_O^h) + b_O

with v^h_j the value (b_V included) that query head h reads (grouped-query attention: head h reads key/value
head h // group). The parts are the residual x_i, one vector per source position j (summed over heads, or one
per (j, h) pair: the per-head split), and the output bias b_O. The FFN writes resid_post_i = resid_after_attn_i +
FFN_i: two parts, the residual and the FFN's output (its biases inside). A part's share is its proximity to the
whole, as the LLM Transparency Tool defines it,

    proximity(part) = max(0, ||whole||_p - ||whole - part||_p),   share = proximity / sum of the parts' proximities

with p = 1 (the L1 norm, the tool's and the paper's default; p = 2 is offered). The shares of one update sum to
1. A part that points along the whole and is as long gets a large share; one that is small, or points away
(whole - part longer than whole), gets little or none. A share is not what removing the part would change (that
is activation patching, one pass per edge): it is read from this one pass.

Post-norm models (BERT, MiniLM: x <- LN(x + f(x))) normalise each sum. There the LayerNorm's divisor
sqrt(var(u) + eps) of the real sum u = x + f(x) is frozen at its value in this pass; the norm is then affine, and
each part is centred, divided by it and multiplied by gamma, with the norm's beta as a part of its own. The
parts then sum exactly to the residual stream after the norm, which is what the next layer reads. Pre-norm
models (GPT-2, Llama, ViT) add to the stream without a norm in between: their parts are the raw vectors.

The graph (`flow_graph`) has a node per residual state: level 0 the input embeddings, level 2l + 1 the stream
after layer l's attention, 2l + 2 after its FFN, one node per position at each level. An attention edge goes
from (2l, j) to (2l + 1, i), the residual edges from (2l, i) to (2l + 1, i) and (2l + 1, i) to (2l + 2, i),
the FFN edge from (2l + 1, i) to (2l + 2, i). The biases and beta have no source node and no edge. Edges whose
share exceeds the threshold are kept when they lead, through kept edges, to the prediction's node (the last
level at the prediction position). Covers encoders, decoder-only models and ViTs (the class token's
prediction) run by the core's own modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .models.base import TracedModel
from .models.weights import NormWeights
from .trace import Trace, to_host

__all__ = [
    "Flow",
    "FlowEdge",
    "FlowGraph",
    "UpdateParts",
    "UpdateShares",
    "attention_parts",
    "edges_into",
    "ffn_parts",
    "flow_graph",
    "flow_rollout",
    "information_flow",
    "proximity",
    "proximity_shares",
]

# Elements of one chunk of per-head parts ([rows, T, heads, d_model]): a long input is split by query rows so that
# the per-head parts never take more than this many numbers at once (64 MB in float32).
CHUNK_ELEMENTS = 1 << 24
KINDS = ("encoder", "decoder", "vit")


@dataclass(frozen=True, eq=False)
class UpdateParts:
    """The vectors that sum to the residual stream after one update (one layer's attention or FFN), torch.

    blocks: attention by source [T, T, D] (position i, source j), by head [T, T, h, D]; FFN [T, 1, D].
    residual [T, D]: x_i, the stream before the update. bias [T, D]: attention's b_O (zeros for the FFN, whose
    biases are inside its output). beta [T, D]: a post-norm's beta (zeros for pre-norm). Post-norm parts are
    centred, divided by the frozen divisor of each position and multiplied by gamma (module docstring).
    whole [T, D]: the residual stream after the update as the trace holds it; `total()` equals it.
    """

    blocks: torch.Tensor
    residual: torch.Tensor
    bias: torch.Tensor
    beta: torch.Tensor
    whole: torch.Tensor

    def total(self) -> torch.Tensor:
        """The parts summed [T, D]: the whole, up to rounding."""
        return self.blocks.flatten(1, -2).sum(1) + self.residual + self.bias + self.beta


@dataclass(frozen=True, eq=False)
class UpdateShares:
    """Each part's share of one kind of update at every layer and position, numpy float64; per (l, i) the shares
    sum to 1 (0 everywhere where every proximity is 0). blocks [L, T, ...] (as UpdateParts.blocks without D),
    residual, bias, beta [L, T]."""

    blocks: np.ndarray
    residual: np.ndarray
    bias: np.ndarray
    beta: np.ndarray

    def total(self) -> np.ndarray:
        """[L, T]: the shares summed per layer and position (1, or 0 where the update has no parts)."""
        return self.blocks.reshape(*self.residual.shape, -1).sum(-1) + self.residual + self.bias + self.beta


@dataclass(frozen=True, eq=False)
class Flow:
    """The shares of every update of one pass (module docstring). attention: by source position, blocks
    [L, T, T] (layer, position i, source j); ffn: blocks [L, T, 1]. top_head [L, T, T]: the head whose (source,
    head) part has the largest share of the per-head split of each edge (-1 everywhere when the flow was computed
    with top_heads=False, and in the rows left out when it names positions), top_head_share [L, T, T] that share
    (then 0);
    heads: the per-head split itself, blocks [L, T, T, h] (its own normalisation: it sums to 1 with its residual,
    bias and beta), kept only when asked (`information_flow(..., keep_heads=True)`: L x T^2 x h numbers), else
    None. tokens: the positions' labels; prediction: the position predicted (a decoder's last, an encoder's first
    [MASK] or [CLS], a ViT's class token); norm: "pre" or "post"; p: the norm of the proximity."""

    tokens: tuple[str, ...]
    stack: str
    norm: str
    p: int
    prediction: int
    attention: UpdateShares
    ffn: UpdateShares
    top_head: np.ndarray
    top_head_share: np.ndarray
    heads: UpdateShares | None = None

    @property
    def n_layers(self) -> int:
        return int(self.attention.blocks.shape[0])


@dataclass(frozen=True)
class FlowEdge:
    """One edge of the graph. kind: "attention" (source j -> position i through the layer's heads), "ffn", or
    "residual" (stage says which update it skips: "attn" or "ffn"). share: its share of the update at (layer,
    target). head: for an attention edge, the head with the largest share of it (Flow.top_head), else None (and
    None for every edge of a flow computed without the per-head split).
    head_share: that head's share in the per-head split (Flow.top_head_share), 0 for other edges.
    source_level, target_level: the nodes' levels (module docstring)."""

    kind: Literal["attention", "ffn", "residual"]
    stage: Literal["attn", "ffn"]
    layer: int
    source: int
    target: int
    share: float
    head: int | None = None
    head_share: float = 0.0

    @property
    def source_level(self) -> int:
        return 2 * self.layer + (0 if self.stage == "attn" else 1)

    @property
    def target_level(self) -> int:
        return self.source_level + 1


@dataclass(frozen=True, eq=False)
class FlowGraph:
    """The edges above `threshold` that lead to the prediction. nodes: the (level, position) pairs they touch,
    the prediction's node (2L, prediction) always among them; levels run 0..2L (module docstring)."""

    tokens: tuple[str, ...]
    n_layers: int
    prediction: int
    threshold: float
    edges: tuple[FlowEdge, ...]
    nodes: frozenset[tuple[int, int]]


def proximity(parts: torch.Tensor, whole: torch.Tensor, p: int = 1) -> torch.Tensor:
    """max(0, ||whole|| - ||whole - part||) in the norm p, for parts [N, P, D] of wholes [N, D]: [N, P]."""
    # cdist sums |whole - part| without building the difference (a copy of every part: the per-head parts are
    # the largest tensor of the flow); never through a matrix product, which would round ||w - x||^2 differently.
    distance = torch.cdist(whole[:, None], parts, p=p, compute_mode="donot_use_mm_for_euclid_dist")[:, 0]
    return (whole.norm(p=p, dim=-1)[:, None] - distance).clamp_min(0)


def proximity_shares(parts: torch.Tensor, whole: torch.Tensor, p: int = 1) -> torch.Tensor:
    """Shares of `parts` [N, P..., D] in `whole` [N, D]: max(0, ||whole|| - ||whole - part||) (norm p), divided by
    the sum over the P... parts of each of the N wholes; [N, P...], each row summing to 1 (0 where every part
    has proximity 0)."""
    if parts.dim() < 2 or parts.shape[0] != whole.shape[0] or parts.shape[-1] != whole.shape[-1]:
        raise ValueError(f"parts {tuple(parts.shape)} do not match the whole {tuple(whole.shape)}: [N, P..., D]")
    near = proximity(parts.reshape(parts.shape[0], -1, parts.shape[-1]), whole, p)
    return _normalised(near).view(parts.shape[:-1])


def _normalised(near: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
    """near [N, P] divided by each row's sum over near and `more` [N, Q]... (left at 0 where that sum is 0)."""
    total = near.sum(1) + sum((m.sum(1) for m in more), torch.zeros_like(near[:, 0]))
    return near / torch.where(total > 0, total, torch.ones_like(total))[:, None]


def _norm_placement(model: TracedModel) -> str:
    norm = getattr(model.config, "norm", None)
    if model.kind not in KINDS or norm not in ("pre", "post"):
        raise ValueError(
            f"information flow covers encoders, decoder-only models and ViTs run by the core's own modules; "
            f"this is a {model.kind} model"
        )
    return str(norm)


def _read(trace: Trace, name: str, dtype: torch.dtype) -> torch.Tensor:
    if name not in trace:
        raise ValueError(f"the trace does not hold {name!r}: trace with the residual stream and attention kept")
    return trace.tensor(name).to(dtype)


class _PostNorm:
    """A post-norm's affine map with its divisor frozen at the real sum's: f(P) = gamma (P - mean P) / sigma
    (LayerNorm; RMSNorm divides by the root mean square without centring); beta its own part."""

    def __init__(self, ln: NormWeights, whole_sum: torch.Tensor, dtype: torch.dtype) -> None:
        self.gamma = ln.w.to(whole_sum.device, dtype)
        self.centre = ln.kind == "layernorm"
        spread = whole_sum.var(-1, unbiased=False) if self.centre else whole_sum.pow(2).mean(-1)
        self.sigma = (spread + ln.eps).sqrt()  # [rows]
        beta = ln.b.to(whole_sum.device, dtype) if ln.b is not None else torch.zeros_like(self.gamma)
        self.beta = beta.expand_as(whole_sum)

    def __call__(self, part: torch.Tensor) -> torch.Tensor:
        """part [rows, ..., D] -> the same, normalised by each row's frozen divisor."""
        centred = part - part.mean(-1, keepdim=True) if self.centre else part
        sigma = self.sigma.view(-1, *(1,) * (part.dim() - 1))
        return centred / sigma * self.gamma


def attention_parts(
    model: TracedModel,
    trace: Trace,
    layer: int,
    by: Literal["source", "head"] = "source",
    rows: slice = slice(None),
    dtype: torch.dtype = torch.float32,
) -> UpdateParts:
    """The parts of layer `layer`'s attention update at the query positions `rows` (default: all), computed where
    the trace lives in `dtype`: blocks [rows, T, D] by source position, or [rows, T, h, D] by (source, head)."""
    norm = _norm_placement(model)
    stack = trace.main_stack
    prefix = f"{stack}.{layer}"
    w = model.weights(stack).block(layer)
    weights = _read(trace, f"{prefix}.attn.weights", dtype)[:, rows]  # [h, rows, T]
    v = _read(trace, f"{prefix}.attn.v", dtype)  # [h_kv, T, dh], b_V included
    v = v.repeat_interleave(w.attn.n_heads // v.shape[0], dim=0)  # [h, T, dh]: query head h reads h // group
    value_out = torch.einsum("hjd,hdm->hjm", v, w.attn.W_O.to(v.device, dtype))  # [h, T, D]: v^h_j W_O^h
    if by == "head":
        # A broadcast product, no sum, written straight into a contiguous [rows, T, h, D] as cdist reads it: left to
        # itself the product takes its inputs' head-major strides, and the reshape before cdist copied it again.
        w_ijh = weights.permute(1, 2, 0)[..., None]  # [rows, T, h, 1]
        v_jhm = value_out.transpose(0, 1)[None]  # [1, T, h, D]
        blocks = torch.empty(*w_ijh.shape[:3], v_jhm.shape[-1], dtype=dtype, device=v.device)
        torch.mul(w_ijh, v_jhm, out=blocks)
    elif by == "source":
        blocks = torch.einsum("hij,hjm->ijm", weights, value_out)  # [rows, T, D]
    else:
        raise ValueError(f"by must be 'source' or 'head', got {by!r}")
    residual = _read(trace, f"{prefix}.resid_pre", dtype)[rows]
    bias = w.attn.b_O.to(residual.device, dtype).expand_as(residual)
    whole = _read(trace, f"{prefix}.resid_after_attn", dtype)[rows]
    if norm == "pre":
        return UpdateParts(blocks, residual, bias, torch.zeros_like(residual), whole)
    ln = _PostNorm(w.ln_attn, residual + _read(trace, f"{prefix}.attn.out", dtype)[rows], dtype)
    return UpdateParts(ln(blocks), ln(residual), ln(bias), ln.beta, whole)


def ffn_parts(
    model: TracedModel, trace: Trace, layer: int, rows: slice = slice(None), dtype: torch.dtype = torch.float32
) -> UpdateParts:
    """The parts of layer `layer`'s FFN update at the positions `rows`: blocks [rows, 1, D] the FFN's output,
    residual the stream after attention (post-norm: both normalised with the frozen divisor)."""
    norm = _norm_placement(model)
    prefix = f"{trace.main_stack}.{layer}"
    residual = _read(trace, f"{prefix}.resid_after_attn", dtype)[rows]
    out = _read(trace, f"{prefix}.mlp.out", dtype)[rows]
    whole = _read(trace, f"{prefix}.resid_post", dtype)[rows]
    zeros = torch.zeros_like(residual)
    if norm == "pre":
        return UpdateParts(out[:, None], residual, zeros, zeros, whole)
    ln = _PostNorm(model.weights(trace.main_stack).block(layer).ln_mlp, residual + out, dtype)
    return UpdateParts(ln(out)[:, None], ln(residual), zeros, ln.beta, whole)


def _shares(parts: UpdateParts, p: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(blocks [rows, ...], residual, bias, beta [rows]): proximity_shares over every part of the update, the blocks
    and the three others apart (joined, the blocks would be copied once more)."""
    rows, d = parts.residual.shape
    blocks = proximity(parts.blocks.reshape(rows, -1, d), parts.whole, p)
    others = proximity(torch.stack([parts.residual, parts.bias, parts.beta], dim=1), parts.whole, p)  # [rows, 3]
    block_shares, other_shares = _normalised(blocks, others), _normalised(others, blocks)
    shape = parts.blocks.shape[1:-1]
    return block_shares.view(rows, *shape), other_shares[:, 0], other_shares[:, 1], other_shares[:, 2]


def _stacked(per_layer: Sequence[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    return [torch.stack([layer[k] for layer in per_layer]) for k in range(len(per_layer[0]))]


def _prediction(trace: Trace, position: int | None) -> int:
    if position is None:
        predicted = trace.meta.predict_position
        position = 0 if predicted is None else predicted  # [CLS], a ViT's class token
    return _checked_position(position, len(trace.tokens))


def information_flow(
    model: TracedModel,
    trace: Trace,
    p: int = 1,
    position: int | None = None,
    dtype: torch.dtype = torch.float32,
    keep_heads: bool = False,
    top_heads: bool | Sequence[int] = True,
) -> Flow:
    """Every attention edge's, FFN's and residual's share of its update, and each edge's top head, at every layer
    and position, from `trace` (one pass of `model`) and the model's W_O and norms; computed where the trace
    lives, in `dtype`, copied to the host once. position: the prediction the graph leads to (default: the
    trace's, else 0). p: 1 (L1, the paper's) or 2. keep_heads: keep the whole per-head split (Flow.heads).
    top_heads=False leaves the per-head split out (Flow.top_head -1, no edge has a head): it is the flow's largest
    cost (L x T^2 x h x d_model numbers), what a ViT's 197 tokens and more cannot afford on every picture; a
    sequence of positions splits only the edges into them (a ViT's class token: [0], L x T x h x d_model).
    Raises ValueError for an encoder-decoder, a model transformers runs, or a trace without the residual stream."""
    norm = _norm_placement(model)
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p!r}")
    if trace.kind != model.kind or trace.meta.query_start:
        raise ValueError("the trace must be one whole pass of this model (not a generation step)")
    if keep_heads and top_heads is not True:
        raise ValueError("keep_heads needs the whole per-head split, top_heads=True")
    n = len(trace.tokens)
    split_rows = None if isinstance(top_heads, bool) else [_checked_position(int(r), n) for r in top_heads]
    by_source, by_head, top, ffn = [], [], [], []
    with torch.inference_mode():
        for layer in range(trace.n_layers):
            by_source.append(_shares(attention_parts(model, trace, layer, "source", dtype=dtype), p))
            if top_heads is True:
                heads = _head_shares(model, trace, layer, p, dtype)
                best = heads[0].max(-1)  # over the heads: [T, T]
                top.append((best.indices.to(torch.int16), best.values))
            else:
                top.append(_top_heads_of_rows(model, trace, layer, p, dtype, split_rows or [], by_source[-1][0]))
            if keep_heads:
                by_head.append(heads)
            ffn.append(_shares(ffn_parts(model, trace, layer, dtype=dtype), p))
        tensors = _stacked(by_source) + _stacked(ffn) + _stacked(top) + (_stacked(by_head) if keep_heads else [])
    arrays = to_host(tensors)
    shares = [a.astype(np.float64) for a in arrays[:8]]
    return Flow(
        tokens=tuple(trace.tokens),
        stack=trace.main_stack,
        norm=norm,
        p=p,
        prediction=_prediction(trace, position),
        attention=UpdateShares(*shares[0:4]),
        ffn=UpdateShares(*shares[4:8]),
        top_head=arrays[8].astype(np.int64),
        top_head_share=arrays[9].astype(np.float64),
        heads=UpdateShares(*(a.astype(np.float64) for a in arrays[10:14])) if keep_heads else None,
    )


def _top_heads_of_rows(
    model: TracedModel, trace: Trace, layer: int, p: int, dtype: torch.dtype, rows: Sequence[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(top head [T, T] int16, its share [T, T]) of the per-head split in the given rows only; -1 and 0 elsewhere."""
    head, share = torch.full(like.shape, -1, dtype=torch.int16, device=like.device), torch.zeros_like(like)
    for row in rows:
        best = _shares(attention_parts(model, trace, layer, "head", slice(row, row + 1), dtype), p)[0].max(-1)
        head[row], share[row] = best.indices[0].to(torch.int16), best.values[0]
    return head, share


def _head_shares(model: TracedModel, trace: Trace, layer: int, p: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The per-head split's shares at one layer (as _shares), a chunk of query rows at a time: a long input's
    parts [rows, T, h, D] never take more than CHUNK_ELEMENTS numbers."""
    n = len(trace.tokens)
    d_model = trace.tensor(f"{trace.main_stack}.{layer}.resid_pre").shape[-1]
    chunk = max(1, CHUNK_ELEMENTS // max(1, n * trace.n_heads * d_model))
    pieces = [
        _shares(attention_parts(model, trace, layer, "head", slice(start, start + chunk), dtype), p)
        for start in range(0, n, chunk)
    ]
    return tuple(torch.cat(piece) for piece in zip(*pieces, strict=True))


def flow_graph(flow: Flow, threshold: float = 0.04, position: int | None = None) -> FlowGraph:
    """The edges whose share exceeds `threshold` (0 <= threshold <= 1) and that lead, through such edges, to the
    prediction at `position` (default: flow.prediction): walked backwards from the last level, one layer at a
    time, every position at once."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"the threshold is a share, between 0 and 1: got {threshold}")
    n, L = len(flow.tokens), flow.n_layers
    target = flow.prediction if position is None else _checked_position(position, n)
    alive = np.zeros((2 * L + 1, n), dtype=bool)
    alive[2 * L, target] = True
    edges: list[FlowEdge] = []
    for layer in reversed(range(L)):
        after = alive[2 * layer + 2]
        ffn_kept = after & (flow.ffn.blocks[layer, :, 0] > threshold)
        ffn_residual = after & (flow.ffn.residual[layer] > threshold)
        alive[2 * layer + 1] = ffn_kept | ffn_residual
        edges += _edges("ffn", "ffn", layer, ffn_kept, flow.ffn.blocks[layer, :, 0])
        edges += _edges("residual", "ffn", layer, ffn_residual, flow.ffn.residual[layer])
        middle = alive[2 * layer + 1]
        attended = middle[:, None] & (flow.attention.blocks[layer] > threshold)  # [i, j]
        attn_residual = middle & (flow.attention.residual[layer] > threshold)
        alive[2 * layer] = attended.any(0) | attn_residual
        for i, j in zip(*np.nonzero(attended), strict=True):
            share, head = float(flow.attention.blocks[layer, i, j]), int(flow.top_head[layer, i, j])
            top = float(flow.top_head_share[layer, i, j])
            edges.append(FlowEdge("attention", "attn", layer, int(j), int(i), share, head if head >= 0 else None, top))
        edges += _edges("residual", "attn", layer, attn_residual, flow.attention.residual[layer])
    nodes = (
        {(2 * L, target)} | {(e.source_level, e.source) for e in edges} | {(e.target_level, e.target) for e in edges}
    )
    return FlowGraph(flow.tokens, L, target, float(threshold), tuple(edges), frozenset(nodes))


def flow_rollout(flow: Flow, position: int | None = None) -> np.ndarray:
    """[2L + 1, T]: how much of the final residual stream at `position` (default flow.prediction) each node holds,
    every edge followed back by its share, no threshold: level 2L is 1 at the position and 0 elsewhere; a node
    holds the sum, over the edges it feeds, of the target's amount times the edge's share. This is attention
    rollout (Abnar & Zuidema 2020) with the flow's shares in place of the attention weights and the residual as
    one of them. The biases' and beta's shares have no source node: what they hold is lost, so each level sums
    to at most 1. Level 0 says how much of the prediction came from each input token (a ViT's patches: over the
    picture), level 2l what sits where just before layer l."""
    n, L = len(flow.tokens), flow.n_layers
    held = np.zeros((2 * L + 1, n))
    held[2 * L, flow.prediction if position is None else _checked_position(position, n)] = 1.0
    for layer in reversed(range(L)):
        # Both the FFN's edge and the residual's leave position i's stream after attention: the FFN reads only it.
        ffn = flow.ffn.blocks[layer, :, 0] + flow.ffn.residual[layer]
        held[2 * layer + 1] = held[2 * layer + 2] * ffn
        middle = held[2 * layer + 1]
        held[2 * layer] = middle @ flow.attention.blocks[layer] + middle * flow.attention.residual[layer]
    return held


def edges_into(flow: Flow, position: int | None = None) -> tuple[FlowEdge, ...]:
    """Every attention edge into `position` (default flow.prediction), at every layer and from every source, no
    threshold: L x T edges, layer by layer, with their top heads where the flow has them. A ViT's class token reads
    a little from each of ~200 patches, so that no single edge passes a graph's threshold: rank these instead."""
    n = len(flow.tokens)
    i = flow.prediction if position is None else _checked_position(position, n)
    edges = []
    for layer in range(flow.n_layers):
        for j in range(n):
            head = int(flow.top_head[layer, i, j])
            share, top = float(flow.attention.blocks[layer, i, j]), float(flow.top_head_share[layer, i, j])
            edges.append(FlowEdge("attention", "attn", layer, j, i, share, head if head >= 0 else None, top))
    return tuple(edges)


def _checked_position(position: int, n: int) -> int:
    if not -n <= position < n:
        raise ValueError(f"position {position} is outside the input ({n} positions)")
    return position % n


def _edges(kind, stage, layer: int, kept: np.ndarray, shares: np.ndarray) -> list[FlowEdge]:
    """The same-position edges (residual, FFN) kept at one layer and stage."""
    return [FlowEdge(kind, stage, layer, int(i), int(i), float(shares[i])) for i in np.nonzero(kept)[0]]
