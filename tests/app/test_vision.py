"""The Vision Transformer and Mean attention distance pages through AppTest: the offline fallback to the
bundled vit-tiny, uploads (good and bad files), the real DeiT-Tiny from ../shared (skipped when absent)
against transformers, layer / head / query switches that run no model, rollout, and MAD over many pictures."""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
import torch
import transformers as T
from PIL import Image
from streamlit.testing.v1 import AppTest

from tests.app.pages import charts, messages, no_exception, run, widget
from tests.app.passes import PassCounter
from tests.core.hf_helpers import DEIT, IMAGES
from tformer_app import models
from tformer_views import distance, samples
from tformer_views import vision as vv

VISION, MAD = "vision", "attention_distance"
needs_deit = pytest.mark.skipif(
    not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)"
)


@pytest.fixture
def shared_models(monkeypatch):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(DEIT.parent))


def page(path, **params) -> AppTest:
    return run(path, timeout=120, **params)


def top5(at):
    return next(d.value for d in at.dataframe if list(d.value.columns) == ["class", "probability"])


def chart_data(at, title):
    return charts(at)[title]


def png(image: Image.Image, fmt="PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def test_offline_the_page_falls_back_to_vit_tiny_and_says_it_knows_eight_shapes(monkeypatch, tmp_path):
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(tmp_path))  # no ViT in the model folders
    at = page(VISION)
    no_exception(at)
    assert any(
        "cannot be had" in i and "vit-tiny" in i and "only those eight classes" in i for i in messages(at, "info")
    )
    assert top5(at)["class"].iloc[0] == "circle"  # the default sample for the shape model: "shapes: circle"
    assert at.query_params["model"] == "vit-tiny"  # the link names the model shown
    assert widget(at, "vit.model_choice").value == "vit-tiny"


@needs_deit
def test_offline_a_real_vit_in_the_model_folders_comes_before_the_shapes_model(shared_models):
    """It fell back to the 32 x 32 shapes model (a dog was a "triangle 0.626") with a real DeiT-Tiny on disk."""
    name = f"{DEIT.parent.name}/{DEIT.name}"
    for link in ({}, {"model": "facebook/deit-tiny-patch16-224"}):  # a fresh visit, and an old shared link
        at = page(VISION, sample="photo: cat", **link)
        no_exception(at)
        assert any("cannot be had" in i and name in i for i in messages(at, "info"))
        assert widget(at, "vit.model_choice").value == name and at.query_params["model"] == name
        assert "tabby" in top5(at)["class"].iloc[0] or "cat" in top5(at)["class"].iloc[0]
    widget(at, "vit.layer").set_value(10).run()  # DeiT-Tiny has 12 layers; vit-tiny fewer
    widget(at, "vit.model_choice").set_value("vit-tiny").run()
    no_exception(at)
    assert widget(at, "vit.layer").value == models.cached_model("vit-tiny").config.n_layers - 1


def test_switching_model_keeps_the_layer_only_when_the_new_model_has_it():
    at = page(VISION, model="vit-tiny", layer="1")
    assert widget(at, "vit.layer").value == 1
    model_layers = models.cached_model("vit-tiny").config.n_layers
    at = page(VISION, model="vit-tiny", layer=str(model_layers + 3))  # a layer the model does not have
    no_exception(at)
    assert widget(at, "vit.layer").value == model_layers - 1  # the last layer
    headers = [h.value for h in at.header]
    assert headers == [
        "Patches",
        "Patch embedding by hand",
        "Attention over the picture",
        "The model's own pictures (ViT paper, Fig. 7)",
    ]
    assert any("N = HW / P² = 32 · 32 / 4² = 64" in m for m in messages(at, "markdown"))
    # vit-tiny's preprocessing resizes to 32 x 32 and crops nothing: the page says what the picture went through.
    assert any(
        "is resized as this checkpoint's preprocessing does, to **H × W = 32 × 32**" in m
        for m in messages(at, "markdown")
    )


@pytest.mark.parametrize("shape", ["square", "triangle", "ring"])
def test_vit_tiny_names_each_sample_shape(shape):
    at = page(VISION, model="vit-tiny", sample=f"shapes: {shape}")
    no_exception(at)
    assert top5(at)["class"].iloc[0] == shape


def test_switching_layer_head_query_and_rollout_runs_no_model():
    at = page(VISION, model="vit-tiny")
    no_exception(at)
    with PassCounter(models.cached_model("vit-tiny")) as counter:
        images_before = len(at.get("image"))
        widget(at, "vit.layer").set_value(1)
        widget(at, "vit.head").set_value(2)
        at.run()
        widget(at, "vit.query").set_value(27)
        at.run()
        no_exception(at)
        assert "query: patch 27 (row 3, column 3)" in charts(at)
        widget(at, "vit.fusion").set_value("max")
        widget(at, "vit.discard").set_value(0.5)
        at.run()
        no_exception(at)
        assert counter.count == 0
        assert len(at.get("image")) == images_before  # the overlays are pictures, redrawn from the cached trace
        params = at.query_params
        assert (params["layer"], params["head"], params["query"], params["fusion"]) == ("1", "2", "27", "max")
        # The picker carries the overlay as a PNG and one record per patch, never attention tensors.
        frames = chart_data(at, "query: patch 27 (row 3, column 3)")
        assert sorted(len(f) for f in frames) == [1, 1, 64]
        assert next(f for f in frames if "url" in f)["url"][0].startswith("data:image/jpeg;base64,")


def test_good_uploads_are_read_and_their_changes_said(tmp_path):
    at = page(VISION, model="vit-tiny")
    at.radio(key="vit.from").set_value("upload").run()
    assert any("Upload a picture" in i for i in messages(at, "info"))
    exif = Image.Exif()
    exif[0x0112] = 8
    rgba = Image.new("RGBA", (64, 40), (255, 0, 0, 0))
    cases = {
        "photo.jpg": (png(Image.new("RGB", (120, 80), (0, 128, 0)), "JPEG", exif=exif.tobytes()), "EXIF orientation"),
        "frames.gif": (
            png(
                Image.new("RGB", (20, 20), (255, 0, 0)),
                "GIF",
                save_all=True,
                append_images=[Image.new("RGB", (20, 20), (0, 0, 255))],
            ),
            "the first is used",
        ),
        "alpha.png": (png(rgba), "laid over white"),
        "print.jpg": (png(Image.new("CMYK", (40, 40), (0, 255, 0, 0)), "JPEG"), "CMYK"),
        "scan.png": (png(Image.fromarray(np.full((40, 40), 40000, np.uint16))), "16-bit"),
        "big.png": (png(Image.new("RGB", (3000, 200), (9, 9, 9))), "downscaled from 3,000 × 200"),
    }
    for name, (data, note) in cases.items():
        at.file_uploader(key="vit.upload").set_value((name, data, "application/octet-stream")).run()
        no_exception(at)
        assert any(note in i for i in messages(at, "info")), (name, list(messages(at, "info")))
        assert len(top5(at)) == 5


def test_a_camera_shot_is_read_like_an_upload():
    at = page(VISION, model="vit-tiny", **{"from": "camera"})
    no_exception(at)
    assert any("camera" in i for i in messages(at, "info"))
    shot = Image.new("RGB", (64, 48), (30, 30, 30))
    shot.paste((250, 250, 250), (20, 12, 44, 36))  # a white square in the middle
    at.camera_input(key="vit.camera").set_value(("shot.jpg", png(shot, "JPEG"), "image/jpeg")).run()
    no_exception(at)
    assert len(top5(at)) == 5 and any("N = HW / P²" in m for m in messages(at, "markdown"))


def _png_claiming(width, height):
    data = bytearray(png(Image.new("RGB", (1, 1))))
    i = data.index(b"IHDR")
    data[i + 4 : i + 12] = struct.pack(">II", width, height)
    data[i + 17 : i + 21] = struct.pack(">I", zlib.crc32(bytes(data[i : i + 17])))
    return bytes(data)


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("drawing.svg", b"<svg xmlns='http://www.w3.org/2000/svg'><rect width='5' height='5'/></svg>", "SVG drawing"),
        ("notes.txt", b"just some words", "a text file"),
        ("paper.pdf", b"%PDF-1.4 stuff", "PDF document"),
        ("broken.jpg", png(Image.new("RGB", (64, 64)), "JPEG")[:300], "damaged or cut short"),
        ("huge.png", _png_claiming(12_000, 9_000), "108 megapixels"),
        ("empty.png", b"", "empty"),
    ],
)
def test_bad_uploads_get_a_message_and_the_page_keeps_working(name, data, message):
    at = page(VISION, model="vit-tiny")
    at.radio(key="vit.from").set_value("upload").run()
    at.file_uploader(key="vit.upload").set_value((name, data, "application/octet-stream")).run()
    no_exception(at)
    assert any(message in e and name in e for e in messages(at, "error")), list(messages(at, "error"))
    at.radio(key="vit.from").set_value("sample").run()  # nothing the user did is lost: back to a sample
    no_exception(at)
    assert not at.error and len(top5(at)) == 5


@needs_deit
def test_real_deit_top1_on_the_shared_photos_matches_transformers(shared_models):
    processor = T.AutoImageProcessor.from_pretrained(str(DEIT))
    hf = T.AutoModelForImageClassification.from_pretrained(str(DEIT)).eval()
    at = page(VISION, model=str(DEIT), **{"from": "upload"})
    for path in sorted(IMAGES.glob("*.png")):
        at.file_uploader(key="vit.upload").set_value((path.name, path.read_bytes(), "image/png")).run()
        no_exception(at)
        with torch.no_grad():
            logits = hf(**processor(images=Image.open(path).convert("RGB"), return_tensors="pt")).logits[0]
        table = top5(at)
        assert table["class"].iloc[0] == hf.config.id2label[int(logits.argmax())], path.name
        np.testing.assert_allclose(table["probability"].iloc[0], float(logits.softmax(-1).max()), atol=1e-4)
    assert any("N = HW / P² = 224 · 224 / 16² = 196" in m for m in messages(at, "markdown"))
    # DeiT's preprocessor_config.json resizes the shorter side to 256 and crops the centre 224 x 224.
    assert any("is resized and cropped as this checkpoint's preprocessing does" in m for m in messages(at, "markdown"))


def test_mad_page_over_samples_and_the_recipe_switch():
    at = page(MAD, model="vit-tiny", samples="shapes: circle,shapes: ring,shapes: plus")
    no_exception(at)
    files = samples.samples()
    model = models.cached_model("vit-tiny")
    pictures = [vv.read_image(files[n]).image for n in ("shapes: circle", "shapes: ring", "shapes: plus")]
    expected = distance.distances_over_images(model, pictures).mean(0)  # [layers, heads]
    dots = max(chart_data(at, "vit-tiny: mean attention distance"), key=len)
    np.testing.assert_allclose(dots.sort_values(["layer", "head"])["distance"], expected.ravel(), rtol=1e-6)
    assert any("3 picture(s)" in c for c in messages(at, "caption"))
    at.toggle(key="mad.renorm").set_value(True).run()
    no_exception(at)
    renormalised = max(chart_data(at, "vit-tiny: mean attention distance"), key=len)
    expected = distance.distances_over_images(model, pictures, renormalize=True).mean(0)
    np.testing.assert_allclose(renormalised.sort_values(["layer", "head"])["distance"], expected.ravel(), rtol=1e-6)
    # A bad file among the uploads is left out with its message; the others are still averaged.
    at.file_uploader(key="mad.uploads").set_value(
        [("x.svg", b"<svg></svg>", "image/svg+xml"), ("dot.png", png(Image.new("RGB", (32, 32))), "image/png")]
    ).run()
    no_exception(at)
    assert any(r"x\.svg" in w.value and "SVG" in w.value for w in at.warning)  # file names are escaped
    assert any("4 picture(s)" in c for c in messages(at, "caption"))


def test_mad_page_for_text_models_in_tokens():
    at = page(MAD, model="vit-tiny", sentences="The cat sat.\nAttention is all you need.")
    no_exception(at)
    import tformer_core as tc

    minilm = tc.load_model("minilm", device="cpu")
    traces = [minilm.trace(s) for s in ("The cat sat.", "Attention is all you need.")]
    expected = np.mean([tc.mean_token_distance(t.all_attention()) for t in traces], axis=0)
    dots = max(chart_data(at, "minilm: mean attention distance"), key=len)
    np.testing.assert_allclose(dots.sort_values(["layer", "head"])["distance"], expected.ravel(), rtol=1e-5)


@needs_deit
def test_mad_page_with_the_real_deit_over_the_shared_photos(shared_models, monkeypatch):
    monkeypatch.setenv("TFORMER_IMAGE_DIRS", str(IMAGES))
    names = [f"images/{p.name}" for p in sorted(IMAGES.glob("*.png"))]
    at = page(MAD, model=str(DEIT), samples=",".join(names))
    no_exception(at)
    dots = max(chart_data(at, f"{DEIT.parent.name}/{DEIT.name}: mean attention distance"), key=len)  # no path
    assert len(dots) == 12 * 3 and dots["distance"].between(0, 160).all()
    assert os.environ["TFORMER_IMAGE_DIRS"] == str(IMAGES)


def test_attention_rollout_and_relevancy_side_by_side_for_a_chosen_class():
    at = page(VISION, model="vit-tiny")
    no_exception(at)
    options = widget(at, "vit.explain").options
    assert len(options) == 5 and options[0].startswith("1. ")

    def shown(at):
        images = at.get("image")
        captions = [i.proto.imgs[0].caption for i in images]
        start = next(i for i, c in enumerate(captions) if c.startswith("Raw attention: the class token"))
        assert captions[start + 1].startswith("Rollout") and captions[start + 2].startswith("Relevancy for")
        return [images[start + k].proto.imgs[0].url for k in range(3)], captions[start + 2]

    first, caption = shown(at)
    top = top5(at)["class"]
    assert caption.startswith(f"Relevancy for {top.iloc[0]}")
    widget(at, "vit.explain").set_value(3).run()
    no_exception(at)
    second, caption = shown(at)
    assert caption.startswith(f"Relevancy for {top.iloc[3]}")
    assert second[:2] == first[:2]  # where the model looked does not depend on the class asked about
    assert second[2] != first[2]  # relevancy does
    assert at.query_params["explain"] == "3"


def test_the_relevancy_map_is_the_class_tokens_row_of_the_cores_relevancy_for_that_class():
    from tformer_core import probes
    from tformer_core.relevancy import relevancy

    model = models.cached_model("vit-tiny")
    picture = Image.new("RGB", (64, 64), "white")
    maps = [vv.relevancy_map(model, png(picture), "white.png", c) for c in (0, 1)]
    assert maps[0].shape == model.config.grid_hw and np.all(maps[0] >= 0)
    assert not np.allclose(maps[0], maps[1])  # another class, another map
    direct = relevancy(probes.class_probe(model, model.preprocessing(picture), 1))[0].relevance
    np.testing.assert_allclose(maps[1].ravel(), direct[0, model.config.n_prefix_tokens :], rtol=1e-6)
