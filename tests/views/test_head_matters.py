"""The head page's views on tiny models: a study keeps no model alive, one head ablated agrees with the grid and
shows what changes after it, patching's grid for the page, an image study's picture."""

import gc
import io
import weakref

import numpy as np
import pytest
from PIL import Image

import tformer_core as tc
from tests.core.test_interventions import tiny_llama
from tests.core.tiny_models import tiny_seq2seq, tiny_vit
from tformer_core.interventions import Head
from tformer_views import head_matters as hm

A = [3, 7, 1, 12, 9, 4]


def test_a_cached_study_keeps_no_reference_to_its_model():
    model = tiny_llama().double()
    study = hm.study("text", model, A)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # an evicted model is freed even while its study stays cached
    assert study.importance.effects["decoder"].shape == (2, 4)


def test_ablating_a_head_gives_the_grids_value_and_the_attention_it_changes():
    model = tiny_llama().double()
    study = hm.study("text", model, A)
    head = Head("decoder", 0, 2)
    result = hm.ablation(model, study.kind, study.inputs, study.output, head)
    assert result.value == pytest.approx(study.importance.scores["decoder"][0, 2], abs=1e-12)
    assert result.value == pytest.approx(hm.ablated(model, study, [head]), abs=1e-12)
    assert result.prediction[0][1] != pytest.approx(study.prediction[0][1], abs=1e-9)
    clean = model.trace(A)
    np.testing.assert_allclose(result.own, clean.attention(0, 2), atol=1e-12)  # its weights come before z
    assert result.downstream is not None and result.downstream.layer == 1  # only layer 1 reads layer 0
    np.testing.assert_allclose(result.before, clean.attention(1, result.downstream.head), atol=1e-12)
    changed = 0.5 * np.abs(result.after - result.before).sum()
    assert changed == pytest.approx(result.changed) and changed > 1e-6
    assert result.labels["decoder"][0] == result.labels["decoder"][1] and len(result.labels["decoder"][0]) == 6
    # A head of the last layer: nothing after it has attention to change.
    assert hm.ablation(model, "text", (A,), study.output, Head("decoder", 1, 0)).downstream is None


def test_an_ablation_given_the_clean_trace_runs_one_pass_and_reports_it_layer_by_layer():
    """A page's click: the study's (compact) clean trace is reused, one pass runs under the ablation, and its
    progress comes layer by layer up to done; without the clean trace, two passes, the same answer."""
    model = tiny_llama().double()
    study = hm.study("text", model, A)
    head = Head("decoder", 0, 1)
    seen: list[tuple[float, str]] = []
    passes = []
    handle = model.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        quick = hm.ablation(
            model, "text", study.inputs, study.output, head, clean=study.trace, progress=lambda *a: seen.append(a)
        )
        assert len(passes) == 1
        full = hm.ablation(model, "text", study.inputs, study.output, head)
        assert len(passes) == 3
    finally:
        handle.remove()
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert len(seen) == 1 + 2  # the pass said, then each of the 2 layers
    assert (
        quick.value == pytest.approx(full.value, abs=1e-12) == pytest.approx(study.importance.scores["decoder"][0, 1])
    )
    np.testing.assert_allclose(quick.own, full.own, atol=1e-12)
    assert quick.downstream == full.downstream and quick.changed == pytest.approx(full.changed, abs=1e-12)


def test_an_encoder_head_ablated_changes_the_cross_attention_of_a_translator():
    model = tiny_seq2seq().double()
    study = hm.study("translation", model, A)
    assert set(study.importance.effects) == {"encoder", "decoder", "cross"}
    result = hm.ablation(model, "translation", study.inputs, study.output, Head("encoder", 1, 0))
    assert result.downstream is not None and result.downstream.stack == "cross"  # reads the encoder's output
    assert result.value == pytest.approx(study.importance.scores["encoder"][1, 0], abs=1e-12)


def test_the_study_reports_its_progress_up_to_done():
    seen = []
    hm.study("text", tiny_llama().double(), A, progress=lambda f, m: seen.append(f))
    assert seen == sorted(seen) and seen[0] > 0 and seen[-1] == pytest.approx(0.9)
    assert len(seen) == 2 + 1  # each of the 2 layers as it runs, then the lens and attribution


def test_the_patching_axes_name_the_positions_where_the_inputs_differ():
    grid = hm.patching(tiny_llama().double(), A, [3, 7, 1, 15, 9, 4])
    rows, cols = hm.patching_axes(grid)
    assert rows == ["L0", "L1", "out"]
    assert cols[3] == "3: 12→15" and cols[0] == "0: 3"
    assert grid.moved[-1, -1] == pytest.approx(1.0) and grid.moved[0, 3] == pytest.approx(1.0)
    with pytest.raises(
        ValueError, match=r"^patching between two inputs is shown for language models \(decoder-only\)$"
    ):
        hm.patching(tiny_seq2seq(), A, A)


def _png(width: int, height: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_image_study_keeps_its_picture_to_show_beside_the_prediction():
    vit = tiny_vit()
    vit.preprocessing = tc.ImagePreprocessing(resize=("exact", (12, 16)), mean=(0.5,) * 3, std=(0.25,) * 3)
    # A small picture is enlarged pixel-exact by a whole number (64 px: 3 times, within 224); a large one reduced
    # to 224 px on its long side, its shape kept.
    for (width, height), shown in (((64, 48), (192, 144)), ((600, 300), (224, 112))):
        study = hm.study("image", vit, _png(width, height), "picture.png")
        picture = Image.open(io.BytesIO(study.picture))
        assert picture.format == "JPEG" and picture.size == shown
    assert hm.study("text", tiny_llama().double(), A).picture is None
