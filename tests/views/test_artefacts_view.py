"""The high-norm tokens' views on norms made by hand: the verdict's sentence, the per-layer curves, the prefix
table, the artefact patches boxed on the picture."""

import numpy as np
import pytest
from PIL import Image

from tformer_core.artefacts import TokenNorms
from tformer_core.errors import InputError
from tformer_views.artefacts import ARTEFACT_INK, norm_overlay, prefix_frame, ratio_chart, ratio_frame, verdict
from tformer_views.charts.export import validate


def _norms() -> TokenNorms:
    """Two layers of a 2 x 3 grid with [CLS] and one register; layer 1's r1c2 is 12 times the median 2."""
    patches = np.array([[[1.0, 1.0, 2.0], [1.0, 1.0, 1.5]], [[2.0, 2.0, 2.0], [2.0, 3.0, 24.0]]])
    prefix = np.array([[3.0, 5.0], [4.0, 40.0]])
    return TokenNorms("encoder", patches, prefix, ("[CLS]", "[REG0]"), np.array([1.0, 2.0]))


def test_the_verdict_says_no_artefact_with_the_largest_ratio_or_names_the_patches():
    norms = _norms()
    assert verdict(norms, 0) == (
        "No artefact in layer 0: the largest token norm is 2.00x the median patch norm "
        "(layer 0, patch r0c2; an artefact would be above 4x)."
    )
    assert verdict(norms, 1) == "1 artefact patch in layer 1 (norm above 4x the median patch norm): r1c2 (12.0x)."
    assert (
        verdict(norms) == "1 artefact patch in layer 1 (norm above 4x the median patch norm): r1c2 of layer 1 (12.0x)."
    )
    with pytest.raises(InputError, match="layer 2 is out of range"):
        verdict(norms, 2)


def test_the_curves_and_the_prefix_table_hold_the_ratios():
    norms = _norms()
    frame = ratio_frame(norms)
    assert list(frame["token"].unique()) == ["longest patch", "[CLS]", "[REG0]"]
    longest = frame[frame["token"] == "longest patch"]
    np.testing.assert_allclose(longest["ratio"], [2.0, 12.0])
    np.testing.assert_allclose(frame[frame["token"] == "[REG0]"]["ratio"], [5.0, 20.0])
    spec = ratio_chart(norms)
    validate(spec)
    table = prefix_frame(norms, 1)
    assert list(table["token"]) == ["[CLS]", "[REG0]", "median patch", "longest patch"]
    np.testing.assert_allclose(table["x median"], [2.0, 20.0, 1.0, 12.0])


def test_the_overlay_boxes_the_artefact_patch_only():
    norms = _norms()
    picture = Image.new("RGB", (48, 32), (128, 128, 128))  # a 2 x 3 grid of 16-px patches
    shown = norm_overlay(picture, norms, 1)
    k = shown.width // 48  # enlarged for the screen, pixel-exact
    assert shown.size == (48 * k, 32 * k) and k > 1
    cell = 16 * k
    assert shown.getpixel((2 * cell + cell // 2, cell)) == ARTEFACT_INK  # the top edge of r1c2's box
    assert shown.getpixel((cell // 2, 0)) != ARTEFACT_INK  # r0c0: no box
    plain = norm_overlay(picture, norms, 0)  # no artefact in layer 0: nothing drawn in that ink
    assert ARTEFACT_INK not in {
        plain.getpixel((x, y)) for x in range(0, plain.width, 4) for y in range(0, plain.height, 4)
    }
