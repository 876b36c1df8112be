"""Token norms over the patch grid and the high-norm patches they single out: a trace built by hand with a known
long patch, DeiT-Tiny on photos (no artefact: its longest patch is 2.44 times the median), and a register model's
registers kept apart from the patches."""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T

import tformer_core as tc
from tformer_core.artefacts import ARTEFACT_RATIO, Artefact, token_norms
from tformer_core.errors import InputError
from tformer_core.trace import Trace

from .hf_helpers import DEIT, IMAGES, perturbed

SAMPLES = Path(__file__).resolve().parents[2] / "assets" / "samples"


def _stream(norms: np.ndarray) -> np.ndarray:
    """Tokens of the given norms [tokens] in 3 dimensions, each along its own direction (3-4-12 makes 13)."""
    direction = np.array([3.0, 4.0, 12.0]) / 13.0
    return norms[:, None] * direction[None, :]


def _hand_trace() -> Trace:
    """[CLS], two registers, a 3 x 4 grid; layer 0: every patch 1 long but r1c2, 10 long; layer 1: r0c0 3 long."""
    layer0 = np.ones(3 + 12)
    layer0[:3] = [2.0, 20.0, 0.5]  # the prefix: not in the median, never an artefact
    layer0[3 + 1 * 4 + 2] = 10.0
    layer1 = np.full(3 + 12, 2.0)
    layer1[3] = 6.0  # 3 times the median 2: under the line
    return Trace(
        kind="vit",
        activations={"encoder.0.resid_post": _stream(layer0), "encoder.1.resid_post": _stream(layer1)},
        tokens=("[CLS]", "[REG0]", "[REG1]", *(f"r{r}c{c}" for r in range(3) for c in range(4))),
        n_heads=1,
        stack_layers={"encoder": 2},
        grid_hw=(3, 4),
        patch_size=8,
        n_prefix_tokens=3,
    )


def test_a_known_long_patch_is_found_and_the_prefix_kept_apart():
    norms = token_norms(_hand_trace())
    assert norms.patch_norms.shape == (2, 3, 4) and norms.prefix_tokens == ("[CLS]", "[REG0]", "[REG1]")
    np.testing.assert_allclose(norms.median, [1.0, 2.0], rtol=1e-12)
    np.testing.assert_allclose(norms.max_ratio, [10.0, 3.0], rtol=1e-12)
    np.testing.assert_allclose(norms.prefix_ratio, [[2.0, 20.0, 0.5], [1.0, 1.0, 1.0]], rtol=1e-12)
    found = norms.artefacts(0)
    assert [(a.layer, a.row, a.col, a.patch) for a in found] == [(0, 1, 2, 6)]
    assert found[0].norm == pytest.approx(10.0, rel=1e-12) and found[0].ratio == pytest.approx(10.0, rel=1e-12)
    assert norms.artefacts(1) == [] and norms.mask.sum() == 1
    assert norms.largest() == found[0]
    lower = token_norms(_hand_trace(), threshold=2.5)  # the line moved: layer 1's 3x patch is now one
    assert [(a.layer, a.patch) for a in lower.artefacts()] == [(0, 6), (1, 0)]


def test_bad_requests_are_refused_with_a_message():
    trace = _hand_trace()
    with pytest.raises(InputError, match="ratio to the median norm above 1"):
        token_norms(trace, threshold=1.0)
    with pytest.raises(InputError, match="layer 2 is out of range"):
        token_norms(trace).artefacts(2)
    partial = Trace(
        "vit", {"encoder.0.resid_post": _stream(np.ones(15))}, trace.tokens, 1, {"encoder": 2}, None, (3, 4), 8, 3
    )
    with pytest.raises(InputError, match=r"does not hold the residual stream \(encoder.1.resid_post\)"):
        token_norms(partial)
    text = Trace("encoder", {"encoder.0.resid_post": np.ones((2, 3))}, ("a", "b"), 1, {"encoder": 1})
    with pytest.raises(InputError, match="need a vision trace"):
        token_norms(text)


needs_deit = pytest.mark.skipif(not DEIT.is_dir(), reason="../shared/models/deit-tiny-patch16-224 is not present")


@pytest.mark.slow
@needs_deit
def test_deit_tiny_has_no_artefact_its_longest_patch_is_2_44_times_the_median():
    from tformer_views.vision import analyse

    model = tc.load_model(str(DEIT), device="cpu", model_dirs=[DEIT.parent])
    photos = sorted(SAMPLES.glob("*.jpg")) + sorted(IMAGES.glob("*.png"))
    largest: dict[str, Artefact] = {}
    for photo in photos:
        trace = analyse(model, photo.read_bytes(), photo.name).trace
        norms = token_norms(trace)
        assert norms.artefacts() == [], photo.name
        # Independently, in float64 from the stored stream: every layer's norms and medians.
        for layer in range(12):
            stream = np.asarray(trace[f"encoder.{layer}.resid_post"], dtype=np.float64)
            by_hand = np.sqrt((stream**2).sum(-1))
            np.testing.assert_allclose(norms.patch_norms[layer].ravel(), by_hand[1:], rtol=1e-6)
            np.testing.assert_allclose(norms.median[layer], np.median(by_hand[1:]), rtol=1e-6)
        largest[photo.name] = norms.largest()
    worst = max(largest, key=lambda name: largest[name].ratio)
    assert worst == "coffee.jpg" and largest[worst].ratio == pytest.approx(2.439, abs=2e-3)
    assert (largest[worst].layer, largest[worst].row, largest[worst].col) == (11, 12, 5)
    assert all(a.ratio < ARTEFACT_RATIO / 1.5 for a in largest.values())  # a margin below the line, on every photo


def test_long_registers_are_reported_apart_and_flag_no_patch(tmp_path):
    """A tiny random DINOv2 with registers whose register vectors are made 100 times longer: they stay the longest
    tokens through its layers (a register has no position and gets only small updates), yet no patch is flagged
    and the median is the patches' alone. What a trained model's registers absorb cannot be shown without one."""
    torch.manual_seed(0)
    config = T.Dinov2WithRegistersConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_register_tokens=2
    )
    hf = perturbed(T.Dinov2WithRegistersModel(config), seed=3, scale=0.1)
    with torch.no_grad():
        hf.embeddings.register_tokens.mul_(100.0)
    hf.save_pretrained(tmp_path / "registers")
    model = tc.load_model(str(tmp_path / "registers"), device="cpu", model_dirs=[tmp_path])
    trace = model.trace(torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(2)))
    norms = token_norms(trace)
    assert norms.prefix_tokens == ("[CLS]", "[REG0]", "[REG1]")
    assert (norms.prefix_ratio[:, 1:] > ARTEFACT_RATIO).all()  # the registers: far longer than the patches
    assert norms.artefacts() == []  # and still no patch is an artefact
    stream = np.asarray(trace["encoder.1.resid_post"], dtype=np.float64)
    np.testing.assert_allclose(norms.median[1], np.median(np.linalg.norm(stream[3:], axis=-1)), rtol=1e-9)
