"""What a request will compute, estimated before it runs, so a server can refuse what no class can afford.

    cost = workload.of_passes(model, "decoder", tokens=150, rows=[271] * 30)   # rows through each layer
    cost.flops, cost.describe()                 # "271 batch rows of 150 tokens through 30 layers: 3.6 TFLOP"
    workload.longest(lambda n: probes.head_importance_workload(model, heads, n), limit_flops, 8192)

Why floating-point operations: one student's study of a 120-word text held a server's pass slot for 70 s, and
SmolLM2 accepts 8,192 tokens there (minutes more); what such work costs is rows x tokens x layers, with the
attention growing with the square of the tokens, and a limit in operations says the same on every model and
every device (a CPU runs tens of GFLOP a second, a GPU thousands). The estimate counts the matrix products of
every block (2 operations a weight a token) and of the attention (QKᵀ and the weights times V: 4 x keys x the
heads' width a token); embeddings, norms and the softmax are left out (a few percent), and so is the
unembedding but for the positions a request reads (`head_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from .errors import InputError
from .models.layers import MultiHeadAttention

__all__ = [
    "TooMuchWork",
    "Workload",
    "check",
    "cross_kv_flops",
    "head_flops",
    "layer_flops",
    "longest",
    "of_passes",
    "stack_layers",
]


@dataclass(frozen=True)
class Workload:
    """An estimate: `rows` batch rows in all (each a whole or a partial pass, as run), of `tokens` positions,
    through `layers` layers at most; `flops` floating-point operations in all. what: the work, in words."""

    what: str
    rows: int
    tokens: int
    layers: int
    flops: float

    def describe(self) -> str:
        rows = f"{self.rows:,} batch row{'s' if self.rows != 1 else ''}"
        return f"{rows} of {self.tokens:,} tokens through up to {self.layers} layers: {_flops(self.flops)}"


class TooMuchWork(InputError):
    """A request estimated above the server's limit (the message says what would fit)."""


def _flops(flops: float) -> str:
    return f"{flops / 1e12:.3g} TFLOP" if flops >= 1e12 else f"{flops / 1e9:.3g} GFLOP"


def _blocks(model: nn.Module, stack: str) -> list[nn.Module]:
    part = getattr(model, stack, None)
    blocks = getattr(part, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"this model has no stack of blocks named {stack!r}")
    return list(blocks)


def stack_layers(model: nn.Module, stack: str) -> int:
    """The number of layers (blocks) of `stack` ("encoder" or "decoder")."""
    return len(_blocks(model, stack))


def _cross(block: nn.Module) -> MultiHeadAttention | None:
    cross = getattr(block, "cross_attn", None)
    return cross if isinstance(cross, MultiHeadAttention) else None


def layer_flops(model: nn.Module, stack: str, tokens: int, memory: int = 0) -> float:
    """Operations one token costs in one layer of `stack` when `tokens` positions run (mean over the layers):
    2 a weight of the block's matrices, plus 4 x keys x (heads x d_head) for each attention's QKᵀ and weights x V
    (keys: `tokens`, the longest a self-attention reads; a cross-attention's: the `memory` positions of the encoder,
    whose keys and values it computes once a pass and a memory row: `cross_kv_flops`)."""
    blocks = _blocks(model, stack)
    total = 0.0
    for block in blocks:
        cross = _cross(block)
        weights = sum(p.numel() for p in block.parameters() if p.dim() >= 2)  # matrices; biases and norms aside
        if cross is not None:
            weights -= cross.W_k.weight.numel() + cross.W_v.weight.numel()
        total += 2.0 * weights
        for m in block.modules():
            if isinstance(m, MultiHeadAttention):
                total += 4.0 * (memory if m is cross else tokens) * m.n_heads * m.d_head
    return total / len(blocks)


def cross_kv_flops(model: nn.Module, stack: str, memory: int) -> float:
    """Operations of the keys and values every cross-attention of `stack` computes from `memory` encoder
    positions, for one row of the encoder's output (a pass computes them once a row of its memory)."""
    total = 0.0
    for block in _blocks(model, stack):
        cross = _cross(block)
        if cross is not None:
            total += 2.0 * memory * (cross.W_k.weight.numel() + cross.W_v.weight.numel())
    return total


def of_passes(
    model: nn.Module,
    stack: str,
    tokens: int,
    rows: Sequence[int],
    what: str = "a forward pass",
    head_rows: int = 0,
    memory: int = 0,
) -> Workload:
    """The work of passes through `stack`: rows[l] batch rows of `tokens` positions through layer l, summed over
    every pass (a pass that grows its batch at layer l, `interventions.branch`, has more rows after it). The rows
    counted are the most any layer runs; head_rows: rows whose last position goes through the output head;
    memory: the encoder positions a decoder's cross-attention reads."""
    flops = sum(rows) * tokens * layer_flops(model, stack, tokens, memory) + head_flops(model, head_rows)
    return Workload(what, max(rows, default=0), tokens, len(rows), float(flops))


def head_flops(model: nn.Module, rows: int) -> float:
    """Operations of the output head (a language model's unembedding, a classifier) for one position of `rows`
    batch rows: 2 a weight of its matrices; 0 for a model without one."""
    head = getattr(model, "head", None)
    if not rows or not isinstance(head, nn.Module):
        return 0.0
    return 2.0 * rows * sum(p.numel() for p in head.parameters() if p.dim() >= 2)


def longest(estimate: Callable[[int], Workload], limit_flops: float, most: int) -> int:
    """The most tokens (1..most) whose estimate stays within `limit_flops` (0 when even one does not): the
    estimates grow with the tokens, so a bisection finds it."""
    if estimate(1).flops > limit_flops:
        return 0
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(mid).flops <= limit_flops:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check(cost: Workload, limit_flops: float, setting: str, fits: str = "") -> None:
    """TooMuchWork (an InputError: the page says it) when `cost` is above `limit_flops`; its message says the
    work, the limit, the setting that names it and, given, what would fit (e.g. "a text of at most 37 tokens")."""
    if cost.flops <= limit_flops:
        return
    hint = f" {fits[0].upper()}{fits[1:]} fits." if fits else ""
    raise TooMuchWork(
        f"{cost.what} would run {cost.describe()}, more than this server computes for one request "
        f"({_flops(limit_flops)}, {setting}).{hint}"
    )
