"""The one place numbers become colours in the pictures the views draw (overview, overlays, position maps).

The tables are matplotlib's, exactly (256 entries each), read through the small `cmap` package: the
charts in the browser use Vega's schemes of the same names, so a picture and a chart agree.
"""

from __future__ import annotations

from functools import cache

import numpy as np

MAPS = ("viridis", "inferno", "coolwarm")
MASKED_RGB = (187, 187, 187)  # the grey of masked cells, as the heatmaps draw them (#bbbbbb)


@cache
def lut(name: str) -> np.ndarray:
    """[256, 3] uint8 colours of a colour map (MAPS), from its low end to its high end."""
    if name not in MAPS:
        raise ValueError(f"unknown colour map {name!r}: use one of {MAPS}")
    from cmap import Colormap

    rgba = Colormap(f"matplotlib:{name}").lut(256)  # float RGBA in [0, 1]
    table = np.round(np.asarray(rgba)[:, :3] * 255).astype(np.uint8)
    table.flags.writeable = False
    return table


def colourise(
    values: np.ndarray, cmap: str = "viridis", lo: float | None = None, hi: float | None = None
) -> np.ndarray:
    """[h, w] numbers -> [h, w, 3] uint8 colours; lo..hi (default: the finite values' own range) spans the map.

    NaN cells (a block that is entirely masked) are drawn in MASKED_RGB.
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    lo = (float(v[finite].min()) if finite.any() else 0.0) if lo is None else float(lo)
    hi = (float(v[finite].max()) if finite.any() else 0.0) if hi is None else float(hi)
    scaled = (np.where(finite, v, lo) - lo) / (hi - lo) if hi > lo else np.zeros(v.shape)
    rgb = lut(cmap)[np.clip(np.rint(scaled * 255), 0, 255).astype(np.int64)]
    rgb[~finite] = MASKED_RGB
    return rgb
