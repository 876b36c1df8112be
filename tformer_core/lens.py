"""What the residual stream says along the way: the logit lens and direct attribution, from one trace.

    lens = logit_lens(model, trace, k=5)                  # the prediction read after every layer
    lens.top_labels[3], lens.rank                        # layer 3's top-5; the target's rank after each layer
    parts = direct_attribution(model, trace, output=id)   # each head's and FFN's share of one logit
    parts.heads[3, 5], parts.total                       # head 5 of layer 3; the sum, = the logit

The logit lens (nostalgebraist 2020) reads the residual stream after each layer with the model's own read-out
(`model.read_out`: the final norm and the head): the decoder's for a language model and for a translator (the
decoder side: the target's next token), the class head on the class token for a ViT. The last row is the
model's own prediction. A post-norm model (BERT, the original Transformer) normalises after every block, so
its read-out is the head alone.

Direct attribution splits one logit into the parts of a pre-norm residual stream. The stream entering the
final norm is a sum: the embedding, every head's z W_O, every attention layer's bias b_O, every FFN's
output (and cross-attention's heads and bias in a translator's decoder). The final norm is not linear: it
divides by the stream's own spread. Here that divisor (LayerNorm's sqrt(var + eps), RMSNorm's root mean
square) is FROZEN at its value in the real pass, which makes the norm linear, each part is centred (LayerNorm)
and scaled by it, and the parts then sum exactly to the logit (with the norm's bias beta and the head's bias
as two more parts). A part's number is what it adds to the logit given everything else, not what removing it
would change (that is `probes.head_importance`, by ablation). A post-norm model renormalises after every
block, so its stream is no such sum: direct attribution refuses it (ValueError), the logit lens does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .models.base import TracedModel
from .numerics import softmax
from .trace import Trace

__all__ = ["Attribution", "LogitLens", "direct_attribution", "logit_lens"]


def _lens_stack(trace: Trace) -> str:
    return "decoder" if "decoder" in trace.stack_layers else "encoder"


def _position(trace: Trace, position: int | None) -> int:
    if position is None:
        position = trace.meta.predict_position
    if position is None:
        raise ValueError("name the position to read: this trace predicts at none (no [MASK], no next token)")
    n = len(trace.target_tokens or ()) if trace.kind == "encoder-decoder" else len(trace.tokens)
    if not -n <= position < n:
        raise ValueError(f"position {position} is outside the input ({n} positions)")
    return position % n


@dataclass(frozen=True, eq=False)
class LogitLens:
    """The read-out after each layer. layers: "embed", then "0".."L-1" (the last row is the model's output).
    top_ids, top_probs [layers, k]; top_labels [layers][k]; target: the output id followed (default: the
    model's own top-1); rank [layers] (0 = top), prob [layers]: the target's rank and probability per layer."""

    layers: tuple[str, ...]
    top_ids: np.ndarray
    top_probs: np.ndarray
    top_labels: tuple[tuple[str, ...], ...]
    target: int
    target_label: str
    rank: np.ndarray
    prob: np.ndarray


def _residuals(trace: Trace, stack: str) -> np.ndarray:
    names = [f"{stack}.embed.out"] + [f"{stack}.{layer}.resid_post" for layer in range(trace.stack_layers[stack])]
    missing = [n for n in names if n not in trace]
    if missing:
        raise ValueError(f"the trace does not hold {missing[0]!r}: trace with the residual stream kept")
    return np.stack([trace[n] for n in names])  # [layers + 1, T, D]


def logit_lens(
    model: TracedModel, trace: Trace, k: int = 5, position: int | None = None, target: int | None = None
) -> LogitLens:
    """The model's prediction read from the residual stream after every layer (see the module docstring).

    position: the token position read (default: the trace's prediction position; a ViT reads its class token);
    target: the output id whose rank is followed (default: the model's own top-1 at the last layer).
    """
    if not trace.has_head:
        raise ValueError(f"this {trace.kind} model has no head to read its residual stream with")
    stack = _lens_stack(trace)
    resid = _residuals(trace, stack)
    vision = trace.kind == "vit"
    if not vision:
        position = _position(trace, position)
        resid = resid[:, position : position + 1]  # only the position read goes through the (large) unembedding
    with torch.inference_mode():
        x = torch.as_tensor(resid).to(model.device, model.dtype)
        logits = model.read_out(x).double().cpu().numpy()
    logits = logits.reshape(logits.shape[0], -1)  # [layers + 1, outputs]
    probs = softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")
    target = int(order[-1, 0]) if target is None else int(target)
    if not 0 <= target < probs.shape[1]:
        raise ValueError(f"output {target} is outside the head's {probs.shape[1]} outputs")
    labels = trace.meta.labels or [str(i) for i in range(probs.shape[1])]
    top = order[:, :k]
    return LogitLens(
        layers=("embed", *(str(layer) for layer in range(len(resid) - 1))),
        top_ids=top,
        top_probs=np.take_along_axis(probs, top, -1),
        top_labels=tuple(tuple(str(labels[i]) for i in row) for row in top),
        target=target,
        target_label=str(labels[target]),
        rank=(probs > probs[:, target : target + 1]).sum(axis=-1),
        prob=probs[:, target],
    )


@dataclass(frozen=True, eq=False)
class Attribution:
    """One logit split into the parts of the residual stream (see the module docstring), float64.

    heads [layers, heads]: each self-attention head's z W_O; cross [layers, heads] a translator's cross-attention
    heads (None otherwise); attn_bias [layers] (b_O, cross-attention's added); mlp [layers]: each FFN's output;
    embed: the embedding; norm_bias: the final norm's beta; head_bias: the head's bias. total: their sum, which
    equals `logit`, the model's own. scale: the frozen divisor of the final norm at each position read.
    """

    output: int
    label: str
    heads: np.ndarray
    cross: np.ndarray | None
    attn_bias: np.ndarray
    mlp: np.ndarray
    embed: float
    norm_bias: float
    head_bias: float
    logit: float
    scale: tuple[float, ...]

    @property
    def total(self) -> float:
        cross = 0.0 if self.cross is None else float(self.cross.sum())
        parts = self.heads.sum() + cross + self.attn_bias.sum() + self.mlp.sum()
        return float(parts + self.embed + self.norm_bias + self.head_bias)


def _projector(model: TracedModel, stack: str, x: np.ndarray, direction: np.ndarray):
    """(project, beta part, frozen scale) of one read position: project(C [..., D]) is what parts C add to
    direction . norm(x), with the norm's divisor frozen at x's (the real pass's)."""
    ln = model.weights(stack).ln_final
    if ln is None:
        raise ValueError(
            "this model normalises after every block (post-norm): its residual stream is not a sum of parts, so "
            "there is no direct attribution; ablate heads instead (probes.head_importance)"
        )
    gamma = ln.w.double().cpu().numpy()
    if ln.kind == "layernorm":
        scale = float(np.sqrt(x.var() + ln.eps))
        e = direction * gamma / scale
        beta = float(direction @ ln.b.double().cpu().numpy()) if ln.b is not None else 0.0
        return (lambda c: c @ e - c.mean(-1) * e.sum()), beta, scale
    scale = float(np.sqrt(np.mean(x * x) + ln.eps))
    e = direction * gamma / scale
    return (lambda c: c @ e), 0.0, scale


def _f64(trace: Trace, name: str) -> np.ndarray:
    return np.asarray(trace[name], dtype=np.float64)


def _layer_parts(model: TracedModel, trace: Trace, stack: str, project, position: int) -> dict[str, np.ndarray]:
    """Each part's projection at `position`: heads [L, h], cross [L, h] (a decoder reading an encoder),
    attn_bias [L], mlp [L]."""
    weights = model.weights(stack)
    cross_stack = trace.kind == "encoder-decoder" and stack == "decoder"
    parts: dict[str, list] = {"heads": [], "cross": [], "attn_bias": [], "mlp": []}
    for layer in range(trace.stack_layers[stack]):
        w = weights.block(layer)
        blocks = [("heads", "attn", w.attn)]
        if cross_stack and w.cross_attn is not None:
            blocks.append(("cross", "cross_attn", w.cross_attn))
        bias = 0.0
        for key, part, attn in blocks:
            z = _f64(trace, f"{stack}.{layer}.{part}.z")[:, position]  # [h, dh]
            W_O = attn.W_O.double().cpu().numpy()  # [h, dh, D]
            parts[key].append(project(np.einsum("hd,hdm->hm", z, W_O)))  # [h]
            bias += float(project(attn.b_O.double().cpu().numpy()))
        parts["attn_bias"].append(bias)
        parts["mlp"].append(float(project(_f64(trace, f"{stack}.{layer}.mlp.out")[position])))
    return {k: np.array(v, dtype=np.float64) for k, v in parts.items() if v}


def direct_attribution(
    model: TracedModel, trace: Trace, output: int | None = None, position: int | None = None
) -> Attribution:
    """Split the logit of `output` (default: the model's top-1) at `position` (default: the trace's prediction
    position; a ViT's class score reads its class and distillation tokens) into the residual stream's parts,
    with the final norm's divisor frozen from the real pass (module docstring). parts.total == the logit."""
    stack = _lens_stack(trace)
    vision = trace.kind == "vit"
    position = 0 if vision else _position(trace, position)
    logits = _final_logits(model, trace, stack, position)
    output = int(np.argmax(logits)) if output is None else int(output)
    if not 0 <= output < len(logits):
        raise ValueError(f"output {output} is outside the head's {len(logits)} outputs")
    readout = model.linear_readout(output, position)
    final = _f64(trace, f"{stack}.{trace.stack_layers[stack] - 1}.resid_post")
    sums: dict[str, np.ndarray] = {}
    embed = norm_bias = 0.0
    scales = []
    for p, direction in readout.terms:
        project, beta, scale = _projector(model, stack, final[p], direction.double().cpu().numpy())
        for key, value in _layer_parts(model, trace, stack, project, p).items():
            sums[key] = sums.get(key, 0.0) + value
        embed += float(project(_f64(trace, f"{stack}.embed.out")[p]))
        norm_bias += beta
        scales.append(scale)
    labels = trace.meta.labels
    return Attribution(
        output=output,
        label=str(labels[output]) if labels is not None else str(output),
        heads=sums["heads"],
        cross=sums.get("cross"),
        attn_bias=sums["attn_bias"],
        mlp=sums["mlp"],
        embed=embed,
        norm_bias=norm_bias,
        head_bias=readout.bias,
        logit=float(logits[output]),
        scale=tuple(scales),
    )


def _final_logits(model: TracedModel, trace: Trace, stack: str, position: int) -> np.ndarray:
    """The head's logits at `position` (a ViT's for the image), read from the trace or recomputed by read_out
    from the last residual stream (a compact trace keeps only the top tokens)."""
    if "head.logits" in trace.activations:
        logits = np.asarray(trace["head.logits"], dtype=np.float64)
        return logits if logits.ndim == 1 else logits[position]
    final = trace[f"{stack}.{trace.stack_layers[stack] - 1}.resid_post"]
    with torch.inference_mode():
        read = model.read_out(torch.as_tensor(np.array(final))[None].to(model.device, model.dtype))
    out = read[0].double().cpu().numpy()
    return out if out.ndim == 1 else out[position]
