"""The views drawn inline in a notebook (Jupyter, VS Code, Colab), as BertViz's and CircuitsVis's are: a cell whose
value is one of these shows the chart under it.

    from tformer_views import notebook
    notebook.head_view(trace, layer=3, heads=[1])     # lines from each token to the tokens it attends to
    notebook.heatmap(trace, layer=3, head=1)          # the same head's weights, a cell per (query, key)
    notebook.Chart(spec)                              # any Vega-Lite chart of tformer_views.charts

A `Chart` hands a notebook two forms of itself (IPython's `_repr_mimebundle_`): the Vega-Lite specification, which
a front end with a Vega-Lite renderer draws live with its own bundled copy of Vega (JupyterLab, Notebook 7, VS Code,
nteract: hover a query token, click a head in the legend), and the same chart as SVG, rendered here by vl-convert
(no browser, no network), which every other front end shows (Colab, nbconvert's HTML, GitHub's page of a notebook).
Nothing is loaded from a CDN, unlike Altair's default renderer, so a notebook works offline.

No `_repr_html_`: IPython would add it to the bundle as text/html, which front ends rank above Vega-Lite, and the
live chart would never be drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tformer_core.trace import Trace

from . import text
from .charts.attention import head_view_chart
from .charts.export import json_spec, to_svg
from .charts.spec import heatmap as heatmap_spec

__all__ = ["VEGA_LITE_MIME", "Chart", "head_view", "heatmap"]

# The live chart goes out as Vega-Lite 5: the version notebook front ends draw (JupyterLab's vega5 extension, VS
# Code's and nteract's renderers key on this MIME type). None draws Vega-Lite 6 yet, and Altair 6's own
# "application/vnd.vegalite.v6.json" is not even valid in a notebook file (nbformat takes JSON data only under a
# type ending in +json). The charts here use nothing Vega-Lite 6 added: tests/views/test_notebook.py draws them
# with Vega-Lite 5.8 and gets the same picture as the app's Vega-Lite 6 (charts.spec.VEGA_LITE_SCHEMA).
VEGA_LITE_MIME = "application/vnd.vegalite.v5+json"
VEGA_LITE_5_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


@dataclass(frozen=True, eq=False)
class Chart:
    """A Vega-Lite chart (a dict of tformer_views.charts, its data as DataFrames) that a notebook draws inline."""

    spec: dict

    def to_dict(self) -> dict:
        """The specification as plain JSON data (datasets as lists of records), declared Vega-Lite 5, as a notebook's
        Vega-Lite renderer takes it (see VEGA_LITE_MIME)."""
        return json_spec(self.spec) | {"$schema": VEGA_LITE_5_SCHEMA}

    def to_svg(self) -> str:
        """The chart as an SVG document, drawn here (vl-convert): what a front end without Vega-Lite shows."""
        return to_svg(self.spec)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """What IPython asks a cell's value for: the live chart, its SVG picture, and a line of text."""
        return {VEGA_LITE_MIME: self.to_dict(), "image/svg+xml": self.to_svg(), "text/plain": repr(self)}

    def __repr__(self) -> str:
        title = self.spec.get("title") or "untitled"
        return f"<Chart: {title} (Vega-Lite; a notebook draws it)>"


def head_view(
    trace: Trace,
    layer: int,
    heads: Sequence[int] | None = None,
    stack: str | None = None,
    hide_special: bool = False,
    width: int = 600,
) -> Chart:
    """The head view of `layer` (the Text attention page's): a line from each query token (left) to each key token
    (right) it attends to, its opacity the weight, one colour per head. heads: which (default: every head).
    stack: "encoder", "decoder" or "cross" (default: the trace's main stack). hide_special: drop [CLS], [SEP]...
    and renormalise each row over the words (`text.head_matrix`)."""
    chosen = list(range(trace.n_heads)) if heads is None else list(heads)
    view = text.head_view(trace, layer, chosen, stack, hide_special=hide_special)
    which = f"head {chosen[0]}" if len(chosen) == 1 else f"{len(view.heads)} heads"
    title = f"layer {layer}, {which}: queries (left) → keys (right)"
    return Chart(head_view_chart(view, trace.n_heads, title=title, width=width))


def heatmap(trace: Trace, layer: int, head: int, stack: str | None = None, hide_special: bool = False) -> Chart:
    """One head's attention weights as a heatmap: a row per query token, a column per key token, each cell its
    weight on a fixed 0..1 scale (heads compare at a glance); cells a mask forbids drawn grey."""
    m = text.head_matrix(trace, layer, head, stack, hide_special=hide_special)
    title = f"layer {layer}, head {head}: attention weights"
    spec = heatmap_spec(m.weights, m.query_labels, m.key_labels, title, domain=(0.0, 1.0), masked=m.masked)
    return Chart(spec)
