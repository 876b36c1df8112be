"""Attention sinks and massive activations: where attention goes when it "looks at nothing", and why.

    shares = sink_shares(trace)                   # the first token (and [SEP], [CLS]...): SinkShare each
    shares[0].share[3, 5], shares[0].per_layer    # head 5 of layer 3: its queries' mean weight on the first token
    shares[0].sink_layers()                       # the layers where more than half of the attention goes there
    big = massive_activations(trace)              # per layer: the largest |x| of the residual stream / its median
    big.top[12][0]                                # Activation(layer=12, position=0, dim=507, value=..., ratio=...)
    knock = knock_out_activation(model, "The capital of France is", big.top[12][0])
    knock.before.target_probability, knock.after.target_probability   # P(" Paris"): 0.773 -> 0.000 (SmolLM2)
    knock = block_sink(model, "The capital of France is", from_layer=3)  # no query reads the first token from 3 on

Xiao et al. 2023 (StreamingLLM) found that language models put most of their attention on the first token,
whatever it is: a softmax row must sum to 1, and a head with nothing to read parks its weight on a token whose
value vector adds little. Sun et al. 2024 ("Massive activations in large language models") found the mechanism
beside it: a few residual-stream activations, at the first token and in fixed dimensions, 1000x or more the
median, which act as fixed biases; set them to a typical value and the model falls apart.

Everything is computed where the trace's tensors are (a GPU's memory) and only the small results ([layers,
heads] shares, a few numbers per layer) are copied to the host, once. The knockouts are real forward passes
through the model's checked intervention API (`model.trace(x, edits=...)`): the edits are `set_activation` and
`block_keys`, which a notebook can use on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .capture import Edit, Hook, matching
from .errors import InputError
from .models.kinds import CausalLM, EncoderModel
from .numerics import head_scores_tensor
from .trace import ATTENTION_STACKS, Trace, to_host

__all__ = [
    "MASSIVE_ABS",
    "MASSIVE_RATIO",
    "SINK_THRESHOLD",
    "SPECIAL_TOKENS",
    "Activation",
    "Knockout",
    "MassiveActivations",
    "Prediction",
    "SinkShare",
    "block_keys",
    "block_sink",
    "knock_out_activation",
    "massive_activations",
    "set_activation",
    "sink_positions",
    "sink_share",
    "sink_shares",
]

SINK_THRESHOLD = 0.5  # a layer is a sink layer when more than half of its attention goes to the sink positions
# Sun et al. 2024 call an activation massive when |x| > 100 and it is about 1000x the median |x| of its layer.
# Both are asked: the ratio alone would flag a layer whose median is tiny (the embeddings, a nearly zero stream),
# the size alone a model whose whole stream is large. SmolLM2's layer 12: 22,552 and 9,348x the median.
MASSIVE_ABS = 100.0
MASSIVE_RATIO = 1000.0
# Tokens that BERT-like models (and some decoders) put on every input: sinks of their own (Clark et al. 2019).
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "<s>", "</s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
_READ_OUT = ("head.logits", "*.out")  # what a knockout's passes keep: the prediction and the final hidden state


# ---- the share of attention on the sink positions ------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SinkShare:
    """How much attention goes to a set of key positions, per layer x head of one attention stack.

    name: "first token" or the special token's label ("[SEP]"). positions: the key positions counted together.
    tokens: their labels. share: [layers, heads] float64, for each head the mean over the counted queries of the
    weight the query puts on these positions together (0..1: 0.8 = on average 80% of a row's weight). queries:
    how many queries were counted, in the layer that counted fewest (see `sink_share`: a query counts when it
    could attend both to these positions and elsewhere).
    """

    stack: str
    name: str
    positions: tuple[int, ...]
    tokens: tuple[str, ...]
    share: np.ndarray
    queries: int

    @property
    def per_layer(self) -> np.ndarray:
        """[layers]: the mean over the heads of `share` (every head weighs the same)."""
        return self.share.mean(axis=1)

    def sink_layers(self, threshold: float = SINK_THRESHOLD) -> tuple[int, ...]:
        """The layers whose heads put on average more than `threshold` of their attention on these positions."""
        return tuple(int(layer) for layer in np.flatnonzero(self.per_layer > threshold))


def _allowed(trace: Trace, stack: str, layer: int, n_q: int, n_k: int) -> torch.Tensor:
    """[n_q, n_k] True where a query may attend to a key: the trace's mask when it stored one, else causal for a
    decoder's self-attention (its queries start at `meta.query_start`), else everything."""
    mask = trace.activations.get(f"{ATTENTION_STACKS[stack].format(layer=layer)}.mask")
    if mask is not None:
        return mask[0].to(torch.bool)
    if stack == "decoder":
        start = trace.meta.query_start
        return torch.ones(n_q, n_k, dtype=torch.bool, device=trace.device).tril(start)
    return torch.ones(n_q, n_k, dtype=torch.bool, device=trace.device)


def _stack(trace: Trace, stack: str | None) -> str:
    stack = stack or trace.main_stack
    if stack not in trace.attention_stacks:
        raise InputError(f"this {trace.kind} trace has no {stack!r} attention; it has {trace.attention_stacks}")
    return stack


def _key_positions(positions: Sequence[int], n_k: int) -> tuple[int, ...]:
    chosen = tuple(sorted({int(p) % n_k for p in positions if -n_k <= int(p) < n_k}))
    if len(chosen) != len(set(positions)) or not chosen:
        raise InputError(f"sink positions {list(positions)} must be distinct key positions within 0..{n_k - 1}")
    return chosen


def sink_share(
    trace: Trace, positions: Sequence[int] = (0,), stack: str | None = None, name: str | None = None
) -> SinkShare:
    """The share of attention on the key `positions` (together), per layer x head of `stack` (default: the main one).

    A query counts when it could attend both to one of `positions` and to another key: the share is a choice it
    made. So the first query of a causal model, which sees only itself and puts 1.0 on the first token without
    choosing, is left out (as is, for any model, a query whose mask allows the sink positions only); the queries of
    a causal model before a later sink position, which cannot see it, are left out too. Computed on the trace's
    device (the weights of a compact trace recomputed there from Q and K), in float32 or the trace's float64; the
    [layers, heads] result is copied once. InputError when no query counts (a single token).
    """
    stack = _stack(trace, stack)
    keys = trace.tokens_for(stack)[1]
    chosen = _key_positions(positions, len(keys))
    per_layer, counts = [], []
    with torch.inference_mode():
        for layer in range(trace.layers_in(stack)):
            weights = trace.block_tensor("weights", layer, None, stack)  # [h, n_q, n_k]
            wide = weights if weights.dtype == torch.float64 else weights.float()
            allowed = _allowed(trace, stack, layer, wide.shape[1], wide.shape[2])
            on_sink = torch.zeros(wide.shape[2], dtype=torch.bool, device=wide.device)
            on_sink[list(chosen)] = True
            counted = (allowed & on_sink).any(-1) & (allowed & ~on_sink).any(-1)  # [n_q]
            share = wide[..., on_sink].sum(-1)  # [h, n_q]: each query's weight on the sink positions together
            per_layer.append((share * counted).sum(-1) / counted.sum().clamp(min=1))  # [h]
            counts.append(counted.sum())
        stacked, fewest = torch.stack(per_layer), torch.stack(counts).min()
    host, queries = to_host([stacked, fewest])
    if int(queries) == 0:
        raise InputError("no query could attend both to the sink and elsewhere: give at least two tokens")
    return SinkShare(
        stack=stack,
        name=name or ("first token" if chosen == (0,) else ", ".join(keys[p] for p in chosen)),
        positions=chosen,
        tokens=tuple(keys[p] for p in chosen),
        share=np.asarray(host, dtype=np.float64),
        queries=int(queries),
    )


def sink_positions(trace: Trace, stack: str | None = None) -> dict[str, tuple[int, ...]]:
    """The key positions whose attention share is worth a look: {"first token": (0,)}, then each special token of
    `SPECIAL_TOKENS` the keys hold ({"[SEP]": (5,)}), in the order first met; a special token standing only at
    position 0 ([CLS], <s>) is the first token already and is not repeated."""
    keys = trace.tokens_for(_stack(trace, stack))[1]
    found: dict[str, tuple[int, ...]] = {"first token": (0,)}
    for label in dict.fromkeys(t for t in keys if t in SPECIAL_TOKENS):
        where = tuple(i for i, t in enumerate(keys) if t == label)
        if where != (0,):
            found[label] = where
    return found


def sink_shares(trace: Trace, stack: str | None = None) -> list[SinkShare]:
    """`sink_share` of every set of `sink_positions`: the first token's first, then each special token's."""
    return [sink_share(trace, where, stack, name) for name, where in sink_positions(trace, stack).items()]


# ---- massive activations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Activation:
    """One number of the residual stream: `part` ("resid_pre": entering the block) of `layer`, at token
    `position`, dimension `dim`. value: its value (signed); ratio: |value| / the median |x| of its layer;
    massive: |value| >= MASSIVE_ABS and ratio >= MASSIVE_RATIO."""

    layer: int
    position: int
    dim: int
    value: float
    ratio: float
    massive: bool


def _is_massive(magnitude: float, ratio: float) -> bool:
    return magnitude >= MASSIVE_ABS and ratio >= MASSIVE_RATIO


@dataclass(frozen=True, eq=False)
class MassiveActivations:
    """The residual stream's largest activations, per layer of one stack.

    part: "resid_pre" (the stream entering each block, so layer l's figures are what layers 0..l-1 wrote) or
    "resid_post" (leaving it). largest [layers]: the largest |x| over every position and dimension; median
    [layers]: the median |x| of the layer (numpy's: the mean of the middle two for an even count); ratio
    [layers]: largest / median (inf when the median is 0); median_value [layers]: the median of the signed x
    (what `knock_out_activation` sets an activation to); top: per layer its `k` largest |x|, largest first.
    """

    stack: str
    part: str
    largest: np.ndarray
    median: np.ndarray
    ratio: np.ndarray
    median_value: np.ndarray
    top: tuple[tuple[Activation, ...], ...]

    @property
    def massive(self) -> np.ndarray:
        """[layers] bool: the layer holds a massive activation (|x| >= MASSIVE_ABS and >= MASSIVE_RATIO x median)."""
        return (self.largest >= MASSIVE_ABS) & (self.ratio >= MASSIVE_RATIO)

    @property
    def massive_activations(self) -> tuple[Activation, ...]:
        """Every massive one among the layers' `top`, by layer then size."""
        return tuple(a for layer in self.top for a in layer if a.massive)


def _median(flat: torch.Tensor) -> torch.Tensor:
    """numpy's median along the last axis (the middle two averaged for an even count) without sorting the rows,
    and without torch.quantile's limit of 16M numbers a row."""
    n = flat.shape[-1]
    low = flat.kthvalue((n + 1) // 2, dim=-1).values
    return low if n % 2 else (low + flat.kthvalue(n // 2 + 1, dim=-1).values) / 2


def massive_activations(
    trace: Trace, stack: str | None = None, part: str = "resid_pre", k: int = 3
) -> MassiveActivations:
    """Each layer's largest residual-stream activations against the layer's median (Sun et al. 2024), on the
    trace's device; one copy of [layers] figures and [layers, k] positions to the host.

    part: "resid_pre" or "resid_post" (see `MassiveActivations`). InputError when the trace has not kept them
    (a filtered capture)."""
    if part not in ("resid_pre", "resid_post"):
        raise ValueError(f"part is 'resid_pre' or 'resid_post', not {part!r}")
    stack = stack or trace.main_stack
    if stack not in trace.stack_layers:
        raise InputError(f"this {trace.kind} trace has no {stack!r} stack; it has {sorted(trace.stack_layers)}")
    names = [f"{stack}.{layer}.{part}" for layer in range(trace.stack_layers[stack])]
    missing = [n for n in names if n not in trace]
    if missing:
        raise InputError(f"this trace did not keep the residual stream ({missing[0]}): trace without a keep filter")
    with torch.inference_mode():
        stream = torch.stack([trace.tensor(n) for n in names])  # [layers, T, D]
        flat = (stream if stream.dtype == torch.float64 else stream.float()).flatten(1)  # [layers, T*D]
        magnitude = flat.abs()
        median, median_value = _median(magnitude), _median(flat)
        values, where = magnitude.topk(min(k, magnitude.shape[1]), dim=-1)  # [layers, k], largest first
        signed = flat.gather(-1, where)
    largest_k, index, signed_k, med, med_value = to_host([values, where, signed, median, median_value])
    width = stream.shape[-1]
    med = np.asarray(med, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(med[:, None] > 0, largest_k / med[:, None], np.inf)
    top = tuple(
        tuple(
            Activation(layer, int(i) // width, int(i) % width, float(v), float(r), _is_massive(float(m), float(r)))
            for i, v, m, r in zip(index[layer], signed_k[layer], largest_k[layer], ratios[layer])
        )
        for layer in range(len(names))
    )
    largest = np.asarray(largest_k[:, 0], dtype=np.float64)
    return MassiveActivations(
        stack, part, largest, med, ratios[:, 0].astype(np.float64), np.asarray(med_value, np.float64), top
    )


# ---- knockouts: real forward passes under an edit ------------------------------------------------------
def set_activation(name: str, position: int, dim: int, value: float) -> Edit:
    """An edit setting one number of the activation `name` (a residual stream, (B, T, D)): [position, dim] <- value
    in every row of the batch."""

    def apply(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        if not (-x.shape[-2] <= position < x.shape[-2] and -x.shape[-1] <= dim < x.shape[-1]):
            raise InputError(f"{hook.name}: [{position}, {dim}] is outside its {tuple(x.shape[1:])}")
        out = x.clone()
        out[..., position, dim] = value
        return out

    return Edit(name, apply)


def block_keys(block: str, positions: Sequence[int]) -> Edit:
    """An edit of the attention block `block` ("decoder.3.attn") that stops every query attending to the key
    `positions`: their softmax inputs (`{block}.scaled`) set to -inf, so their weights are 0 and each row's other
    weights renormalised to sum to 1, exactly as a mask would. A query whose every allowed key is blocked (the first
    query of a causal model, which sees only the first token) keeps its row: a softmax over nothing has no value."""

    def apply(scaled: torch.Tensor, hook: Hook) -> torch.Tensor:  # (B, h, Tq, Tk)
        columns = torch.zeros(scaled.shape[-1], dtype=torch.bool, device=scaled.device)
        columns[list(positions)] = True
        blocked = scaled.masked_fill(columns, float("-inf"))
        has_another = torch.isfinite(blocked).any(-1, keepdim=True)
        return torch.where(has_another, blocked, scaled)

    return Edit(f"{block}.scaled", apply)


@dataclass(frozen=True)
class Prediction:
    """What a model reads out of one pass. position: the prediction's position (the last for a next token, an
    encoder's first [MASK]; None: the model has no head there). top: its `k` most probable (label, probability).
    target, target_probability: the label followed (by default the top-1 before the knockout) and its
    probability in this pass; None without a head."""

    position: int | None
    top: tuple[tuple[str, float], ...]
    target: str | None
    target_probability: float | None


@dataclass(frozen=True)
class Knockout:
    """A prediction before and after an edit. what: the edit in words ("decoder.12.resid_pre[0, 507] <- -0.132").
    hidden_change: ||h_after - h_before|| / ||h_before|| of the final hidden state at the prediction's position
    (without one, of its mean over the positions, the sentence embedding of a mean-pooling encoder): 0 = unchanged,
    1 = moved by its own length. hidden_cosine: the cosine between the two."""

    what: str
    before: Prediction
    after: Prediction
    hidden_change: float
    hidden_cosine: float


TextModel = EncoderModel | CausalLM


def _run(model: TextModel, inputs: str | Sequence[int], keep: Sequence[str], edits: Sequence[Edit]) -> Trace:
    chosen = matching(*keep)
    if isinstance(inputs, str) and not inputs.strip():
        raise InputError("the text is empty: give at least two tokens")
    return model.trace(inputs, keep=chosen, edits=edits)  # both kinds take (inputs, keep=, edits=)


def _target_id(model: TextModel, trace: Trace, target: int | str | None, position: int) -> int:
    labels = trace.meta.labels
    if isinstance(target, int):
        if labels is not None and not 0 <= target < len(labels):
            raise InputError(f"output {target} is outside the head's {len(labels)} outputs")
        return target
    if target is None:
        return int(trace.ranked(1, position)[0][0])
    if labels is not None and target in labels:
        return list(labels).index(target)
    ids = model.tokenizer.encode(target) if model.tokenizer is not None else []
    special = set(getattr(model.tokenizer, "all_special_ids", ()) or ())
    ids = [i for i in ids if i not in special]
    if len(ids) != 1:
        raise InputError(f"{target!r} is not one output of this model: give a token as the predictions name it")
    return ids[0]


def _prediction(trace: Trace, position: int | None, target: int | None, k: int) -> tuple[Prediction, torch.Tensor]:
    """(the prediction at `position`, the final hidden state read there or averaged) of one pass."""
    hidden = trace.tensor(f"{trace.main_stack if trace.kind == 'encoder' else 'decoder'}.out")  # [T, D]
    vector = hidden.mean(0) if position is None else hidden[position]
    if position is None or target is None:
        return Prediction(None, (), None, None), vector
    labels = trace.meta.labels
    if "head.logits" in trace.activations:
        logits = trace.tensor("head.logits")
        scores = head_scores_tensor(logits if logits.ndim == 1 else logits[position], trace.meta.probabilities)
        (p_target,) = to_host([scores[target]])
    else:  # a compact trace (`_reads_out` checked that it ranks the target)
        ids, probs = trace.ranked(_ranked(trace), position)
        p_target = probs[list(ids).index(target)]
    name = str(labels[target]) if labels is not None else str(target)
    return Prediction(position, tuple(trace.predictions(k, position)), name, float(p_target)), vector


def _ranked(trace: Trace) -> int:
    """How many predictions per position a trace can rank: its vocabulary, or a compact trace's kept top ones."""
    if "head.logits" in trace.activations:
        return int(trace.activations["head.logits"].shape[-1])
    return int(trace.activations["head.top_ids"].shape[-1])


def _reads_out(
    trace: Trace, stack: str, names: Sequence[str], position: int | None, target: int | None, k: int
) -> bool:
    """Whether `trace` holds what a knockout's first pass gives: `names`, the final hidden state, and (with a
    prediction followed) the target's probability and the top `k`: a page's cached trace does, once compacted to
    its top 50 tokens, when the target is among them."""
    held = trace.activations
    if any(n not in held for n in (*names, f"{stack}.out")):
        return False
    if position is None or target is None:
        return True
    if "head.logits" in held:
        return True
    if "head.top_ids" not in held or k > _ranked(trace):
        return False
    ids, _ = trace.ranked(_ranked(trace), position)
    return target in set(ids.tolist())


def _first_pass(
    model: TextModel, inputs: str | Sequence[int], stack: str, names: Sequence[str], held: Trace | None, k: int
) -> Trace:
    """The knockout's pass before its edit, keeping `names` too: `held` when it holds what that pass gives."""
    if held is not None and _reads_out(held, stack, names, None, None, k):
        return held
    return _run(model, inputs, (*_READ_OUT, *names), ())


def _knockout(
    model: TextModel,
    inputs: str | Sequence[int],
    what: str,
    edits: Sequence[Edit],
    before: Trace,
    target: int | str | None,
    k: int,
    stack: str,
) -> Knockout:
    position = before.meta.predict_position if before.has_head else None
    if position is not None:
        position %= len(before.tokens)
    elif before.has_head and "head.logits" in before.activations and before.tensor("head.logits").ndim == 1:
        position = 0  # a classifier: one set of scores, read from the first token's final state
    target_id = None if position is None else _target_id(model, before, target, position)
    if not _reads_out(before, stack, (), position, target_id, k):  # a held trace that ranks too few tokens
        before = _run(model, inputs, _READ_OUT, ())
    after = _run(model, inputs, _READ_OUT, edits)
    if list(after.tokens) != list(before.tokens):
        raise InputError("the trace held for the knockout is of another input: give the trace of the same text")
    first, h_before = _prediction(before, position, target_id, k)
    second, h_after = _prediction(after, position, target_id, k)
    with torch.inference_mode():
        a, b = h_before.double(), h_after.double()
        change = (b - a).norm() / a.norm().clamp(min=1e-30)
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=0)
    change_host, cosine_host = to_host([change, cosine])
    return Knockout(what, first, second, float(change_host), float(cosine_host))


def knock_out_activation(
    model: TextModel,
    inputs: str | Sequence[int],
    activation: Activation | tuple[int, int, int],
    value: float | None = None,
    *,
    stack: str | None = None,
    part: str = "resid_pre",
    target: int | str | None = None,
    k: int = 5,
    held: Trace | None = None,
) -> Knockout:
    """Set one activation of the residual stream to a typical value and run the model again (two passes, or one
    with `held`).

    activation: an `Activation` (from `massive_activations`) or (layer, position, dim). value: what it becomes,
    by default the median of the signed values of its layer in this input (the stream's typical number, near 0).
    The edit is made where the activation was measured (`{stack}.{layer}.{part}`), so every later layer reads the
    changed stream. target: the output followed, an id or a label ("ĠParis") or a text of one token (" Paris");
    by default the top-1 before the edit. held: a trace of the same input already at hand (a page's, compacted
    or not), read instead of the first pass when it holds that stream, the final hidden state and the prediction.
    """
    layer, position, dim = (
        (activation.layer, activation.position, activation.dim) if isinstance(activation, Activation) else activation
    )
    stack = stack or ("encoder" if isinstance(model, EncoderModel) else "decoder")
    name = f"{stack}.{layer}.{part}"
    if name not in model.hook_names:
        raise InputError(f"this model has no {name!r} to edit: layers count from 0, parts are resid_pre and resid_post")
    before = _first_pass(model, inputs, stack, (name,), held, k)
    stream = before.tensor(name)
    if not (-stream.shape[0] <= position < stream.shape[0] and -stream.shape[1] <= dim < stream.shape[1]):
        raise InputError(f"[{position}, {dim}] is outside {name}'s {tuple(stream.shape)} (tokens, dimensions)")
    if value is None:
        with torch.inference_mode():
            (median,) = to_host([_median(stream.float().flatten()[None])[0]])
        value = float(median)
    (old,) = to_host([stream[position, dim]])
    what = f"{name}[{position}, {dim}]: {_readable(float(old))} -> {_readable(value)}"
    return _knockout(model, inputs, what, [set_activation(name, position, dim, value)], before, target, k, stack)


def _readable(x: float) -> str:
    """22,552.0 and -0.1319: a large number with its thousands, a small one with four significant digits."""
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.4g}"


def block_sink(
    model: TextModel,
    inputs: str | Sequence[int],
    from_layer: int,
    positions: Sequence[int] = (0,),
    *,
    stack: str | None = None,
    target: int | str | None = None,
    k: int = 5,
    held: Trace | None = None,
) -> Knockout:
    """Stop attention to the key `positions` (by default the first token) in every head of every layer from
    `from_layer` on, and run the model again (two passes). Each row's weight on them is 0 and its other weights
    renormalised (`block_keys`); a query that could attend to nothing else keeps its row. target: as
    `knock_out_activation`; held: as there (one pass instead of two)."""
    stack = stack or ("encoder" if isinstance(model, EncoderModel) else "decoder")
    before = _first_pass(model, inputs, stack, (), held, k)
    n_layers, n = before.stack_layers[stack], len(before.tokens)
    if not 0 <= from_layer < n_layers:
        raise InputError(f"layer {from_layer} is out of range: the {stack} stack has {n_layers} layers")
    chosen = _key_positions(positions, n)
    blocks = [ATTENTION_STACKS[stack].format(layer=layer) for layer in range(from_layer, n_layers)]
    if f"{blocks[0]}.scaled" not in model.hook_names:  # transformers' own code runs it: no softmax input to edit
        raise InputError("this model's attention cannot be edited here: it has no hook point before its softmax")
    where = ", ".join(f"{before.tokens[p]!r} ({p})" for p in chosen)
    what = f"attention to {where} blocked in layers {from_layer}-{n_layers - 1}"
    return _knockout(model, inputs, what, [block_keys(b, chosen) for b in blocks], before, target, k, stack)
