"""Capture of activations during a forward pass.

Every activation the app can show passes through a `HookPoint`, an identity module whose name
is derived from its module path (``encoder.blocks.3.attn.hook_q`` -> ``encoder.3.attn.q``).
A hook point does nothing unless a capture is active *in the calling context*.

Why a context variable and not forward hooks: one model object is shared by every browser
session of the server. Registering hooks on it per request would leak one session's tensors
into another's trace when two requests overlap. A `ContextVar` is private to each thread (and
each asyncio task), so each call to `capture()` gets its own sink and the shared model is never
mutated.

Interventions (`intervene`) use the same mechanism: a hook point whose name has an `Edit` in the calling
context passes the edit's result on instead of its input (an ablated head, a patched residual stream), so
two requests with different interventions share one model without seeing each other's. `intervene` here is
the unchecked mechanism the core's models are built on; code outside the core applies edits through the model
(`model.trace(x, edits=...)`, `with model.intervene(...)`), which checks every name first. `tformer_core.
interventions` builds the edits (ablate, scale, patch, branch the batch) and what is measured with them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "CaptureSink",
    "Edit",
    "HookPoint",
    "NameFilter",
    "any_of",
    "capture",
    "capture_active",
    "checkpoints",
    "hook_name",
    "intervene",
    "matching",
    "name_hook_points",
]

NameFilter = Callable[[str], bool]


def _pattern_regex(pattern: str) -> str:
    segments = pattern.split(".")
    head = tail = ""
    if segments[0] == "**":
        head, segments = r"(?:.+\.)?", segments[1:]
    if segments and segments[-1] == "**":
        tail, segments = r"(?:\..+)?", segments[:-1]
    if not segments or "**" in segments:
        raise ValueError(f"{pattern!r}: '**' stands first or last, beside at least one other part")
    return head + r"\.".join("[^.]+" if s == "*" else re.escape(s) for s in segments) + tail


def matching(*patterns: str) -> NameFilter:
    """A capture filter keeping the activations whose names match one of `patterns`.

    A pattern is a dotted name whose parts match whole parts of a name: "*" any one part, "**" (first or
    last) any number of them. "**.attn.weights" keeps every self-attention's weights ("encoder.3.attn.weights",
    not "decoder.0.cross_attn.weights"); "head.*" the head's outputs; "decoder.**" everything of the decoder.
    """
    if not patterns:
        raise ValueError("give at least one pattern")
    regex = re.compile("|".join(f"(?:{_pattern_regex(p)})" for p in patterns))
    return lambda name: regex.fullmatch(name) is not None


def any_of(*filters: NameFilter) -> NameFilter:
    """A capture filter keeping what any of `filters` keeps."""
    return lambda name: any(keep(name) for keep in filters)


class CaptureSink:
    """Collects the tensors recorded during one forward pass, keyed by hook name.

    Tensors are kept as they are (detached references, batch dimension included); nothing is
    copied during the forward pass, which is what keeps capture overhead low.
    """

    def __init__(self, keep: NameFilter | None = None) -> None:
        self._keep = keep
        self.tensors: dict[str, torch.Tensor] = {}

    def record(self, name: str, tensor: torch.Tensor) -> None:
        if self._keep is None or self._keep(name):
            self.tensors[name] = tensor.detach()


_ACTIVE_SINK: ContextVar[CaptureSink | None] = ContextVar("tformer_capture_sink", default=None)


@contextlib.contextmanager
def capture(keep: NameFilter | None = None) -> Iterator[CaptureSink]:
    """Record every hook point reached by forward passes run inside the `with` block.

    `keep` selects names to store (all when None). The sink is visible only to the current
    thread / task; on exit the previous state is restored, so nothing is left behind.
    """
    sink = CaptureSink(keep)
    token = _ACTIVE_SINK.set(sink)
    try:
        yield sink
    finally:
        _ACTIVE_SINK.reset(token)


def capture_active() -> bool:
    """True inside a `capture()` block of the current context."""
    return _ACTIVE_SINK.get() is not None


LAYERED_STACKS = ("encoder", "decoder")  # the first part of a hook name that numbered layers follow


@dataclass(frozen=True)
class Hook:
    """The hook point an edit's function is applied at, as it receives it: `name` ("decoder.3.cross_attn.z"),
    `stack` ("encoder" or "decoder"; None outside them: "head.logits", an RNN's "attn.weights"), `layer` (3;
    None where the name has no layer: "encoder.embed.out", "decoder.out")."""

    name: str
    stack: str | None = None
    layer: int | None = None

    @classmethod
    def named(cls, name: str) -> Hook:
        """The hook of the activation `name`, its stack and layer read from the name."""
        first, _, rest = name.partition(".")
        stack = first if first in LAYERED_STACKS and rest else None
        number = rest.partition(".")[0]
        return cls(name, stack, int(number) if stack is not None and number.isdigit() else None)


EditFunction = Callable[[torch.Tensor, Hook], torch.Tensor]


@dataclass(frozen=True, eq=False)
class Edit:
    """What replaces the activation `name` during a forward pass under intervention: `apply(x, hook)`, where x is
    the batched tensor the hook point receives ((B, T, D) for a residual stream, (B, h, T, dh) for a head output
    z) and `hook` the `Hook` it is applied at (its name, stack and layer), e.g.
    `Edit("decoder.3.attn.z", lambda z, hook: z * 0)`.

    `apply` must not write into x (it may be a view shared with the model or another activation): it returns a
    new tensor, of x's shape, or with more rows (`interventions.branch`), which later layers broadcast over.
    """

    name: str
    apply: EditFunction


_ACTIVE_EDITS: ContextVar[Mapping[str, tuple[Edit, ...]] | None] = ContextVar("tformer_edits", default=None)


@contextlib.contextmanager
def intervene(edits: Iterable[Edit]) -> Iterator[None]:
    """Apply `edits` at their hook points in forward passes run inside the `with` block (this thread or task only).

    Several edits of one name apply in the order given; edits of an enclosing `intervene` apply first. An empty
    list changes nothing. Unchecked: it knows no model, and a name that no hook point has is never applied. The
    core's own passes use it where they built the names; everything else goes through the model
    (`model.intervene`, `model.trace(..., edits=...)`), which raises HookNameError for such a name first.
    """
    merged: dict[str, tuple[Edit, ...]] = dict(_ACTIVE_EDITS.get() or {})
    for edit in edits:
        merged[edit.name] = (*merged.get(edit.name, ()), edit)
    token = _ACTIVE_EDITS.set(merged or None)
    try:
        yield
    finally:
        _ACTIVE_EDITS.reset(token)


_ACTIVE_CHECKPOINT: ContextVar[Callable[[], None] | None] = ContextVar("tformer_checkpoint", default=None)


@contextlib.contextmanager
def checkpoints(check: Callable[[], None]) -> Iterator[None]:
    """Call check() at every hook point that forward passes reach inside the `with` block (this thread or task only).

    For long work that a server runs beside the passes its users wait for (tformer_app.work): check() may block
    while another pass goes first, or raise to stop the work (its student left), between two steps of a pass,
    whatever the model and whatever the computation (a study's batched passes, a patching grid). Outside such a
    block a hook point pays one context-variable read.
    """
    token = _ACTIVE_CHECKPOINT.set(check)
    try:
        yield
    finally:
        _ACTIVE_CHECKPOINT.reset(token)


class HookPoint(nn.Module):
    """Identity on the forward pass, unless an intervention edits this activation; records what it passes on
    (the edited tensor, when there is an edit) when a capture is active."""

    def __init__(self) -> None:
        super().__init__()
        # Set once by `name_hook_points` after the model is built; never changed afterwards.
        self.hook = Hook("")

    @property
    def name(self) -> str:
        return self.hook.name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check = _ACTIVE_CHECKPOINT.get()
        if check is not None:
            check()
        edits = _ACTIVE_EDITS.get()
        if edits is not None:
            for edit in edits.get(self.hook.name, ()):
                x = edit.apply(x, self.hook)
        sink = _ACTIVE_SINK.get()
        if sink is not None:
            sink.record(self.hook.name, x)
        return x

    def extra_repr(self) -> str:
        return repr(self.name)


def hook_name(module_path: str) -> str:
    """Public activation name for a hook point's module path.

    ``decoder.blocks.2.cross_attn.hook_weights`` -> ``decoder.2.cross_attn.weights``.
    """
    parts = [p for p in module_path.split(".") if p != "blocks"]
    parts[-1] = parts[-1].removeprefix("hook_")
    return ".".join(parts)


def name_hook_points(model: nn.Module) -> list[str]:
    """Give every hook point of `model` its public name (and the `Hook` its edits receive); returns the names in
    module order."""
    names = []
    for path, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.hook = Hook.named(hook_name(path))
            names.append(module.hook.name)
    return names
