"""The one colour module: matplotlib's exact tables, and masked cells in the heatmaps' grey."""

import numpy as np
import pytest

from tformer_views import colour


@pytest.mark.parametrize(
    "name, first, middle, last",
    [  # matplotlib's _cm_listed / _cm tables, entries 0, 128 and 255, as 8-bit RGB
        ("viridis", (68, 1, 84), (33, 145, 140), (253, 231, 37)),
        ("inferno", (0, 0, 4), (188, 55, 84), (252, 255, 164)),
        ("coolwarm", (59, 76, 192), (221, 220, 220), (180, 4, 38)),
    ],
)
def test_tables_are_matplotlibs(name, first, middle, last):
    table = colour.lut(name)
    assert table.shape == (256, 3) and table.dtype == np.uint8 and not table.flags.writeable
    assert tuple(table[0]) == first and tuple(table[128]) == middle and tuple(table[255]) == last


def test_colourise_spans_the_range_and_greys_out_masked_cells():
    values = np.array([[0.0, 0.5, 1.0], [np.nan, 0.25, 2.0]])
    rgb = colour.colourise(values, "viridis", lo=0.0, hi=1.0)
    table = colour.lut("viridis")
    assert tuple(rgb[0, 0]) == tuple(table[0]) and tuple(rgb[0, 2]) == tuple(table[255])
    assert tuple(rgb[0, 1]) == tuple(table[128])  # round(0.5 * 255) = 128
    assert tuple(rgb[1, 0]) == colour.MASKED_RGB and tuple(rgb[1, 2]) == tuple(table[255])  # clipped above hi
    own_range = colour.colourise(np.array([[2.0, 4.0]]), "inferno")
    assert tuple(own_range[0, 0]) == tuple(colour.lut("inferno")[0]) and tuple(own_range[0, 1]) == (252, 255, 164)
    with pytest.raises(
        ValueError, match=r"^unknown colour map 'jet': use one of \('viridis', 'inferno', 'coolwarm'\)$"
    ):
        colour.lut("jet")
