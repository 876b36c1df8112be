"""Interventions: change an activation during one forward pass and see what follows from it.

    import tformer_core as tc
    from tformer_core.interventions import Edit, Head, ablate_heads, patch

    model = tc.load_model("smollm2")
    ablated = model.trace("The capital of France is", edits=ablate_heads([Head("decoder", 3, 5)]))
    # head 5 of layer 3 contributes nothing
    italy = model.trace("The capital of Italy is")
    patched = model.trace("The capital of France is", edits=[patch("decoder.4.resid_pre", italy, {3: 3})])
    # position 3 of layer 4's input (" France") taken from the other input's trace (" Italy")
    with model.intervene([Edit("decoder.3.attn.z", lambda z, hook: z * 0.5)]):
        continuation = model.generate("The capital of France is", 5)  # every pass: layer 3's heads halved
    model.trace("The capital of France is", edits=[Edit("decoder.3.atn.z", lambda z, hook: z)])
    # HookNameError: no hook point "decoder.3.atn.z" in this model; closest: "decoder.3.attn.z", ...

An edit (`capture.Edit`) is a function `apply(x, hook)` applied at one named hook point: the activation names
are a trace's (`trace.names`, `model.hook_names`), the tensors batched ((B, T, D) residual streams, (B, h, T, dh)
head outputs z), and `hook` says where it is applied (`hook.name`, `hook.stack`, `hook.layer`). The model checks
every name before anything runs: a name it has no hook point for raises `errors.HookNameError`, which names the
closest ones (`check_names`). As with capture, the edits live in a context variable of the calling thread: the
shared model is never modified, and a request running beside another sees only its own edits. Blocks nest: an
enclosing block's edits apply first.

Ablating a head replaces its output z (before W_O, the head's share of the attention output) with zeros,
or with its mean over the positions of the input; scaling multiplies it. `branch` grows the batch at a hook
point (rows that are copies of row 0 from there on), which is how `probes.head_importance` runs one pass
whose rows ablate a different head each, the layers below each ablation computed once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np
import torch

from .capture import Edit, Hook
from .errors import HookNameError
from .trace import ATTENTION_STACKS, Trace

__all__ = ["Edit", "Head", "Hook", "HookNameError", "ablate_heads", "branch", "check_names", "closest_names"]
__all__ += ["patch", "scale_heads"]

ABLATIONS = ("zero", "mean")


@dataclass(frozen=True, order=True)
class Head:
    """One attention head: stack "encoder", "decoder" or "cross" (an encoder-decoder's cross-attention), layer,
    head (query head), as a trace names them (`trace.attention(layer, head, stack)`)."""

    stack: str
    layer: int
    head: int

    def __post_init__(self) -> None:
        if self.stack not in ATTENTION_STACKS:
            raise ValueError(f"stack must be one of {sorted(ATTENTION_STACKS)}, got {self.stack!r}")
        if self.layer < 0 or self.head < 0:
            raise ValueError(f"layer and head count from 0, got layer {self.layer}, head {self.head}")

    @property
    def block(self) -> str:
        """The activation prefix of its attention block: "decoder.3.attn", "decoder.3.cross_attn"."""
        return ATTENTION_STACKS[self.stack].format(layer=self.layer)

    def __str__(self) -> str:
        return f"{self.stack} L{self.layer} H{self.head}"


def scale_heads(block: str, factors: torch.Tensor, baseline: str | np.ndarray = "zero") -> Edit:
    """Edit the head outputs z of one attention block: z_h <- f_h z_h + (1 - f_h) baseline_h.

    factors: [h] for every row of the batch, or [B, h], one set per row (1 leaves a head alone, 0 ablates it).
    baseline: "zero"; "mean", each head's mean over the input's positions (of batch row 0, the unedited
    input when the batch was branched); or an array [h, dh] (e.g. a mean over a dataset) or [h, T, dh].
    """
    if isinstance(baseline, str) and baseline not in ABLATIONS:
        raise ValueError(f"baseline must be one of {ABLATIONS} or an array, got {baseline!r}")

    return Edit(f"{block}.z", lambda z, hook: _scaled(z, factors, baseline))


def _scaled(z: torch.Tensor, factors: torch.Tensor, baseline: str | np.ndarray) -> torch.Tensor:
    """z (B, h, T, dh) with each head moved towards its baseline (see `scale_heads`)."""
    f = factors.to(z.device, z.dtype)
    f = f.view(1, -1, 1, 1) if f.dim() == 1 else f.view(f.shape[0], f.shape[1], 1, 1)  # (B|1, h, 1, 1)
    if isinstance(baseline, str) and baseline == "zero":
        return z * f
    if isinstance(baseline, str):
        base = z[:1].mean(dim=2, keepdim=True)  # (1, h, 1, dh): row 0's mean over the positions
    else:
        base = torch.as_tensor(np.asarray(baseline), device=z.device, dtype=z.dtype)
        base = base[None, :, None, :] if base.dim() == 2 else base[None]
    return z * f + (1 - f) * base


def ablate_heads(heads: Iterable[Head], how: str = "zero", factor: float = 0.0) -> list[Edit]:
    """Edits that ablate every head of `heads` in every row of the batch: its z replaced by zeros ("zero") or by
    its mean over the positions ("mean"); with `factor` other than 0, scaled instead (z <- factor z + (1 -
    factor) baseline: 2.0 with how="zero" doubles the head). No heads: no edits (the pass is unchanged)."""
    if how not in ABLATIONS:
        raise ValueError(f"how must be one of {ABLATIONS}, got {how!r}")
    by_block: dict[str, list[int]] = {}
    for h in heads:
        by_block.setdefault(h.block, []).append(h.head)
    edits = []
    for block, chosen in sorted(by_block.items()):
        n = max(chosen) + 1

        def apply_factors(z: torch.Tensor, hook: Hook, chosen: list[int] = chosen, n: int = n) -> torch.Tensor:
            if n > z.shape[1]:
                raise ValueError(f"head {n - 1} is out of range: {hook.name} has {z.shape[1]} heads")
            f = torch.ones(z.shape[1])
            f[chosen] = factor
            return _scaled(z, f, how)

        edits.append(Edit(f"{block}.z", apply_factors))
    return edits


def _source_array(source: Trace | np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    if isinstance(source, Trace):
        if name not in source:
            raise ValueError(f"the source trace has no {name!r}; see its names")
        return torch.as_tensor(np.array(source[name]))
    return torch.as_tensor(source if isinstance(source, torch.Tensor) else np.array(source))


def patch(
    name: str,
    source: Trace | np.ndarray | torch.Tensor,
    positions: Mapping[int, int] | None = None,
    rows: Sequence[int] | None = None,
) -> Edit:
    """Replace the activation `name` with another input's: `source` is that input's trace (or the array itself,
    batch dimension dropped, as a trace holds it).

    positions: None replaces the whole activation (shapes must agree); {target: source} replaces the target's
    positions with the source's, along the token axis (second from last: the tokens of a residual stream,
    the query positions of a head's z or attention weights). rows: the batch rows patched (None: every row).
    """
    values = _source_array(source, name)

    def apply(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        src = values.to(x.device, x.dtype)
        if positions is None and tuple(src.shape) != tuple(x.shape[1:]):
            raise ValueError(f"{name}: the source has shape {tuple(src.shape)}, this pass {tuple(x.shape[1:])}")
        out = x.clone()
        chosen = slice(None) if rows is None else torch.as_tensor(list(rows), device=x.device)
        if positions is None:
            out[chosen] = src
            return out
        for target, origin in positions.items():
            if not (-x.shape[-2] <= target < x.shape[-2] and -src.shape[-2] <= origin < src.shape[-2]):
                raise ValueError(f"{name}: position {target} <- {origin} is outside the inputs")
            out[chosen, ..., target, :] = src[..., origin, :]
        return out

    return Edit(name, apply)


def branch(name: str, rows: int) -> Edit:
    """Grow the batch at `name` by `rows` copies of row 0: the rows added see the same input up to here and may
    be edited differently from here on (each ablating one head, say), while what came before ran once.

    Later layers broadcast the batch: masks, rotary tables and an encoder's memory of one row serve every row.
    """
    if rows < 0:
        raise ValueError(f"rows must be 0 or more, got {rows}")

    def apply(x: torch.Tensor, hook: Hook) -> torch.Tensor:
        return x if rows == 0 else torch.cat([x, x[:1].expand(rows, *x.shape[1:])])

    return Edit(name, apply)


def closest_names(name: str, hook_names: Sequence[str], n: int = 3) -> tuple[str, ...]:
    """The (at most n) names of `hook_names` most like `name`, closest first. Alike: difflib's similarity ratio, at
    least 0.6 as `difflib.get_close_matches` asks. Closest: the names that begin with more of `name`'s parts (its
    stack, then its layer) first, then by ratio, then in the model's order; by ratio alone a misspelled
    "decoder.3.atn.z" would be nearer "decoder.13.attn.z" (one letter more) than "decoder.3.attn.q". So
    "decoder.3.atn.z" gives "decoder.3.attn.z", "decoder.3.attn.q", "decoder.3.attn.k". Case is ignored."""
    wanted = name.lower()
    parts = wanted.split(".")
    matcher = SequenceMatcher(b=wanted)
    scored = []
    for order, known in enumerate(hook_names):
        matcher.set_seq1(known.lower())
        if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6 and matcher.ratio() >= 0.6:
            shared = _leading_parts_shared(parts, known.lower().split("."))
            scored.append((-shared, -matcher.ratio(), order, known))
    return tuple(known for *_, known in sorted(scored)[:n])


def _leading_parts_shared(a: list[str], b: list[str]) -> int:
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def check_names(hook_names: Sequence[str], edits: Iterable[Edit]) -> None:
    """HookNameError naming every edit whose activation no hook point of the model has (it would never apply),
    each with the closest names the model has. `model.intervene` and `model.trace(..., edits=...)` check with it
    before anything runs."""
    named = dict.fromkeys(e.name for e in edits)  # each name once, in the order given
    if not named:
        return  # most passes have no edits: nothing to build
    known = set(hook_names)
    unknown = [name for name in named if name not in known]
    if unknown:
        raise HookNameError({name: closest_names(name, hook_names) for name in unknown}, len(known))
