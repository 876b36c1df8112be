"""`Trace`: everything one forward pass computed, for one input, kept on the model's device.

One format for every model kind. Activations are keyed by where they come from:

    {stack}.embed.tok | pos | out          token embeddings, positional encodings, layer-0 input
    {stack}.{layer}.resid_pre              residual stream entering the block
    {stack}.{layer}.attn.q | k | v         [heads, tokens, d_head]; K and V [kv_heads, tokens, d_head] (below)
    {stack}.{layer}.attn.q_pre_rope | k_pre_rope   rotary models: Q and K before the rotation by position
                                           (attn.q and attn.k are after it, as the scores use them)
    {stack}.{layer}.attn.scores            Q K^T                           [heads, n_q, n_k]
    {stack}.{layer}.attn.scaled            softmax input: scores * scale (+ bias), masked = -inf
    {stack}.{layer}.attn.weights           softmax of each row              [heads, n_q, n_k]
    {stack}.{layer}.attn.mask              True where attending is allowed  [1, n_q, n_k] (masked models)
    {stack}.position_bias                  T5's relative position bias      [heads, n, n]
    {stack}.{layer}.attn.z                 weights V per head               [heads, n_q, d_head]
    {stack}.{layer}.attn.out               concat(z) W^O                    [n_q, d_model]
    decoder.{layer}.cross_attn.*           the same for encoder-decoder cross-attention
    {stack}.{layer}.resid_after_attn | resid_after_cross | resid_post, ln_attn | ln_cross | ln_mlp
    {stack}.{layer}.mlp.hidden | out       FFN hidden layer (after activation), FFN output
    {stack}.out                            final hidden states;  head.logits when there is a head

`trace.names` lists everything a trace offers. The batch dimension is gone.

Where the numbers live: a trace holds the model's own tensors, on its device (a GPU's memory) and in its
dtype (bfloat16 stays bfloat16): capturing copies nothing. What a view reads is copied to the host when it
reads it, and only that: `trace[name]`, `trace.attention(l, h)`... give read-only numpy (half precision
widened to float32), and `trace.fetch(*names)` several in one transfer. Reductions over many layers and heads
(the views' thumbnails, distances, a query's row everywhere, top-k predictions) run where the tensors are,
from `trace.tensor(name)` / `trace.block_tensor(...)`, and copy their small result once (`to_host`: the one
conversion to numpy). Arrays are read-only because one trace may be cached and shown to several sessions.

Scores and scaled scores are not stored by default: they are recomputed from the stored Q, K,
scale, bias and mask when asked for (the softmax of the result reproduces the stored weights).
That keeps a trace at about a third of the attention memory, which matters for long inputs,
batches and a server that caches traces. Pass a `keep` filter that names them to store them.

Grouped-query attention (Llama-family models with n_kv_heads < n_heads): K and V are stored as the model
computes them, one per key/value head ([kv_heads, tokens, d_head]); query head h reads key/value head
`trace.kv_head(h)` = h // (n_heads / n_kv_heads), and `trace.k(layer, h)`, `trace.v(layer, h)` give that
head's. `trace.query_heads(g)` lists the query heads that share key/value head g.

A decoder step run against a key/value cache (generation) has queries for its new token only:
`meta.query_start` is that token's position, attention is [heads, 1, n_keys], and `tokens` names every
key position (`tokens_for` gives (new token, all tokens)). Its attn.mask is there only where something is
hidden from it (a sliding window): the newest token may attend to every earlier one.

`trace.compact()` goes further for a cache: the weights are dropped too wherever Q and K are
stored, and recomputed from them when read (attention grows with the square of the input, Q, K
and V only linearly: at 512 tokens MiniLM's weights take 5x the memory of its Q, K and V), and
predictions over a vocabulary keep each position's top tokens instead of every logit. The head
outputs z stay stored: they are linear in the input, and a view compares them with weights @ V.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from .attention import attention_logits, attention_weights, grouped_matmul
from .capture import matching
from .errors import InputError
from .numerics import top_k_scores

__all__ = [
    "ATTENTION_STACKS",
    "CROSS_ATTENDING",
    "DERIVED_PARTS",
    "HOST_DEVICE_TYPES",
    "KV_PARTS",
    "QUADRATIC_PARTS",
    "TOP_K",
    "TOP_K_ROWS",
    "TWO_SEQUENCES",
    "BatchRow",
    "Trace",
    "TraceMeta",
    "lean",
    "reduces_on_device",
    "stored_by_default",
    "tensor_bytes",
    "to_host",
    "to_numpy",
    "top_k_tokens",
]

# Attention stacks a trace may hold, and the activation prefix of each.
ATTENTION_STACKS = {
    "encoder": "encoder.{layer}.attn",
    "decoder": "decoder.{layer}.attn",
    "cross": "decoder.{layer}.cross_attn",
}
DERIVED_PARTS = ("scores", "scaled", "weights", "z")  # what a trace can recompute from Q, K (and V)
KV_PARTS = ("k", "v", "k_pre_rope")  # one per key/value head: fewer than the query heads with grouped-query attention
TOP_K = 50  # predictions a compact trace keeps per position
TOP_K_ROWS = 16  # positions whose probabilities over a vocabulary are computed at once (`top_k_tokens`)
# Kinds whose trace holds two sequences, `tokens` (the encoder's) and `target_tokens` (the decoder's); in the
# first two the decoder reads the encoder through cross-attention (MAE's decoder reads every patch instead).
CROSS_ATTENDING = ("encoder-decoder", "detr")
TWO_SEQUENCES = (*CROSS_ATTENDING, "mae")


_SCORES = matching("**.scores", "**.scaled")


def stored_by_default(name: str) -> bool:
    """The default capture filter: everything except what the trace can recompute from Q and K."""
    return not _SCORES(name)


QUADRATIC_PARTS = ("scores", "scaled", "weights")  # [heads, n_q, n_k]: what grows with the input's square
_QUADRATIC = matching(*(f"**.{part}" for part in QUADRATIC_PARTS))
_ATTENTION_V = matching("**.attn.v", "**.cross_attn.v")


def lean(name: str) -> bool:
    """A capture filter for traces that will be cached: none of the [heads, n, n] parts of attention
    (scores, softmax input, weights), which the trace recomputes from Q and K when they are read."""
    return not _QUADRATIC(name)


# ---- the one way from a trace's tensors to numpy --------------------------------------------------------
_WIDENED = {torch.bfloat16: torch.float32, torch.float16: torch.float32}  # numpy has no bfloat16
_HOST_ALIGN = 8  # bytes: every array cut from a packed transfer starts on a multiple of this


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _widened(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    wide = _WIDENED.get(t.dtype)
    return t if wide is None else t.to(wide)


def _one_transfer(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Tensors of one accelerator, packed into one byte buffer there and copied to the host at once."""
    ready = [_widened(t).contiguous() for t in tensors]
    if len(ready) == 1:
        return [_read_only(ready[0].cpu().numpy())]
    chunks, offsets, offset = [], [], 0
    for t in ready:
        flat = t.reshape(-1).view(torch.uint8)
        pad = -flat.numel() % _HOST_ALIGN
        chunks += [flat, flat.new_zeros(pad)] if pad else [flat]
        offsets.append(offset)
        offset += flat.numel() + pad
    host = torch.cat(chunks).cpu().numpy()
    return [
        _read_only(host[start : start + t.numel() * t.element_size()].view(_numpy_dtype(t.dtype)).reshape(t.shape))
        for start, t in zip(offsets, ready)
    ]


def to_host(tensors: Iterable[torch.Tensor]) -> list[np.ndarray]:
    """The one place a trace's tensors become numpy: read-only host arrays of `tensors`, in one transfer.

    bfloat16 and float16 are widened to float32 (numpy has neither bfloat16 nor fast float16 arithmetic). On the
    CPU the arrays share the tensors' memory (nothing is copied unless widened). Tensors on an accelerator are
    widened there and packed into one buffer, which is copied to the host in one transfer, not one per tensor:
    a view that reads several activations asks for them together (`Trace.fetch`).
    """
    tensors = list(tensors)
    out: list[np.ndarray | None] = [None] * len(tensors)
    per_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.device.type == "cpu":
            out[i] = _read_only(_widened(t).numpy())
        else:
            per_device.setdefault(t.device, []).append(i)
    for indices in per_device.values():
        for i, array in zip(indices, _one_transfer([tensors[i] for i in indices])):
            out[i] = array
    return [a for a in out if a is not None]


# Devices whose tensors views reduce with numpy, over zero-copy views, instead of with torch: on the CPU the numbers
# are already in host memory, and numpy's single-threaded loops do not stall as torch's parallel kernels do on a
# server whose cores are busy with other sessions (a 2 MB stack: 0.2 ms alone, 100 ms on two busy cores).
HOST_DEVICE_TYPES = ("cpu",)


def reduces_on_device(device: torch.device) -> bool:
    """Whether views reduce a trace on this device with torch (a GPU: only the small result crosses to the host),
    rather than with numpy over its zero-copy arrays (the CPU)."""
    return device.type not in HOST_DEVICE_TYPES


def top_k_tokens(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's k most probable token ids [positions, k] (int32) and their probabilities (float32), most
    probable first (ties: the lower id first), on the logits' device. TOP_K_ROWS positions at a time: a softmax
    and its sort over a whole [positions, vocab] table took 5 copies of it at once (300 MB for smollm2's 49,152
    tokens at 200 positions), per request."""
    with torch.inference_mode():
        tops = [top_k_scores(rows, k) for rows in logits.split(TOP_K_ROWS)]
        return torch.cat([ids for ids, _ in tops]).to(torch.int32), torch.cat([p for _, p in tops]).to(torch.float32)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A read-only host numpy array of one tensor (half precision widened to float32): `to_host` of one."""
    return to_host([t])[0]


def _as_tensor(a: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A stored activation as a tensor: a numpy array (a trace built by hand) is shared, not copied."""
    if isinstance(a, torch.Tensor):
        return a.detach()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": the trace never writes to it
        return torch.from_numpy(np.asarray(a))


class BatchRow(Mapping[str, torch.Tensor]):
    """One element of a batched pass's captured tensors, read lazily: `row[name]` is `batch[name][index]`, sliced
    when first read. Why lazy: a traced batch of 64 pictures holds about 160 tensors per picture, and slicing all
    10,000 views up front costs 15-20 ms of host time, as much as the whole bfloat16 pass of ViT-B/16 on a GPU
    (measured on an H200: 2.55x transformers' time, 1.06x with the slicing gone). A view reads a few of them."""

    def __init__(self, batch: Mapping[str, torch.Tensor], index: int) -> None:
        self._batch = batch
        self._index = index
        self._rows: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = self._batch[name][self._index]
        return row

    def __contains__(self, name: object) -> bool:
        return name in self._batch

    def __iter__(self) -> Iterator[str]:
        return iter(self._batch)

    def __len__(self) -> int:
        return len(self._batch)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the tensors hold; views of one buffer count once, and at the size of that buffer."""
    seen: dict[tuple[torch.device, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        # A storage without an address (the meta device: shapes only) is counted per tensor.
        key = (t.device, storage.data_ptr() or -id(t))
        seen[key] = max(seen.get(key, 0), storage.nbytes())
    return sum(seen.values())


def _own(t: torch.Tensor, copies: dict[tuple, torch.Tensor]) -> torch.Tensor:
    """`t` itself, or a copy when it is a view into a bigger buffer (a row of a batch, a key/value cache). One
    tensor recorded under two names (a layer's output is the next layer's input) is copied once (`copies`)."""
    if t.untyped_storage().nbytes() <= t.numel() * t.element_size():
        return t
    key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
    if key not in copies:
        copies[key] = t.clone()
    return copies[key]


@dataclass(frozen=True)
class TraceMeta:
    """What a trace says about its pass besides the arrays, typed.

    path: who ran the model, "tformer" (the core's modules) or "transformers". labels: a label per output of
    the head (vocabulary tokens or class names), or None. attention_scale: what Q K^T is multiplied by before
    the softmax. n_kv_heads: key/value heads per layer (grouped-query attention), None for as many as the query
    heads. predict_position: the position whose prediction `Trace.predictions` shows by default (-1: the last;
    an encoder's first [MASK]; None: none). mask_positions: every [MASK] of an encoder's input. query_start:
    the first query position (a generation step against a key/value cache has its new token only). head:
    "masked-word", "next-token", "classification" or None. problem_type: a classifier's (transformers'
    problem_type), probabilities: how its logits become scores ("softmax", "sigmoid", "none"). architecture,
    absent, absent_parts, dropped_head: a model transformers runs: its class, what its traces cannot hold
    (a sentence and the activation parts), an architecture whose head was left out. stack_heads,
    stack_scales: the heads and the attention_scale of a stack that has its own ({"decoder": 16}: MAE's
    decoder has other heads than its encoder); every other stack has the trace's n_heads and attention_scale.

    Read by attribute (`trace.meta.query_start`); `meta["path"]` and `meta.get("path", default)` also work,
    for code written when meta was a dict (`get` gives `default` for a field left at None).
    """

    path: str = "tformer"
    labels: Sequence[str] | None = None
    attention_scale: float = 1.0
    n_kv_heads: int | None = None
    predict_position: int | None = None
    mask_positions: Sequence[int] = ()
    query_start: int = 0
    head: str | None = None
    problem_type: str | None = None
    probabilities: str = "softmax"
    architecture: str | None = None
    absent: str | None = None
    absent_parts: tuple[str, ...] = ()
    dropped_head: str | None = None
    stack_heads: Mapping[str, int] = field(default_factory=dict)
    stack_scales: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, meta: TraceMeta | Mapping[str, Any] | None) -> TraceMeta:
        """`meta` itself, or a TraceMeta of the fields a mapping names (TypeError for a name that is not one)."""
        if isinstance(meta, TraceMeta):
            return meta
        return cls(**dict(meta or {}))

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in _META_FIELDS

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self else None
        return default if value is None else value


_META_FIELDS = frozenset(f.name for f in fields(TraceMeta))


@dataclass(frozen=True, eq=False)
class Trace:
    """Captured activations of one input.

    kind: the model's (`TracedModel.kind`): "encoder" | "decoder" | "encoder-decoder" | "vit" | "mae" | "detr" |
        "pooling" | "rnn-seq2seq".
    activations: name -> tensor, on the model's device in the model's dtype, batch dimension dropped (numpy
        arrays given here, for a trace built by hand, are held as CPU tensors sharing their memory).
    tokens: labels of the first stack's positions (text tokens; for a ViT "[CLS]", "[DIST]",
        then one "r{row}c{col}" per patch); target_tokens: the decoder's positions of a kind with two
        sequences (`TWO_SEQUENCES`: an encoder-decoder's target, DETR's object queries, MAE's every patch).
    n_heads: attention heads of the main stack (a stack with its own number: `heads_in`).
    stack_layers: number of layers per stack, e.g. {"encoder": 6, "decoder": 6}.
    grid_hw, patch_size, n_prefix_tokens: the ViT patch grid (rows, cols), patch side in pixels
        and the number of tokens before the patches (class token, distillation token).
    meta: what the pass says besides its arrays (`TraceMeta`; a mapping of its fields is converted).

    Reading gives read-only numpy (`trace[name]`, `attention`, `q`, `block`...), copied to the host when read and
    only what is read: `fetch(*names)` reads several in one transfer. `tensor(name)` gives the tensor itself,
    on the device (derived parts computed there), for code that computes with torch.
    """

    kind: str
    activations: Mapping[str, torch.Tensor]
    tokens: tuple[str, ...]
    n_heads: int
    stack_layers: Mapping[str, int]
    target_tokens: tuple[str, ...] | None = None
    grid_hw: tuple[int, int] | None = None
    patch_size: int | None = None
    n_prefix_tokens: int = 0
    meta: TraceMeta = field(default_factory=TraceMeta)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, TraceMeta):
            object.__setattr__(self, "meta", TraceMeta.of(self.meta))
        if not isinstance(self.activations, BatchRow) and not all(
            isinstance(t, torch.Tensor) for t in self.activations.values()
        ):
            object.__setattr__(self, "activations", {n: _as_tensor(a) for n, a in self.activations.items()})

    # ---- generic access -------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        return to_host([self._get(name)])[0]

    def tensor(self, name: str, head: int | None = None) -> torch.Tensor:
        """An activation (stored, or derived on the device from Q, K and V) as a torch tensor on the trace's
        device, in the model's dtype; with `head` (a query head) only that head's. The trace's own memory when
        stored (it may be cached and shared): read it, do not modify it."""
        return self._get(name, None if head is None else self._check_head(head))

    def fetch(self, *names: str) -> tuple[np.ndarray, ...]:
        """Several activations as numpy, copied to the host together (one transfer from a GPU)."""
        return tuple(to_host([self._get(name) for name in names]))

    @property
    def device(self) -> torch.device:
        """Where the activations are (all on one device: the model's); the CPU for a trace without any."""
        first = next(iter(self.activations.values()), None)
        return torch.device("cpu") if first is None else first.device

    def _get(self, name: str, head: int | None = None) -> torch.Tensor:
        """A stored or derivable activation; with `head` (a query head), only that head (derived only for that
        head); K and V of a grouped-query model give the key/value head that query head reads."""
        if name in self.activations:
            tensor = self.activations[name]
            if head is not None and name.rpartition(".")[2] in KV_PARTS and tensor.shape[0] != self._heads_of(name):
                head = self.kv_head(head)
            return tensor if head is None else tensor[head]
        if not self._derivable(name):
            raise KeyError(f"{name!r} was not captured; see trace.names")
        return self._derive(name, head)

    def __contains__(self, name: object) -> bool:
        return name in self.activations or (isinstance(name, str) and self._derivable(name))

    @property
    def names(self) -> list[str]:
        """Every activation the trace offers: the stored ones, with the derivable parts of an attention
        block (scores, softmax input, weights, head outputs) after its V."""
        names = []
        for name in self.activations:
            names.append(name)
            if _ATTENTION_V(name):
                prefix = name[: -len(".v")]
                names += [f"{prefix}.{p}" for p in DERIVED_PARTS if f"{prefix}.{p}" not in self.activations]
        return names

    @property
    def nbytes(self) -> int:
        """Bytes the stored activations hold (what caching this trace costs), on `device`."""
        return tensor_bytes(self.activations.values())

    def _derivable(self, name: str) -> bool:
        prefix, _, part = name.rpartition(".")
        if part not in DERIVED_PARTS or name in self.activations:
            return False
        has = self.activations.__contains__
        if part == "z":
            return has(f"{prefix}.v") and (has(f"{prefix}.weights") or (has(f"{prefix}.q") and has(f"{prefix}.k")))
        return has(f"{prefix}.q") and has(f"{prefix}.k")

    def _derive(self, name: str, head: int | None = None) -> torch.Tensor:
        """A part of an attention block recomputed from the stored Q, K, V as the model computes it, on the
        trace's device in its dtype (tformer_core.attention's rule, which the model ran): scores Q K^T; the
        softmax input (scores * scale + T5's bias, masked cells -inf); the weights (its row-wise softmax, in
        float32 for half precision; a query that may attend to nothing gets 0); z = weights V.
        With `head`, only that head is computed (a view change reads one head of a long input)."""
        prefix, _, part = name.rpartition(".")
        with torch.inference_mode():
            if part == "z":
                return grouped_matmul(self._get(f"{prefix}.weights", head), self._get(f"{prefix}.v", head))
            q, k = self._get(f"{prefix}.q", head), self._get(f"{prefix}.k", head)
            scores = grouped_matmul(q, k.transpose(-2, -1))  # [h, n_q, n_k], or [n_q, n_k] for one head
            if part == "scores":
                return scores
            mask = self.activations.get(f"{prefix}.mask")
            allowed = mask if mask is None or head is None else mask[0]  # [1, n_q, n_k]: shared by the heads
            scale = self.meta.stack_scales.get(prefix.split(".")[0], self.meta.attention_scale)  # MAE's decoder
            logits = attention_logits(scores, scale, self._bias(prefix, head), allowed)
            return logits if part == "scaled" else attention_weights(logits, allowed)

    def _bias(self, prefix: str, head: int | None = None) -> torch.Tensor | None:
        """T5's relative position bias of the attention block `prefix`: self-attention only, never cross-attention."""
        bias = self.activations.get(f"{prefix.split('.')[0]}.position_bias")
        if bias is None or prefix.endswith("cross_attn"):
            return None
        return bias if head is None else bias[head]

    def attention_bias(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray | None:
        """What is added to the scaled scores of an attention block besides the mask: T5's relative position bias
        [heads, n_q, n_k] (one head's [n_q, n_k]) for self-attention; None for cross-attention (T5 biases
        self-attention only) and for a model without one."""
        bias = self.attention_bias_tensor(layer, head, stack)
        return None if bias is None else to_host([bias])[0]

    def attention_bias_tensor(
        self, layer: int, head: int | None = None, stack: str | None = None
    ) -> torch.Tensor | None:
        """`attention_bias` as a tensor on the trace's device (see `tensor`)."""
        return self._bias(self._block(stack, layer), None if head is None else self._check_head(head, stack))

    def heads_in(self, stack: str | None = None) -> int:
        """Query heads of an attention stack ("encoder", "decoder" or "cross"; default: the main stack): n_heads,
        or the stack's own number (`meta.stack_heads`)."""
        stack = stack or self.main_stack
        return self.meta.stack_heads.get("decoder" if stack == "cross" else stack, self.n_heads)

    def _heads_of(self, name: str) -> int:
        return self.meta.stack_heads.get(name.split(".")[0], self.n_heads)  # "decoder.0.cross_attn.k": the decoder's

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer: fewer than n_heads with grouped-query attention, else n_heads."""
        return self.meta.n_kv_heads or self.n_heads

    def kv_head(self, head: int) -> int:
        """The key/value head query head `head` reads (itself unless the attention is grouped-query)."""
        head = self._check_head(head)
        return head // (self.n_heads // self.n_kv_heads)

    def query_heads(self, kv_head: int) -> tuple[int, ...]:
        """The query heads that read key/value head `kv_head` (they share its K and V)."""
        if not -self.n_kv_heads <= kv_head < self.n_kv_heads:
            raise InputError(f"key/value head {kv_head} is out of range: the model has {self.n_kv_heads}")
        group = self.n_heads // self.n_kv_heads
        start = (kv_head % self.n_kv_heads) * group
        return tuple(range(start, start + group))

    @property
    def patch_grid(self) -> tuple[int, int]:
        """(rows, cols) of an image trace's patch grid; ValueError for a trace of text."""
        if self.grid_hw is None:
            raise InputError(f"this {self.kind} trace is not of an image: it has no patch grid")
        return self.grid_hw

    @property
    def patch_side(self) -> int:
        """The side of an image trace's patches in pixels; ValueError for a trace of text."""
        if self.patch_size is None:
            raise InputError(f"this {self.kind} trace is not of an image: it has no patches")
        return self.patch_size

    @property
    def main_stack(self) -> str:
        """The stack shown first: the encoder when the trace holds one, else the decoder."""
        return "encoder" if "encoder" in self.stack_layers else "decoder"

    @property
    def n_layers(self) -> int:
        """Layers of the main stack (the encoder, or the decoder of a decoder-only model)."""
        return self.stack_layers[self.main_stack]

    @property
    def attention_stacks(self) -> tuple[str, ...]:
        """The attention stacks this trace holds: ("encoder",), ("decoder",), ("encoder", "decoder", "cross"),
        or ("decoder", "cross") for an encoder-decoder generation step (the encoder ran once, before)."""
        stacks = tuple(s for s in ("encoder", "decoder") if s in self.stack_layers)
        if self.kind in CROSS_ATTENDING and "decoder" in self.stack_layers:
            stacks += ("cross",)
        return stacks

    def layers_in(self, stack: str) -> int:
        return self.stack_layers["decoder" if stack == "cross" else stack]

    @property
    def output(self) -> np.ndarray:
        """The model's output: head logits when it has a head, else the final hidden states."""
        if "head.logits" in self.activations:
            return self["head.logits"]
        last = "decoder" if "decoder" in self.stack_layers else "encoder"
        return self[f"{last}.out"]

    @property
    def has_head(self) -> bool:
        """True when the model's own head ran (classifier, language-model or masked-word head)."""
        return "head.logits" in self.activations or "head.top_ids" in self.activations

    def ranked(self, k: int = 5, position: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the head's top-k outputs, most probable first (ties: the lower id first); see
        `predictions`. Ranked on the trace's device; only the k pairs are copied to the host.

        A compact trace keeps TOP_K per position: asking for more gives those.
        """
        if not self.has_head:
            raise InputError("this model has no prediction head (no classifier, language-model or masked-word head)")
        per_position = self.activations.get("head.logits", self.activations.get("head.top_ids"))
        if per_position is not None and per_position.ndim == 2:
            if position is None:
                position = self.meta.predict_position
            if position is None:
                raise InputError("no [MASK] token in the input: put [MASK] where a word should be guessed")
        k = max(int(k), 0)
        if "head.logits" not in self.activations:  # a compact trace: each position's top tokens
            ids, probs = (
                self.activations["head.top_ids"][position, :k],
                self.activations["head.top_probs"][position, :k],
            )
        else:
            logits = self.activations["head.logits"]
            row = logits if logits.ndim == 1 else logits[position]
            ids, probs = top_k_scores(row, k, self.meta.probabilities)  # multi-label: sigmoid; regression: none
        host_ids, host_probs = to_host([ids, probs])
        return host_ids.astype(np.int64), host_probs.astype(np.float64)

    def predictions(self, k: int = 5, position: int | None = None) -> list[tuple[str, float]]:
        """Top-k (label, probability) from the model's own head.

        ViT: classes of the image. Decoder-only and encoder-decoder: the next token after
        `position` (default: the last). BERT with a masked-LM head: candidates for the [MASK] at
        `position` (default: the first [MASK] of the input).
        """
        ids, probs = self.ranked(k, position)
        labels = self.meta.labels
        return [(str(labels[i]) if labels is not None else str(i), float(p)) for i, p in zip(ids, probs)]

    def compact(self, keep: Callable[[str], bool] | None = None, top_k: int = TOP_K) -> Trace:
        """A smaller trace with the same answers, for caches, on the same device (nothing is copied to the host).

        - Attention weights, scores and softmax inputs ([heads, n, n] each) are dropped wherever Q and K
          are stored: reading them recomputes them (`trace.attention(...)` and friends work as before).
        - `keep` (a name filter) drops what the caller never reads (e.g. the FFN's hidden layer).
        - Logits over a vocabulary ([positions, vocab]) become each position's `top_k` token ids and
          probabilities ("head.top_ids", "head.top_probs"), which `predictions` and `ranked` read.
        - Views into a bigger buffer (a batch, a key/value cache) are copied, so the trace does not keep it alive.
        """
        kept: dict[str, torch.Tensor] = {}
        copies: dict[tuple, torch.Tensor] = {}
        for name, tensor in self.activations.items():
            prefix, _, part = name.rpartition(".")
            recomputable = (
                part in QUADRATIC_PARTS and f"{prefix}.q" in self.activations and f"{prefix}.k" in self.activations
            )
            if recomputable or (keep is not None and not keep(name)) or name == "head.logits":
                continue
            kept[name] = _own(tensor, copies)
        logits = self.activations.get("head.logits")
        if logits is not None and logits.ndim == 2 and logits.shape[1] > top_k:
            kept["head.top_ids"], kept["head.top_probs"] = top_k_tokens(logits, top_k)  # on the device
        elif logits is not None:
            kept["head.logits"] = _own(logits, copies)
        return replace(self, activations=kept)

    # ---- attention blocks ------------------------------------------------------------------
    def _block(self, stack: str | None, layer: int) -> str:
        stack = stack or self.main_stack
        if stack not in self.attention_stacks:
            raise InputError(f"this {self.kind} trace has no {stack!r} attention; it has {self.attention_stacks}")
        n = self.layers_in(stack)
        if not -n <= layer < n:
            raise InputError(f"layer {layer} is out of range: the {stack} stack has {n} layers (0..{n - 1})")
        return ATTENTION_STACKS[stack].format(layer=layer % n)

    def _check_head(self, head: int, stack: str | None = None) -> int:
        n = self.heads_in(stack)
        if not -n <= head < n:
            raise InputError(f"head {head} is out of range: the model has {n} heads (0..{n - 1})")
        return head % n

    def block_tensor(self, part: str, layer: int, head: int | None = None, stack: str | None = None) -> torch.Tensor:
        """`block`'s part as a torch tensor on the trace's device (see `tensor`)."""
        name = f"{self._block(stack, layer)}.{part}"
        return self._get(name, None if head is None else self._check_head(head, stack))

    def block(self, part: str, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """One captured part (q, k, v, scores, scaled, weights, z) of an attention block.

        With `head` None the head axis is kept. `stack` defaults to the main stack.
        """
        return to_host([self.block_tensor(part, layer, head, stack)])[0]

    def attention(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Attention weights [n_q, n_k] (rows sum to 1), or [heads, n_q, n_k] when head is None."""
        return self.block("weights", layer, head, stack)

    def q(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Queries [n_q, d_head] of one head."""
        return self.block("q", layer, head, stack)

    def k(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Keys [n_k, d_head] that query head `head` reads (with grouped-query attention, those of its
        key/value head `kv_head(head)`); with head None, every key/value head's [kv_heads, n_k, d_head]."""
        return self.block("k", layer, head, stack)

    def v(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Values [n_k, d_head] that query head `head` reads; with head None [kv_heads, n_k, d_head] (see `k`)."""
        return self.block("v", layer, head, stack)

    def all_attention(self, stack: str | None = None) -> np.ndarray:
        """Every layer's weights stacked: [layers, heads, n_q, n_k] (stacked on a GPU and copied in one transfer)."""
        stack = stack or self.main_stack
        layers = range(self.layers_in(stack))
        if not reduces_on_device(self.device):
            return np.stack(to_host([self.block_tensor("weights", layer, None, stack) for layer in layers]))
        with torch.inference_mode():
            stacked = torch.stack([self.block_tensor("weights", layer, None, stack) for layer in layers])
        return to_host([stacked])[0]

    def tokens_for(self, stack: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query labels, key labels) of an attention stack: cross-attention is target x source; the decoder of a
        kind with two sequences reads its own (an encoder-decoder's target, DETR's queries, MAE's every patch)."""
        stack = stack or self.main_stack
        if self.kind not in TWO_SEQUENCES:
            start = self.meta.query_start  # a cached generation step: its new token only
            return self.tokens[start:], self.tokens
        target = self.target_tokens or ()
        if stack == "encoder":
            return self.tokens, self.tokens
        if stack == "decoder":
            return target, target
        return target, self.tokens
