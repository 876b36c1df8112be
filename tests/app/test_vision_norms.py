"""The Vision page's high-norm tokens section through AppTest, offline, on tiny random DINOv2 models with registers
saved in a configured model folder: the chooser lists them, the page says there is no artefact with the largest
ratio, and a patch made long by hand (its position embedding 60 times longer) is named and boxed as one."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from tests.app.pages import messages, no_exception, run, widget
from tests.core.hf_helpers import perturbed
from tformer_app import vision_norms

VISION = "vision"


def _save(folder, long_patch: int | None) -> None:
    torch.manual_seed(7)
    config = T.Dinov2WithRegistersConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_register_tokens=2
    )
    hf = perturbed(T.Dinov2WithRegistersModel(config), seed=5, scale=0.1)
    if long_patch is not None:  # a patch made long by hand, not a trained artefact: the page must find and box it
        with torch.no_grad():
            row = hf.embeddings.position_embeddings[0, 1 + long_patch]
            row.mul_(60.0 / float(row.norm()))  # about 60, where the other tokens are about 1 long
    hf.save_pretrained(folder)


@pytest.fixture(scope="module")
def dinov2_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dinov2-models")
    _save(root / "registers-plain", None)
    _save(root / "registers-long-patch", 6)  # r1c2 of the 4 x 4 grid
    return root


def _page(monkeypatch, root, name):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(root))
    at = run(VISION, timeout=120, model=f"{root.name}/{name}", sample="photo: cat")
    no_exception(at)
    assert widget(at, "vit.model_choice").value == f"{root.name}/{name}"
    return at


def test_a_register_model_from_the_model_folders_shows_no_artefact_and_its_registers(monkeypatch, dinov2_folders):
    at = _page(monkeypatch, dinov2_folders, "registers-plain")
    assert [e.label for e in at.expander if e.label == vision_norms.TITLE] == [vision_norms.TITLE]
    said = "No artefact in any layer: the largest token norm is "
    verdicts = [m for m in messages(at, "success") if m.startswith(said)]
    assert len(verdicts) == 1 and "x the median patch norm (layer " in verdicts[0]
    table = next(d.value for d in at.dataframe if list(d.value.columns) == ["token", "norm", "x median"])
    assert list(table["token"]) == ["[CLS]", "[REG0]", "[REG1]", "median patch", "longest patch"]
    assert table["x median"].iloc[3] == 1.0 and table["x median"].iloc[4] < 4
    assert any("This model has 2 registers ([REG0], [REG1])" in c for c in messages(at, "caption"))
    # The Patches table names the prefix tokens the model prepends.
    steps = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "shape", "here"])
    assert "prepend [CLS], [REG0], [REG1]" in list(steps["step"])
    assert any(
        "of its attention goes to the class token and 2 registers (not drawn)" in c for c in messages(at, "caption")
    )
    widget(at, "vit.norm_layer").set_value(0).run()
    no_exception(at)


def test_a_long_patch_is_named_as_an_artefact(monkeypatch, dinov2_folders):
    at = _page(monkeypatch, dinov2_folders, "registers-long-patch")
    warnings = [m for m in messages(at, "warning") if "artefact patch" in m]
    assert len(warnings) == 1 and warnings[0].startswith("2 artefact patches in layers 0 to 1 (norm above 4x")
    assert "r1c2 of layer 0 (" in warnings[0] and "r1c2 of layer 1 (" in warnings[0]
    layer_line = [m for m in messages(at, "markdown") if m.startswith("1 artefact patch in layer 1")]
    assert layer_line and "r1c2" in layer_line[0]
