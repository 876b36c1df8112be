"""Charts to files: JSON for the browser's exports, SVG and PNG rendered on the server, schema validation.

Streamlit's chart toolbar offers PNG only, so the app renders exports itself, with vl-convert (the
Vega project's own renderer, the one Altair's chart.save uses): the file is exactly the chart on
screen, and nothing is computed until a user asks for it.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["json_spec", "to_png", "to_svg", "validate"]


def json_spec(spec: dict) -> dict:
    """The chart as pure JSON data: datasets as lists of records, missing values as null."""
    datasets = {
        name: frame.astype(object).where(frame.notna(), None).to_dict("records")
        if isinstance(frame, pd.DataFrame)
        else frame
        for name, frame in (spec.get("datasets") or {}).items()
    }
    return {**spec, "datasets": datasets}


def validate(spec: dict) -> None:
    """Raise (jsonschema's ValidationError) when the chart is not a valid Vega-Lite specification.

    Uses the schema Altair ships (Altair is installed with Streamlit); imported here only, so
    building a chart never touches Altair.
    """
    import altair as alt

    alt.Root.validate(json_spec(spec))


def to_svg(spec: dict) -> str:
    """The chart as an SVG document (text)."""
    import vl_convert

    return vl_convert.vegalite_to_svg(json_spec(spec))


def to_png(spec: dict, scale: float = 2.0) -> bytes:
    """The chart as PNG bytes, `scale` times its size on screen (2: sharp on a projector or in slides)."""
    import vl_convert

    return vl_convert.vegalite_to_png(json_spec(spec), scale=scale)
