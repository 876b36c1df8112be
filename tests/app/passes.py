"""Counting the forward passes a shared model runs, for tests and benchmarks: a view change must run none.

The counter is the test's own: it hooks the model's stacks for the duration of a `with` block and
removes the hooks after, so the app itself never instruments the models it shares between sessions.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from tformer_core.models.base import TracedModel
from tformer_core.models.layers import Stack


class PassCounter:
    """Counts runs of the model's stacks (an encoder or decoder pass each) inside the `with` block."""

    def __init__(self, model: TracedModel) -> None:
        self.model = model
        self.count = 0
        self._lock = threading.Lock()
        self._handles: list[Any] = []

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        with self._lock:
            self.count += 1

    def __enter__(self) -> PassCounter:
        self._handles = [m.register_forward_pre_hook(self._hook) for m in self.model.modules() if isinstance(m, Stack)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
