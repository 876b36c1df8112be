"""What a click on a chart chose, read from Streamlit's selection event (the specs in tformer_views.charts.pickers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def clicked_cell(
    event: Any, param: str = "cell", fields: tuple[str, str] = ("layer", "head")
) -> tuple[int, int] | None:
    """The two fields of a clicked cell from a selection event ({"selection": {param: [{field: value, ...}]}}):
    (layer, head) from a head grid, (row, col) from a heatmap; None when nothing was clicked."""
    try:
        points = event["selection"][param]
    except (KeyError, TypeError, IndexError):
        return None
    if isinstance(points, Mapping):  # interval-like payload {"layer": [...], "head": [...]}
        points = [points]
    for point in points or []:
        try:
            a, b = point[fields[0]], point[fields[1]]
            a = a[0] if isinstance(a, (list, tuple)) else a
            b = b[0] if isinstance(b, (list, tuple)) else b
            return int(a), int(b)
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
