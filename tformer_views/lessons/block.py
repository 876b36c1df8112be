"""The logic behind "Inside a block": one token through one layer of a real model, every number kept.

    layout = block_layout(model, "encoder")             # post- or pre-norm, LayerNorm or RMSNorm, d_ff, ...
    walk = block_walk(model, trace, "encoder", layer=2, token=3)
    walk.sublayers[0].norm.mean, walk.sublayers[-1].ffn.hidden, walk.max_difference
    norms = stream_norms(trace, "encoder")              # the residual stream's size, layer by layer

The walk starts from what enters the block (`{stack}.{layer}.resid_pre` in the trace) and recomputes
everything after it in float64 from the model's own weights: attention (queries of the chosen token,
keys and values of every token, the trace's mask), Add & Norm, the feed-forward network, Add & Norm.
Its result is compared with the model's own next-layer input (the residual stream the model computed
in float32), and every intermediate with the trace's tensor of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from tformer_core.attention import attend_float64
from tformer_core.block_steps import FFNSteps, LayerNormSteps, RMSNormSteps, ffn_steps, layer_norm_steps, rms_norm_steps
from tformer_core.capture import matching
from tformer_core.errors import InputError
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import CausalLM, EncoderModel
from tformer_core.models.layers import BlockConfig
from tformer_core.models.weights import AttentionWeights, NormWeights
from tformer_core.trace import Trace, to_host, to_numpy

from ..seq2seq import Translation, translate
from ..tokens import display_tokens
from ..vision import VisionResult, analyse
from .attention import as_factor, fmt, tex

__all__ = [
    "ACTIVATION_NAMES",
    "EXAMPLE_BETA",
    "EXAMPLE_EPS",
    "EXAMPLE_GAMMA",
    "EXAMPLE_TOKENS",
    "EXAMPLE_X",
    "NORM_NAMES",
    "NORM_QUANTITIES",
    "SUBLAYERS",
    "TRACE_PARTS",
    "AttentionRow",
    "BlockLayout",
    "BlockWalk",
    "FlowNode",
    "StreamNorms",
    "SubLayerWalk",
    "attention_row",
    "block_layout",
    "block_read",
    "block_walk",
    "dims_labels",
    "eps_problem",
    "example_norm_inputs",
    "ffn_formula",
    "ffn_rows",
    "flow_nodes",
    "norm_formulas",
    "norm_rows",
    "norm_summary",
    "normalized_formula",
    "output_formula",
    "stacks_of",
    "stream_norms",
    "strongest_keys",
    "token_labels",
    "trace_image",
    "trace_text",
    "trace_translation",
    "vectors_frame",
    "walk_vectors",
    "written_mean",
    "written_output",
    "written_rms",
    "written_row",
    "written_variance",
]

NORM_NAMES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh approximation)", "silu": "SiLU"}
SUBLAYERS = {"attn": "self-attention", "cross": "cross-attention", "mlp": "feed-forward network"}
# The trace's name of what each sub-layer adds, its norm's output and the residual stream after it.
TRACE_PARTS = {
    "attn": ("attn.out", "ln_attn", "resid_after_attn"),
    "cross": ("cross_attn.out", "ln_cross", "resid_after_cross"),
    "mlp": ("mlp.out", "ln_mlp", "resid_post"),
}


# ---- the block's shape ---------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockLayout:
    """How a model's blocks are built, read from its config.

    norm: "post" (x <- Norm(x + f(x)): BERT, the original Transformer) or "pre" (x <- x + f(Norm(x)):
    GPT-2, ViT, T5). cross: the stack's blocks have cross-attention (an encoder-decoder's decoder).
    """

    stack: str
    norm: str
    norm_type: str
    activation: str
    d_model: int
    d_ff: int
    n_heads: int
    d_head: int
    eps: float
    cross: bool
    gated: bool
    causal: bool
    attention_recomputed: bool = True

    @property
    def norm_name(self) -> str:
        return NORM_NAMES[self.norm_type]

    @property
    def parts(self) -> tuple[str, ...]:
        """The sub-layers in order: "attn", ("cross",) "mlp"."""
        return ("attn", "cross", "mlp") if self.cross else ("attn", "mlp")


def stacks_of(model: TracedModel) -> tuple[str, ...]:
    """The stacks a model has: ("encoder",), ("decoder",) or ("encoder", "decoder")."""
    return {"encoder-decoder": ("encoder", "decoder"), "decoder": ("decoder",)}.get(model.kind, ("encoder",))


def block_layout(model: TracedModel, stack: str) -> BlockLayout:
    """The layout of `stack`'s blocks (all blocks of a stack are built alike)."""
    block = model.weights(stack).block(0)
    c = model.config
    return BlockLayout(
        stack=stack,
        norm=c.norm,
        norm_type=c.norm_type,
        activation=c.activation,
        d_model=c.d_model,
        d_ff=c.d_ff,
        n_heads=c.n_heads,
        d_head=c.head_dim,
        eps=block.ln_attn.eps,
        cross=block.cross_attn is not None,
        gated=block.mlp.W_gate is not None,
        causal=model.kind == "decoder" or (model.kind == "encoder-decoder" and stack == "decoder"),
        attention_recomputed=_plain_attention(c),
    )


def _plain_attention(config: BlockConfig) -> bool:
    """True when attention is the lecture's: one K and V per head, no rotary positions, no norm on q and k.
    Other attention (Llama's, Qwen's) is read from the trace rather than recomputed by `attention_row`."""
    return config.rope is None and config.kv_heads == config.n_heads and not config.qk_norm


# ---- what the page traces -------------------------------------------------------------------------------
_RECOMPUTED = ("q", "k", "v", "q_pre_rope", "k_pre_rope", "scores", "scaled", "weights", "z")
_NOT_READ = matching(
    *(f"**.{block}.{part}" for block in ("attn", "cross_attn") for part in _RECOMPUTED),
    "head.**",
    "*.embed.**",
    "**.mlp.hidden",
)


def block_read(name: str) -> bool:
    """A capture filter for the page: the residual stream, the norms' outputs, each sub-layer's output, masks,
    T5's position bias and the encoder's output. Not what the walk recomputes for its one token from the
    model's weights (Q, K, V, attention weights, head outputs, the FFN's hidden layer: at 512 tokens
    MiniLM's hidden layers alone take 19 MB), nor the embeddings and the head, which the page does not show."""
    return not _NOT_READ(name)


def trace_text(model: TracedModel, text: str) -> Trace:
    """An encoder's or decoder-only model's trace of `text`, holding what the page reads (`block_read`)."""
    if not isinstance(model, (EncoderModel, CausalLM)):
        raise InputError(f"this page reads text with an encoder or a decoder-only model, not a {model.kind} model")
    return model.trace(text, keep=block_read).compact()


def trace_translation(model: TracedModel, source: str) -> Translation:
    """An encoder-decoder's greedy translation of `source`; its trace (one teacher-forced pass over the
    source and the model's own output) holds what the page reads; the per-step traces are dropped."""
    translation = translate(model, source)
    return replace(translation, trace=translation.trace.compact(block_read), steps=None)


def trace_image(model: TracedModel, data: bytes, name: str) -> VisionResult:
    """A ViT's view of a picture file and its trace, holding what the page reads."""
    result = analyse(model, data, name)
    return replace(result, trace=result.trace.compact(block_read))


# ---- the block as a flow ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FlowNode:
    """One box of the block's flow diagram. kind: "io", "norm", "attn", "cross", "mlp" or "add";
    skip_from: for an "add" node, the index of the node whose output the residual connection carries."""

    kind: str
    label: str
    detail: str = ""
    skip_from: int | None = None


def _sublayer_node(part: str, layout: BlockLayout) -> FlowNode:
    if part == "attn":
        label = "Masked multi-head self-attention" if layout.causal else "Multi-head self-attention"
        return FlowNode("attn", label, f"{layout.n_heads} heads × d_k = {layout.d_head}; Q, K, V from its input")
    if part == "cross":
        return FlowNode("cross", "Cross-attention", "Q from the decoder · K, V from the encoder")
    act = ACTIVATION_NAMES[layout.activation] + (", gated" if layout.gated else "")
    return FlowNode("mlp", "Feed-forward network", f"{layout.d_model} → {layout.d_ff} ({act}) → {layout.d_model}")


def flow_nodes(layout: BlockLayout, norm: str | None = None) -> list[FlowNode]:
    """The block as a top-to-bottom flow, with `norm` placement ("post" / "pre"; default: the model's own).

    post: x → sub-layer → + x → Norm, for each sub-layer. pre: x → Norm → sub-layer → + x, for each.
    """
    norm = norm or layout.norm
    nodes = [FlowNode("io", "x: the block's input", f"n × {layout.d_model}, the residual stream")]
    for part in layout.parts:
        stream = len(nodes) - 1  # the node whose output is the residual stream here
        if norm == "pre":
            nodes.append(FlowNode("norm", layout.norm_name))
        nodes.append(_sublayer_node(part, layout))
        nodes.append(FlowNode("add", "+", "residual", skip_from=stream))
        if norm == "post":
            nodes.append(FlowNode("norm", layout.norm_name))
    last = "to the next layer" + (f" (the last: a final {layout.norm_name})" if norm == "pre" else "")
    nodes.append(FlowNode("io", "output", f"n × {layout.d_model}, {last}"))
    return nodes


# ---- one token through one block ---------------------------------------------------------------------
def _exact(tensor: torch.Tensor) -> np.ndarray:
    """A weight as float64 numpy (a copy: the lesson computes in float64 what the model did in its dtype)."""
    return np.array(to_numpy(tensor), dtype=np.float64)


def _rows(trace: Trace, name: str) -> np.ndarray:
    return np.asarray(trace[name], dtype=np.float64)


@dataclass(frozen=True, eq=False)
class AttentionRow:
    """The chosen token's attention: weights [heads, keys] (rows sum to 1) over the keys `keys` (labels);
    queries_from / keys_from: which stream gives the queries and the keys and values."""

    weights: np.ndarray
    keys: tuple[str, ...]
    queries_from: str
    keys_from: str
    allowed: np.ndarray | None = None

    @property
    def visible(self) -> np.ndarray:
        """Indices of the keys the token may attend to (all of them without a mask)."""
        n = self.weights.shape[1]
        return np.arange(n) if self.allowed is None else np.flatnonzero(self.allowed)


def attention_row(
    attn: AttentionWeights, q_in: np.ndarray, kv_in: np.ndarray, allowed: np.ndarray | None, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """One query through multi-head attention in float64: (output [d_model], weights [heads, n_keys]).

    attn: the layer's weights (`model.weights(stack).block(layer).attn`); q_in [d_model]: the query token's
    input; kv_in [n_keys, d_model]: the keys' and values' input; allowed [n_keys] (True = may attend) or None;
    bias [heads, n_keys] (T5's position bias) or None.
    """
    q = np.einsum("d,hde->he", q_in, _exact(attn.W_Q)) + _exact(attn.b_Q)  # [h, dh]: one query per head
    k = np.einsum("nd,hde->hne", kv_in, _exact(attn.W_K)) + _exact(attn.b_K)[:, None, :]  # [h_kv, n_k, dh]
    v = np.einsum("nd,hde->hne", kv_in, _exact(attn.W_V)) + _exact(attn.b_V)[:, None, :]
    # The model's own rule (tformer_core.attention), in float64: a query that may attend to nothing gets 0.
    parts = attend_float64(
        q[:, None],
        k,
        v,
        attn.scale,
        None if bias is None else bias[:, None, :],
        None if allowed is None else allowed[None, :],
    )
    z = parts.z[:, 0]  # [h, dh]
    return np.einsum("he,hed->d", z, _exact(attn.W_O)) + _exact(attn.b_O), parts.weights[:, 0]


def _norm(norm: NormWeights, x: np.ndarray) -> LayerNormSteps | RMSNormSteps:
    if norm.b is None:  # RMSNorm: no mean, no beta
        return rms_norm_steps(x, _exact(norm.w), norm.eps)
    return layer_norm_steps(x, _exact(norm.w), _exact(norm.b), norm.eps)


@dataclass(frozen=True, eq=False)
class SubLayerWalk:
    """One sub-layer with its residual connection and norm, for the chosen token (vectors [d_model]).

    part: "attn", "cross" or "mlp". stream_in: the residual stream entering. norm: the norm's steps
    (post-norm: of stream_in + out; pre-norm: of stream_in). sublayer_in: what the sub-layer reads
    (post: stream_in; pre: the norm's output). out: what it adds. total: stream_in + out. stream_out:
    the stream leaving (post: the norm's output; pre: total). model_*: the trace's tensors of the same
    meaning (float32, as the model computed them). attention / ffn: the sub-layer's own steps.
    """

    part: str
    stream_in: np.ndarray
    norm: LayerNormSteps | RMSNormSteps
    sublayer_in: np.ndarray
    out: np.ndarray
    total: np.ndarray
    stream_out: np.ndarray
    model_out: np.ndarray
    model_norm: np.ndarray
    model_stream_out: np.ndarray
    attention: AttentionRow | None = None
    ffn: FFNSteps | None = None

    @property
    def title(self) -> str:
        return SUBLAYERS[self.part]

    @property
    def norm_output(self) -> np.ndarray:
        return self.norm.output[0]

    @property
    def out_difference(self) -> float:
        """max |out - the model's|: the recomputed sub-layer against the trace."""
        return float(np.max(np.abs(self.out - self.model_out)))

    @property
    def norm_difference(self) -> float:
        return float(np.max(np.abs(self.norm_output - self.model_norm)))

    @property
    def stream_difference(self) -> float:
        return float(np.max(np.abs(self.stream_out - self.model_stream_out)))


@dataclass(frozen=True, eq=False)
class BlockWalk:
    """The chosen token through one block: x (the block's input, from the trace) -> sublayers -> output,
    compared with `reference`, the model's own next-layer input (`reference_name` in the trace)."""

    layout: BlockLayout
    layer: int
    n_layers: int
    token: int
    token_label: str
    x: np.ndarray
    sublayers: tuple[SubLayerWalk, ...]
    output: np.ndarray
    reference: np.ndarray
    reference_name: str

    @property
    def difference(self) -> np.ndarray:
        return self.output - self.reference

    @property
    def max_difference(self) -> float:
        """max |recomposed - the model's next-layer input| over every dimension."""
        return float(np.max(np.abs(self.difference)))

    @property
    def relative_difference(self) -> float:
        """max_difference / max |reference|: the float32 rounding of the model, relative to the stream's size."""
        return self.max_difference / max(float(np.max(np.abs(self.reference))), 1e-30)


def token_labels(trace: Trace, stack: str) -> tuple[str, ...]:
    """The labels of `stack`'s positions as the page shows them (the decoder's: its input tokens)."""
    return _labels(trace, stack)[0]


def _labels(trace: Trace, stack: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(labels of `stack`'s positions, labels of the encoder's positions) as shown."""
    queries, _ = trace.tokens_for(stack)
    return tuple(display_tokens(queries)), tuple(display_tokens(trace.tokens))


def _check(trace: Trace, stack: str, layer: int, token: int) -> int:
    if stack not in trace.stack_layers:
        raise InputError(f"this trace has no {stack!r} stack; it has {tuple(trace.stack_layers)}")
    n_layers = trace.stack_layers[stack]
    if not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} is out of range: the {stack} has {n_layers} layers (0..{n_layers - 1})")
    n = _rows(trace, f"{stack}.{layer}.resid_pre").shape[0]
    if not 0 <= token < n:
        raise InputError(f"token {token} is out of range: there are {n} tokens (0..{n - 1})")
    return n_layers


def _attention_inputs(
    trace: Trace, stack: str, layer: int, token: int, part: str, stream_in: np.ndarray, norm_of
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, str]:
    """(query input, keys' and values' input [n_k, d], allowed [n_k] or None, bias or None, where K, V come from)."""
    prefix = f"{stack}.{layer}.{'attn' if part == 'attn' else 'cross_attn'}"
    mask = trace.tensor(f"{prefix}.mask")[0, token] if f"{prefix}.mask" in trace else None
    allowed = None if mask is None else np.asarray(to_host([mask])[0], dtype=bool)
    if part == "cross":
        return stream_in, _rows(trace, "encoder.out"), allowed, None, "the encoder's output"
    keys = norm_of(_rows(trace, f"{stack}.{layer}.resid_pre"))  # every token's input, normed for pre-norm
    bias = trace.attention_bias(layer, stack=stack)  # T5's, for self-attention only
    bias = None if bias is None else np.asarray(bias, dtype=np.float64)[:, token]
    return stream_in, keys, allowed, bias, f"every {stack} token (this layer's input)"


def _sublayer(
    model: TracedModel, trace: Trace, layout: BlockLayout, layer: int, token: int, part: str, stream_in: np.ndarray
) -> SubLayerWalk:
    """One sub-layer of the walk for the token whose residual stream is `stream_in` [d]."""
    block = model.weights(layout.stack).block(layer)
    ln = {"attn": block.ln_attn, "cross": block.ln_cross, "mlp": block.ln_mlp}[part]
    if ln is None:
        raise InputError(f"the {layout.stack}'s blocks have no {SUBLAYERS[part]}")
    pre = layout.norm == "pre"
    attention, ffn, pre_norm = None, None, _norm(ln, stream_in) if pre else None
    read = pre_norm.output[0] if pre_norm is not None else stream_in
    if part == "mlp":
        mlp = block.mlp
        gate = (
            {}
            if mlp.W_gate is None or mlp.b_gate is None
            else {"W_gate": _exact(mlp.W_gate), "b_gate": _exact(mlp.b_gate)}
        )
        W1, b1, W2, b2 = (_exact(a) for a in (mlp.W_in, mlp.b_in, mlp.W_out, mlp.b_out))
        ffn = ffn_steps(read, W1, b1, W2, b2, layout.activation, **gate)
        out = ffn.output[0]
    elif not layout.attention_recomputed:
        out = _rows(trace, f"{layout.stack}.{layer}.{TRACE_PARTS[part][0]}")[token]
    else:
        attn = block.attn if part == "attn" else block.cross_attn
        assert attn is not None  # layout.parts has "cross" only where the blocks have cross-attention
        norm_all = (lambda x: _norm(ln, x).output) if pre else (lambda x: x)
        q_in, kv, allowed, bias, source = _attention_inputs(trace, layout.stack, layer, token, part, read, norm_all)
        out, weights = attention_row(attn, q_in, kv, allowed, bias)
        queries, source_labels = _labels(trace, layout.stack)
        keys = source_labels if part == "cross" else queries
        attention = AttentionRow(weights, keys, f"the {layout.stack} (this token)", source, allowed)
    total = stream_in + out
    norm = pre_norm if pre_norm is not None else _norm(ln, total)
    names = [f"{layout.stack}.{layer}.{p}" for p in TRACE_PARTS[part]]
    model_out, model_norm, model_stream = (_rows(trace, n)[token] for n in names)
    stream_out = total if pre else norm.output[0]
    return SubLayerWalk(
        part, stream_in, norm, read, out, total, stream_out, model_out, model_norm, model_stream, attention, ffn
    )


def block_walk(model: TracedModel, trace: Trace, stack: str, layer: int, token: int) -> BlockWalk:
    """Token `token` of `stack` through block `layer`, recomputed in float64 from the block's input.

    trace: the model's trace of the input, holding the residual stream, the norms' outputs and each
    sub-layer's output (`caches.block_read` keeps them); for cross-attention, `encoder.out`.
    Raises ValueError for a stack, layer or token out of range.
    """
    n_layers = _check(trace, stack, layer, token)
    layout = block_layout(model, stack)
    x = _rows(trace, f"{stack}.{layer}.resid_pre")[token]
    stream, parts = x, []
    for part in layout.parts:
        sub = _sublayer(model, trace, layout, layer, token, part, stream)
        parts.append(sub)
        stream = sub.stream_out
    last = layer == n_layers - 1
    reference_name = f"{stack}.{layer}.resid_post" if last else f"{stack}.{layer + 1}.resid_pre"
    queries, _ = _labels(trace, stack)
    return BlockWalk(
        layout,
        layer,
        n_layers,
        token,
        queries[token],
        x,
        tuple(parts),
        stream,
        _rows(trace, reference_name)[token],
        reference_name,
    )


# ---- tables of the walk ------------------------------------------------------------------------------
def dims_labels(n: int, letter: str = "x") -> list[str]:
    """Vector components as the lecture writes them, from 1: x1, x2, ..."""
    return [f"{letter}{i + 1}" for i in range(n)]


def vectors_frame(rows: dict[str, np.ndarray], n_dims: int | None = None, corner: str = "vector") -> pd.DataFrame:
    """Named vectors as the rows of a table (first `n_dims` components, all when None); corner: the index name."""
    matrix = np.vstack([np.asarray(v, dtype=np.float64).reshape(-1) for v in rows.values()])
    if n_dims is not None:
        matrix = matrix[:, :n_dims]
    return pd.DataFrame(matrix, index=pd.Index(list(rows), name=corner), columns=dims_labels(matrix.shape[1]))


def norm_rows(norm: LayerNormSteps | RMSNormSteps, model_output: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The norm of one vector, step by step: input, (x − μ,) x̂, γ, (β,) output (and the model's, the difference)."""
    if isinstance(norm, LayerNormSteps):
        rows = {
            "input x": norm.x[0],
            "x − μ": norm.centred[0],
            "x̂ = (x − μ) / √(σ² + ε)": norm.normalized[0],
            "γ (scale)": norm.gamma,
            "β (shift)": norm.beta,
            "y = γ ⊙ x̂ + β": norm.output[0],
        }
    else:
        rows = {
            "input x": norm.x[0],
            "x̂ = x / RMS(x)": norm.normalized[0],
            "γ (scale)": norm.gamma,
            "y = γ ⊙ x̂": norm.output[0],
        }
    if model_output is not None:
        rows["the model's y"] = model_output
        rows["difference"] = norm.output[0] - model_output
    return rows


def ffn_rows(ffn: FFNSteps, activation: str) -> dict[str, np.ndarray]:
    """The FFN's hidden layer for one token, step by step, named as the page shows it ([d_ff] each)."""
    act = ACTIVATION_NAMES[activation].split()[0]
    if ffn.gate is None:
        return {"x W₁ + b₁": ffn.hidden_pre[0], f"{act}(·)": ffn.hidden[0]}
    return {
        "gate g = x W_gate + b_gate": ffn.gate[0],
        f"{act}(g)": ffn.activated[0],
        "up u = x W₁ + b₁": ffn.hidden_pre[0],
        f"h = {act}(g) ⊙ u": ffn.hidden[0],
    }


def ffn_formula(layout: BlockLayout) -> str:
    """The FFN with this model's activation (and gate), and its shapes, LaTeX."""
    act = rf"\mathrm{{{ACTIVATION_NAMES[layout.activation].split()[0]}}}"
    d, f = layout.d_model, layout.d_ff
    body = (
        rf"\big({act}(x W_{{gate}} + b_{{gate}}) \odot (x W_1 + b_1)\big)\,W_2 + b_2"
        if layout.gated
        else rf"{act}(x W_1 + b_1)\,W_2 + b_2"
    )
    shapes = (
        rf"x \in \mathbb{{R}}^{{{d}}} \xrightarrow{{W_1:\ {d}\times{f}}} \mathbb{{R}}^{{{f}}} "
        rf"\xrightarrow{{W_2:\ {f}\times{d}}} \mathbb{{R}}^{{{d}}}"
    )
    return rf"\mathrm{{FFN}}(x) = {body},\qquad {shapes}"


def walk_vectors(walk: BlockWalk) -> dict[str, np.ndarray]:
    """Every vector of the walk in order, by a readable name: what the page offers as one CSV."""
    rows: dict[str, np.ndarray] = {"block input x": walk.x}
    pre = walk.layout.norm == "pre"
    for sub in walk.sublayers:
        name = sub.title
        if pre:
            rows[f"{walk.layout.norm_name} before the {name}"] = sub.norm_output
        rows[f"{name} output"] = sub.out
        rows[f"{name}: residual sum"] = sub.total
        if not pre:
            rows[f"{walk.layout.norm_name} after the {name}"] = sub.norm_output
    rows["recomposed block output"] = walk.output
    rows[f"the model's {walk.reference_name}"] = walk.reference
    rows["difference"] = walk.difference
    return rows


# ---- the residual stream across layers -------------------------------------------------------------------
NORM_QUANTITIES = {
    "resid_pre": "residual stream in (x)",
    "attn.out": "self-attention adds",
    "cross_attn.out": "cross-attention adds",
    "mlp.out": "FFN adds",
    "resid_post": "block output",
}


@dataclass(frozen=True, eq=False)
class StreamNorms:
    """Euclidean norms ‖v‖ of the residual stream and of what each sub-layer adds, per layer and token.

    values[quantity]: [layers, tokens] for each quantity present (keys of NORM_QUANTITIES); tokens: labels.
    """

    stack: str
    values: dict[str, np.ndarray]
    tokens: tuple[str, ...]

    def frame(self, token: int) -> pd.DataFrame:
        """Long form for a chart: layer, quantity, scope ("token i: label" or "mean over tokens"), norm."""
        parts = []
        scope = f"token {token}: {self.tokens[token]}"
        for key, grid in self.values.items():
            for what, values in ((scope, grid[:, token]), ("mean over tokens", grid.mean(axis=1))):
                parts.append(
                    pd.DataFrame(
                        {
                            "layer": np.arange(len(values)),
                            "quantity": NORM_QUANTITIES[key],
                            "scope": what,
                            "norm": values,
                        }
                    )
                )
        return pd.concat(parts, ignore_index=True)

    def table(self, token: int) -> pd.DataFrame:
        """One row per layer; columns: each quantity for the token, then its mean over tokens."""
        columns = {}
        for key, grid in self.values.items():
            columns[f"{NORM_QUANTITIES[key]} (token {token})"] = grid[:, token]
        for key, grid in self.values.items():
            columns[f"{NORM_QUANTITIES[key]} (mean)"] = grid.mean(axis=1)
        return pd.DataFrame(columns, index=pd.Index(range(len(grid)), name="layer"))


def stream_norms(trace: Trace, stack: str) -> StreamNorms:
    """The norms of the residual stream entering and leaving each block and of what each sub-layer adds."""
    if stack not in trace.stack_layers:
        raise InputError(f"this trace has no {stack!r} stack; it has {tuple(trace.stack_layers)}")
    n_layers = trace.stack_layers[stack]
    values = {}
    for key in NORM_QUANTITIES:
        names = [f"{stack}.{layer}.{key}" for layer in range(n_layers)]
        if all(name in trace for name in names):
            values[key] = np.stack([np.linalg.norm(_rows(trace, name), axis=-1) for name in names])  # [L, n]
    queries, _ = _labels(trace, stack)
    return StreamNorms(stack, values, queries)


# ---- the lecture's LayerNorm example --------------------------------------------------------------------
# Small integers whose means and variances come out whole, so every step can be checked by hand:
# "I": μ = 3, σ² = 4, x̂ = ±1; "love": μ = 5, σ² = 5; "tea": μ = 1, σ² = 3.
EXAMPLE_TOKENS = ("I", "love", "tea")
EXAMPLE_X = np.array([[1, 5, 1, 5], [2, 4, 6, 8], [0, 0, 0, 4]], dtype=np.float64)
EXAMPLE_GAMMA = np.array([1.0, 1.0, 2.0, 0.5])
EXAMPLE_BETA = np.array([0.0, 0.0, 1.0, -1.0])
EXAMPLE_EPS = 1e-5


def written_mean(x: np.ndarray) -> str:
    """μ = (x1 + x2 + ...) / d as numbers, LaTeX."""
    return rf"\mu = \frac{{{' + '.join(fmt(v) for v in x)}}}{{{len(x)}}} = {fmt(float(np.mean(x)))}"


def written_variance(x: np.ndarray) -> str:
    """σ² = ((x1 − μ)² + ...) / d as numbers, LaTeX."""
    mu = float(np.mean(x))
    terms = " + ".join(f"({fmt(v)} - {fmt(mu)})^2" for v in x)
    return rf"\sigma^2 = \frac{{{terms}}}{{{len(x)}}} = {fmt(float(np.mean((x - mu) ** 2)))}"


def written_output(norm: LayerNormSteps | RMSNormSteps, row: int) -> str:
    """y = γ ⊙ x̂ (+ β) element by element for one row, LaTeX: [1·(−1) + 0, ...] = [...]."""
    gamma, x_hat = norm.gamma, norm.normalized[row]
    beta = norm.beta if isinstance(norm, LayerNormSteps) else None

    def term(i: int) -> str:
        product = rf"{as_factor(gamma[i])}\cdot{as_factor(x_hat[i])}"
        return product if beta is None else f"{product} + {as_factor(beta[i])}"

    terms = ", ".join(term(i) for i in range(len(x_hat)))
    return rf"y = [{terms}] = [{', '.join(fmt(v) for v in norm.output[row])}]"


def written_rms(x: np.ndarray, eps: float) -> str:
    """RMS(x) = √((x1² + x2² + ...) / d + ε) as numbers, LaTeX."""
    terms = " + ".join(f"{fmt(v)}^2" if v >= 0 else f"({fmt(v)})^2" for v in x)
    value = float(np.sqrt(np.mean(x**2) + eps))
    return rf"\mathrm{{RMS}}(x) = \sqrt{{\frac{{{terms}}}{{{len(x)}}} + {tex(eps)}}} = {fmt(value)}"


def norm_summary(norm: LayerNormSteps | RMSNormSteps, tokens: list[str]) -> pd.DataFrame:
    """Per row: μ, σ², √(σ² + ε) (LayerNorm) or mean of squares, RMS (RMSNorm)."""
    if isinstance(norm, LayerNormSteps):
        data = {"μ": norm.mean, "σ²": norm.var, "√(σ² + ε)": norm.std}
    else:
        data = {"mean of x²": norm.mean_square, "RMS = √(mean x² + ε)": norm.rms}
    return pd.DataFrame(data, index=pd.Index(tokens, name="per token"))


def example_norm_inputs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The lecture's example with `d` dimensions: X [tokens, d] and [γ; β] [2, d], the example's numbers in the
    first dimensions (X 0, γ 1, β 0 in the others)."""
    X = np.zeros((len(EXAMPLE_TOKENS), d))
    k = min(d, EXAMPLE_X.shape[1])
    X[:, :k] = EXAMPLE_X[:, :k]
    params = np.vstack([np.ones(d), np.zeros(d)])
    params[0, :k], params[1, :k] = EXAMPLE_GAMMA[:k], EXAMPLE_BETA[:k]
    return X, params


def eps_problem(eps: float) -> str | None:
    """Why ε cannot be used (it must be > 0), or None."""
    if eps > 0:
        return None
    return f"ε must be greater than 0 (it keeps the division away from 0 when every x_i is equal); got {eps:g}."


# ---- a norm's formulas, LaTeX ------------------------------------------------------------------------------
def norm_formulas(norm: LayerNormSteps | RMSNormSteps, row: int = 0) -> list[str]:
    """The lecture's formulas of `norm` with row `row`'s numbers: μ and σ², then x̂ and y (LayerNorm), or
    RMS(x) and y (RMSNorm)."""
    d, eps = norm.x.shape[1], tex(norm.eps)
    if isinstance(norm, LayerNormSteps):
        return [
            rf"\mu = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} x_i = {fmt(norm.mean[row])},\qquad "
            rf"\sigma^2 = \frac{{1}}{{d}}\sum_{{i=1}}^{{d}} (x_i-\mu)^2 = {fmt(norm.var[row])},\qquad d = {d}",
            rf"\hat x_i = \frac{{x_i-\mu}}{{\sqrt{{\sigma^2+\varepsilon}}}},\ \ \sqrt{{\sigma^2+\varepsilon}} = "
            rf"{fmt(norm.std[row])}\ (\varepsilon = {eps}),\qquad y_i = \gamma_i\,\hat x_i + \beta_i",
        ]
    return [
        rf"\mathrm{{RMS}}(x) = \sqrt{{\frac{{1}}{{d}}\sum_{{i=1}}^{{d}} x_i^2 + \varepsilon}} = {fmt(norm.rms[row])},"
        rf"\qquad y_i = \gamma_i\,\frac{{x_i}}{{\mathrm{{RMS}}(x)}}\qquad (d = {d},\ \varepsilon = {eps})"
    ]


def normalized_formula(norm: LayerNormSteps | RMSNormSteps) -> str:
    """x̂ in symbols: (x − μ) / √(σ² + ε), or x / RMS(x)."""
    if isinstance(norm, LayerNormSteps):
        return r"\hat x_i = \frac{x_i - \mu}{\sqrt{\sigma^2 + \varepsilon}}"
    return r"\hat x_i = \frac{x_i}{\mathrm{RMS}(x)}"


def output_formula(norm: LayerNormSteps | RMSNormSteps) -> str:
    """y in symbols: γ x̂ + β, or γ x̂ (RMSNorm has no β)."""
    return r"y_i = \gamma_i\,\hat x_i + \beta_i" if isinstance(norm, LayerNormSteps) else r"y_i = \gamma_i\,\hat x_i"


def written_row(norm: LayerNormSteps | RMSNormSteps, row: int) -> list[str]:
    """Row `row` of the norm with every number written out, LaTeX: μ, σ², x̂ and y (LayerNorm), or RMS and y."""
    x = norm.x[row]
    if not isinstance(norm, LayerNormSteps):
        return [written_rms(x, norm.eps), written_output(norm, row)]
    normalized = (
        rf"\hat x = \frac{{x - {fmt(norm.mean[row])}}}{{\sqrt{{{fmt(norm.var[row])} + {tex(norm.eps)}}}}} = "
        rf"[{', '.join(fmt(v) for v in norm.normalized[row])}]"
    )
    return [written_mean(x), written_variance(x), normalized, written_output(norm, row)]


# ---- an attention row too long to draw ----------------------------------------------------------------------
def strongest_keys(row: AttentionRow, k: int = 5) -> pd.DataFrame:
    """Each head's `k` strongest keys, "key (weight)", strongest first (ties: the earlier key first): one row per
    head [heads, k]."""
    heads = [f"head {h}" for h in range(row.weights.shape[0])]
    top = np.argsort(-row.weights, axis=1, kind="stable")[:, :k]  # [heads, k]
    cells = [[f"{row.keys[j]} ({row.weights[h, j]:.3f})" for j in top[h]] for h in range(len(heads))]
    return pd.DataFrame(cells, index=pd.Index(heads, name="strongest keys"), columns=list(range(1, top.shape[1] + 1)))
