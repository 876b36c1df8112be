"""What a click on a chart chose, read from Streamlit's selection event (the specs in tformer_views.charts.pickers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def clicked_cell(event: Any, param: str = "cell") -> tuple[int, int] | None:
    """(layer, head) from a head-grid selection event ({"selection": {param: [{"layer": l, "head": h}]}}), or None."""
    try:
        points = event["selection"][param]
    except (KeyError, TypeError, IndexError):
        return None
    if isinstance(points, Mapping):  # interval-like payload {"layer": [...], "head": [...]}
        points = [points]
    for point in points or []:
        try:
            layer, head = point["layer"], point["head"]
            layer = layer[0] if isinstance(layer, (list, tuple)) else layer
            head = head[0] if isinstance(head, (list, tuple)) else head
            return int(layer), int(head)
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return None


def clicked_patch(event: Any) -> int | None:
    """The patch index (row-major) from a patch-picker selection event, or None."""
    try:
        points = event["selection"]["patch"]
    except (KeyError, TypeError):
        return None
    for point in points or []:
        try:
            value = point["patch"]
            return int(value[0] if isinstance(value, (list, tuple)) else value)
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return None
