"""The vision pages' numbers (tformer_views.vision): attention maps and overlays, rollout against an
independent implementation, Fig. 7's filters and positions, and the mean attention distance of the real
DeiT-Tiny against one computed from transformers' own attentions (skipped when ../shared is absent)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as T
from PIL import Image

import tformer_core as tc
from tests.core.hf_helpers import DEIT, IMAGES
from tests.core.tiny_models import tiny_vit
from tformer_app import events
from tformer_core.inputs.image_file import ImageError
from tformer_core.inputs.preprocessing import ImagePreprocessing
from tformer_views import colour, samples
from tformer_views import distance as mad
from tformer_views import pictures as pics
from tformer_views import vision as vv
from tformer_views.charts import pickers
from tformer_views.charts.export import validate
from tformer_views.pictures import to_png

needs_deit = pytest.mark.skipif(
    not DEIT.is_dir(), reason=f"the shared DeiT-Tiny is not at {DEIT} (only CI has ../shared)"
)


@pytest.fixture(scope="module")
def vit():
    model = tiny_vit(distilled=True)  # 12 x 16 pictures, 4-px patches: a 3 x 4 grid, two prefix tokens
    model.preprocessing = ImagePreprocessing(resize=("exact", (12, 16)), mean=(0.5,) * 3, std=(0.25,) * 3)
    return model


@pytest.fixture(scope="module")
def result(vit):
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    return vv.analyse(vit, to_png(picture), "noise.png")


@pytest.fixture(scope="module")
def deit():
    return tc.load_model(str(DEIT), device="cpu", model_dirs=[DEIT.parent])


def test_analyse_traces_the_picture_as_the_model_sees_it(vit, result):
    assert result.image.size == (16, 12) and result.grid_hw == (3, 4) and result.patch_size == 4
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))  # the fixture's picture
    expected = vit.trace(vit.preprocessing(picture))
    np.testing.assert_array_equal(result.trace.output, expected.output)
    assert result.original_size == (40, 30) and result.notes == ()
    assert result.preprocessing is vit.preprocessing  # what the page describes is what made result.image
    with pytest.raises(ImageError, match=r"^this is an SVG drawing: it is made of shapes, not pixels"):
        vv.analyse(vit, b"<svg></svg>")
    with pytest.raises(
        tc.InputError, match=r"^this page shows Vision Transformers \(ViT, DeiT\); this model reads text$"
    ):
        vv.analyse(tc.load_model("minilm", device="cpu"), to_png(result.image))


def test_attention_maps_are_rows_of_the_weights(result):
    trace = result.trace
    w = trace.attention(1)  # [heads, 2 + 12, 2 + 12]
    np.testing.assert_allclose(vv.attention_map(trace, 1, 2), w[2, 0, 2:].reshape(3, 4), atol=1e-7)
    np.testing.assert_allclose(vv.attention_map(trace, 1, None), w[:, 0, 2:].mean(0).reshape(3, 4), atol=1e-7)
    np.testing.assert_allclose(
        vv.attention_map(trace, 0, 1, patch=5), trace.attention(0)[1, 2 + 5, 2:].reshape(3, 4), atol=1e-7
    )
    # What the map leaves out is exactly the attention to the class and distillation tokens.
    m = vv.attention_map(trace, 1, 2)
    assert 1 - m.sum() == pytest.approx(float(w[2, 0, :2].sum()), abs=1e-6)
    with pytest.raises(tc.InputError, match=r"^patch 12 is out of range: the grid has 12 patches \(0\.\.11\)$"):
        vv.attention_map(trace, 0, 0, patch=12)


def test_key_weights_are_the_querys_whole_row_and_pixels_rebuild_the_input(vit, result):
    w = result.trace.attention(1)
    np.testing.assert_allclose(vv.key_weights(result.trace, 1, 2), w[2, 0], atol=1e-7)  # prefix tokens included
    np.testing.assert_allclose(vv.key_weights(result.trace, 0, 1, patch=5), result.trace.attention(0)[1, 7], atol=1e-7)
    # The model's input rebuilt from the picture the result holds: the pass over it is the page's pass, bit for bit.
    rebuilt = vit.trace(result.pixels)
    np.testing.assert_array_equal(rebuilt.output, result.trace.output)


@needs_deit
def test_pixels_rebuild_deits_input_where_the_resize_keeps_the_aspect_and_the_crop_cuts(deit):
    """DeiT resizes the shorter side to 256 and crops 224: resizing the held 224-px picture again would not give
    the input back; rescaling and normalising it does."""
    picture = next(iter(sorted(IMAGES.glob("*.png"))))
    page = vv.analyse(deit, picture.read_bytes(), picture.name)
    with Image.open(picture) as original:
        expected = deit.preprocessing(original.convert("RGB"))
    assert page.preprocessing.crop == (224, 224) and page.preprocessing.resize == ("shortest_edge", 256)
    torch.testing.assert_close(page.pixels, expected, rtol=0, atol=0)
    assert not torch.equal(page.preprocessing(page.image), expected)  # why `pixels` does not resize again


def _rollout_reference(weights: list[np.ndarray], fusion: str, discard: float) -> np.ndarray:
    """An independent rollout in torch, as jacobgil/vit-explain writes it (rows renormalised)."""
    result = torch.eye(weights[0].shape[-1], dtype=torch.float64)
    for w in weights:
        a = torch.tensor(np.array(w), dtype=torch.float64)
        fused = {"mean": a.mean(0), "max": a.max(0).values, "min": a.min(0).values}[fusion]
        flat = fused.reshape(1, -1).clone()
        _, low = flat.topk(int(flat.size(-1) * discard), -1, largest=False)
        low = low[low != 0]
        flat[0, low] = 0
        fused = flat.reshape(fused.shape)
        a = (fused + torch.eye(fused.shape[-1], dtype=torch.float64)) / 2
        a = a / a.sum(dim=-1, keepdim=True)
        result = a @ result
    return result.numpy()


@pytest.mark.parametrize("fusion, discard", [("mean", 0.0), ("max", 0.9), ("min", 0.5)])
def test_rollout_matches_an_independent_implementation(result, fusion, discard):
    trace = result.trace
    ours = vv.rollout(trace, fusion, discard)
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-9)
    reference = _rollout_reference([trace.attention(layer) for layer in range(trace.n_layers)], fusion, discard)
    np.testing.assert_allclose(ours, reference, atol=1e-9)
    np.testing.assert_allclose(vv.rollout_map(trace, fusion, discard), ours[0, 2:].reshape(3, 4))
    with pytest.raises(tc.InputError, match=r"^head fusion must be one of \('mean', 'max', 'min'\), got 'median'$"):
        vv.rollout(trace, "median")


def test_overlay_and_pictures_have_the_expected_sizes(result):
    grid = np.zeros((3, 4))
    grid[1, 2] = 1.0  # one hot patch
    picture = pics.overlay(result.image, grid, alpha=1.0, smooth=False)
    k = pics.display_scale(result.image.size)
    assert picture.size == (16 * k, 12 * k)
    a = np.asarray(picture)
    hot, cold = a[(1 * 4 + 2) * k, (2 * 4 + 2) * k], a[2, 2]  # inside patch (1, 2), and patch (0, 0)
    assert tuple(hot) == tuple(
        colour.colourise(np.array([[1.0]]), "inferno", lo=0.0, hi=1.0)[0, 0]
    )  # the map's top colour
    assert tuple(cold) == tuple(colour.colourise(np.array([[0.0]]), "inferno", lo=0.0, hi=1.0)[0, 0])
    assert pics.grid_picture(result.image, 4).size == (16 * k + 18, 12 * k + 18)
    strip = pics.tiles([picture] * 5, [str(i) for i in range(5)], columns=3, tile_px=50)
    assert strip.size[0] == 3 * 50 + 2 * 6


def test_patch_picker_is_valid_vega_lite_with_the_picture_inside(result):
    spec = pickers.patch_picker(result.image, (3, 4), selected=5, title="query")
    validate(spec)
    frames = list(spec["datasets"].values())
    assert any(len(f) == 12 for f in frames)  # one clickable cell per patch
    url = next(f["url"][0] for f in frames if "url" in f)
    assert url.startswith("data:image/jpeg;base64,")
    assert events.clicked_patch({"selection": {"patch": [{"patch": 7}]}}) == 7
    assert events.clicked_patch({"selection": {"patch": []}}) is None and events.clicked_patch(None) is None


def test_embedding_filter_components_are_the_principal_directions(vit):
    picture, variance = vv.embedding_filter_pcs(vit, n=5)
    w = vit.encoder.embed.project.weight.detach().numpy().astype(np.float64)  # [16, 48]
    eigen = np.sort(np.linalg.eigvalsh(np.cov(w, rowvar=False)))[::-1]
    np.testing.assert_allclose(variance, eigen[:5] / eigen.sum(), rtol=1e-4)
    assert picture.mode == "RGB" and np.all(np.diff(variance) <= 1e-12)


def test_position_similarity_is_the_cosine_of_the_patch_embeddings(vit):
    sim = vv.position_similarity(vit)
    pos = vit.encoder.embed.pos.detach().numpy()[0, 2:]
    assert sim.shape == (12, 12)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-6)
    np.testing.assert_allclose(sim[3, 7], pos[3] @ pos[7] / np.linalg.norm(pos[3]) / np.linalg.norm(pos[7]), atol=1e-6)
    assert vv.position_similarity_maps(vit).size[0] > 0


@pytest.mark.slow
def test_position_maps_of_a_large_grid_stay_a_few_megapixels_and_show_every_kth_patch():
    """A ViT made for 1536-pixel pictures (a 96 x 96 grid) drew 18,622 x 18,622 pixels here: 347 megapixels,
    refused by Pillow as a decompression bomb (a traceback on the Vision page)."""
    torch.manual_seed(0)
    config = tc.ViTConfig(image_size=1536, patch_size=16, n_layers=1, d_model=8, n_heads=1, d_ff=16, n_classes=0)
    big = tc.ViT(config)
    big.preprocessing = ImagePreprocessing(resize=("exact", (1536, 1536)))
    assert vv.similarity_map_step(config.grid_hw) == 4  # 24 maps a side
    picture = vv.position_similarity_maps(big)
    assert max(picture.size) <= vv.MAX_FIGURE_PX and picture.size == (2038, 2038)  # 24 maps of 83 px, gaps of 2
    sim = vv.position_similarity(big)  # the map of patch (row 4, column 8) is the 5th down, 3rd across
    expected = colour.colourise(sim[4 * 96 + 8].reshape(96, 96), "coolwarm", lo=-1.0, hi=1.0)
    tile = np.asarray(picture)[1 * 85 : 1 * 85 + 83, 2 * 85 : 2 * 85 + 83]
    shrunk = np.asarray(Image.fromarray(expected).resize((83, 83), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(tile, shrunk)
    small = tiny_vit(distilled=False)  # a 3 x 4 grid: every patch's map, 42 // 4 = 10 px a cell
    small.preprocessing = ImagePreprocessing(resize=("exact", (12, 16)))
    assert vv.similarity_map_step(small.config.grid_hw) == 1
    assert vv.position_similarity_maps(small).size == (4 * (40 + 2) - 2, 3 * (30 + 2) - 2)


def test_uniform_baseline_is_the_analytic_mean_distance():
    # 14 x 14 grid of 16-px patches, renormalised over the patches: the mean distance between patch centres.
    r, c = np.divmod(np.arange(196), 14)
    pairwise = np.hypot(r[:, None] - r, c[:, None] - c) * 16
    assert mad.uniform_image_distance((14, 14), 16, 1, renormalize=True) == pytest.approx(pairwise.mean())
    # Not renormalised (the common recipe): the class token's 1/197 of every row counts as distance 0.
    assert mad.uniform_image_distance((14, 14), 16, 1, renormalize=False) == pytest.approx(pairwise.mean() * 196 / 197)


def test_mean_attention_distances_batch_by_batch_equal_one_trace_each(vit, result):
    rng = np.random.default_rng(1)
    pictures = [Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)) for _ in range(5)]
    seen = []
    batched = mad.distances_over_images(vit, iter(pictures), batch_size=2, progress=seen.append)
    assert batched.shape == (5, 2, 4) and seen == [2, 4, 5]
    for picture, expected in zip(pictures, batched):
        np.testing.assert_allclose(expected, mad.image_distances(vit.trace(vit.preprocessing(picture))), atol=1e-5)
    with pytest.raises(tc.InputError, match=r"^no images: choose or upload at least one$"):
        mad.distances_over_images(vit, [])


def test_samples_are_all_readable_and_folders_can_add_more(tmp_path, monkeypatch):
    names = list(samples.samples())
    assert sum(n.startswith("shapes:") for n in names) == 8
    assert [n for n in names if n.startswith("scene:")] == ["scene: 3 shapes", "scene: 4 shapes", "scene: 2 shapes"]
    assert names[:2] == ["photo: cat", "photo: coffee"]  # shipped in assets/samples: the same on every machine
    red = (255, 0, 0)
    Image.new("RGB", (8, 8), red).save(tmp_path / "red.png")
    (tmp_path / "notes.txt").write_text("not a picture")
    monkeypatch.setenv("TFORMER_IMAGE_DIRS", str(tmp_path))
    extra = samples.samples()
    assert f"{tmp_path.name}/red.png" in extra and not any(n.endswith("notes.txt") for n in extra)
    read, refused = [], []
    pictures = list(vv.read_pictures([*extra.items(), ("bad.svg", b"<svg></svg>")], read, refused))
    assert (
        len(pictures) == len(extra)
        and len(read) == len(extra)
        and refused == ["bad.svg: this is an SVG drawing: it is made of shapes, not pixels. Export it as PNG first"]
    )
    assert tuple(np.asarray(pictures[read.index(f"{tmp_path.name}/red.png")])[0, 0]) == red


@needs_deit
def test_deit_mean_attention_distance_equals_one_from_transformers_attentions(deit):
    """The page's recipe on the real DeiT-Tiny and three real photos, against transformers' own attentions
    and its own image processor, with the distance computed independently (loops over patch centres)."""
    processor = T.AutoImageProcessor.from_pretrained(str(DEIT))
    hf = T.AutoModelForImageClassification.from_pretrained(str(DEIT), attn_implementation="eager").eval()
    files = sorted(IMAGES.glob("*.png"))
    pictures = [Image.open(f).convert("RGB") for f in files]
    ours = mad.distances_over_images(deit, pictures, batch_size=2)  # [3, 12, 3]
    with torch.no_grad():
        out = hf(**processor(images=pictures, return_tensors="pt"), output_attentions=True)
    rows, cols, P = 14, 14, 16
    centres = np.array([((i // cols) * P, (i % cols) * P) for i in range(rows * cols)], dtype=np.float64)
    distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    for layer, attention in enumerate(out.attentions):  # [images, heads, 197, 197]
        a = attention.numpy().astype(np.float64)[:, :, 1:, 1:]  # patches only, not renormalised
        expected = np.einsum("bhij,ij->bhi", a, distance).mean(-1)
        np.testing.assert_allclose(ours[:, layer], expected, atol=2e-3)  # pixels; float32 attention
    assert 5 < ours.mean() < 130
    # Top-1 from the page's reading of the files equals transformers' on the same pictures.
    for f, logits in zip(files, out.logits):
        page = vv.analyse(deit, f.read_bytes(), f.name)
        assert page.trace.predictions(1)[0][0] == hf.config.id2label[int(logits.argmax())]


def test_pictures_are_decoded_one_at_a_time_as_the_batches_need_them(vit):
    """Twenty big photos must never sit decoded in memory together: the reader runs only as far as the
    current batch, and the batch size follows the model's size."""
    rng = np.random.default_rng(2)
    decoded = []

    def files():
        for i in range(7):
            decoded.append(i)
            yield f"p{i}.png", to_png(Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)))

    names, refused, batches = [], [], []
    pictures = vv.read_pictures(files(), names, refused)
    mad.distances_over_images(vit, pictures, batch_size=3, progress=lambda done: batches.append((done, len(decoded))))
    assert batches == [(3, 3), (6, 6), (7, 7)]  # a batch is traced before the next pictures are read
    assert names == [f"p{i}.png" for i in range(7)] and refused == []
    assert mad.auto_batch_size(vit) == 32  # tiny: the largest batch
    cpu, f32 = torch.device("cpu"), torch.float32
    deit_sized = SimpleNamespace(
        config=tc.ViTConfig(image_size=224, patch_size=16, d_model=192, n_layers=12, n_heads=3), device=cpu, dtype=f32
    )
    vit_b_config = tc.ViTConfig(image_size=224, patch_size=16, d_model=768, n_layers=12, n_heads=12)
    vit_b = SimpleNamespace(config=vit_b_config, device=cpu, dtype=f32)
    assert mad.auto_batch_size(deit_sized) == 18 and mad.auto_batch_size(vit_b) == 4  # 96 MB of weights a batch
    # The weights are held in the model's dtype: bfloat16 fits twice as many; a GPU's budget (1 GiB) 48 of ViT-B/16.
    assert mad.auto_batch_size(SimpleNamespace(config=vit_b_config, device=cpu, dtype=torch.bfloat16)) == 9
    assert mad.auto_batch_size(vit_b, budget_bytes=2**30, largest=64) == 48
