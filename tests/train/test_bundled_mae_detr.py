"""The bundled masked autoencoder (mae-tiny) and DETR (detr-tiny): their generated data, the box maths and the
exact matching DETR's loss uses, the shipped models' layout and loading, what they do on fixed and on freshly
drawn held-out pictures (against the figures their model cards state), and reproducible training."""

from __future__ import annotations

import io
import json
from itertools import permutations

import numpy as np
import pytest
import torch
from PIL import Image

import tformer_core as tc
from tformer_core import bundled
from tformer_core.models.detr import DETR
from tformer_core.models.mae import MAE, pixel_patches, random_mask
from tformer_train import boxes, detr_tiny, mae_tiny
from tformer_train import data as td
from tformer_views import detection as dv
from tformer_views import mae as mv
from tformer_views import samples
from tformer_views.pictures import to_png

TEST_SEED = 7_531  # neither the training stream nor the model cards' evaluation
N_MAE, N_DETR = 400, 300


@pytest.fixture(scope="module")
def mae():
    return tc.load_model("mae-tiny", device="cpu")


@pytest.fixture(scope="module")
def detr():
    return tc.load_model("detr-tiny", device="cpu")


def png_of(image: torch.Tensor) -> bytes:
    """(3, H, W) in [0, 1] -> PNG bytes, as a sample picture is stored."""
    return to_png(Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)))


# ---- box maths and matching ----------------------------------------------------------------------
def test_iou_and_generalised_iou_by_hand():
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 2.0, 2.0], [4.0, 0.0, 6.0, 2.0]])
    iou, union = boxes.box_iou(a, b)
    # Overlap 1 of union 7; the same box; apart.
    torch.testing.assert_close(iou, torch.tensor([[1 / 7, 1.0, 0.0]]))
    torch.testing.assert_close(union, torch.tensor([[7.0, 4.0, 8.0]]))
    giou = boxes.generalized_iou(a, b)
    # Enclosing boxes 3 x 3 = 9, 4, and 6 x 2 = 12: IoU - (C - union) / C.
    torch.testing.assert_close(giou, torch.tensor([[1 / 7 - 2 / 9, 1.0, -4 / 12]]))
    centred = torch.tensor([[2.0, 3.0, 4.0, 2.0]])
    torch.testing.assert_close(boxes.cxcywh_to_xyxy(centred), torch.tensor([[0.0, 2.0, 4.0, 4.0]]))
    torch.testing.assert_close(boxes.xyxy_to_cxcywh(boxes.cxcywh_to_xyxy(centred)), centred)
    batched = boxes.generalized_iou(a[None].expand(2, -1, -1), b[None].expand(2, -1, -1))  # a batch of 2
    torch.testing.assert_close(batched, giou[None].expand(2, -1, -1))


def test_assign_is_the_least_total_cost_where_a_greedy_choice_is_not():
    cost = np.array([[1.0, 2.0], [1.5, 9.0], [5.0, 5.0]])
    rows, cols = boxes.assign(cost)
    # Greedy (column 0 takes its cheapest row 0) leaves column 1 with row 2: 1 + 5 = 6; the best is 1.5 + 2.
    assert rows.tolist() == [1, 0] and cols.tolist() == [0, 1]
    rng = np.random.default_rng(0)
    for q, t in ((10, 4), (6, 3), (4, 4), (5, 1)):
        cost = rng.normal(size=(q, t))
        rows, _ = boxes.assign(cost)
        best = min(sum(cost[r, j] for j, r in enumerate(p)) for p in permutations(range(q), t))
        assert len(set(rows.tolist())) == t
        assert cost[rows, np.arange(t)].sum() == pytest.approx(best)
    assert boxes.assign(np.zeros((3, 0)))[0].shape == (0,)
    with pytest.raises(ValueError, match=r"^3 columns cannot each get their own row out of 2$"):
        boxes.assign(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"^30 x 6 is too large for the exact search \(427,518,000 ways\)$"):
        boxes.assign(np.zeros((30, 6)))


# ---- generated detection scenes ---------------------------------------------------------------------
def test_detection_scenes_hold_1_to_4_shapes_apart_with_tight_boxes():
    scenes = td.make_detection_scenes(200, TEST_SEED)
    again = td.make_detection_scenes(200, TEST_SEED)
    assert torch.equal(scenes.images, again.images) and torch.equal(scenes.boxes, again.boxes)
    assert scenes.images.shape == (200, 3, 64, 64) and scenes.images.min() >= 0 and scenes.images.max() <= 1
    assert set(scenes.counts.tolist()) == {1, 2, 3, 4}
    for i in range(200):
        labels, b = scenes.objects(i)
        assert ((labels >= 0) & (labels < 8)).all() and (scenes.labels[i, len(labels) :] == -1).all()
        size = b[:, 2:] - b[:, :2]
        assert ((size >= 8) & (size <= 20)).all() and (b >= 0).all() and (b <= 64).all()
        iou, _ = boxes.box_iou(b, b)
        assert torch.equal(iou, torch.eye(len(labels)))  # no two shapes' boxes meet
    # A box is the tight box of the pixels the shape covers by at least a quarter.
    coverage = torch.zeros(1, 64, 64)
    coverage[0, 10:20, 5:15] = 1.0
    coverage[0, 9, 5:15] = 0.3  # a row a third covered: in the box
    coverage[0, 30, 30] = 0.2  # a corner barely touched: not
    assert td._boxes(coverage).tolist() == [[5.0, 9.0, 15.0, 20.0]]


def test_the_single_shape_scenes_are_still_the_ones_vit_tiny_was_trained_on():
    """make_scenes was split into parts for the detection scenes: the same numbers must come out (the shipped
    vit-tiny's training stream, its card's evaluation and the samples depend on them)."""
    scenes = td.make_scenes(3, 2024)
    assert scenes.labels.tolist() == [0, 2, 0]  # the numbers the code wrote before it was split
    np.testing.assert_allclose(scenes.images[0, :, 0, 0].numpy(), [0.24852, 0.66787, 0.88157], atol=1e-5)
    assert float(scenes.coverage.sum()) == 309.125


# ---- mae-tiny ---------------------------------------------------------------------------------------
def test_mae_tiny_is_a_small_vit_mae_on_32_px_shapes(mae):
    c = mae.config
    assert isinstance(mae, MAE) and mae.source == "mae-tiny"
    assert (c.image_size, c.patch_size, c.mask_ratio, c.n_patches, c.n_kept) == (32, 4, 0.75, 64, 16)
    assert not c.norm_pix_loss and c.decoder_n_layers == 2
    assert mae.preprocessing is not None and mae.preprocessing.mean == (0.5, 0.5, 0.5)
    assert (
        bundled.file_sha256(bundled.asset_dir("mae-tiny") / "model.safetensors")
        == (bundled.recorded("mae-tiny")["weights_sha256"])
    )


def test_mae_tiny_beats_the_baselines_on_fresh_held_out_scenes_as_its_card_says(mae):
    scenes = td.make_scenes(N_MAE, TEST_SEED)
    noise = torch.rand(N_MAE, 64, generator=torch.Generator().manual_seed(TEST_SEED))
    predicted, target, mask = mae_tiny.reconstruct(mae, scenes.images, noise)
    assert mask.sum(1).eq(48).all()
    model = float(mae_tiny.masked_mse(predicted, target, mask))
    mean_colour = float(mae_tiny.masked_mse(mae_tiny.mean_colour_prediction(target, mask), target, mask))
    nearest = float(mae_tiny.masked_mse(mae_tiny.nearest_visible_prediction(target, mask, (8, 8)), target, mask))
    stated = bundled.recorded("mae-tiny")["evaluation"]["masked"]
    # Other pictures and masks than the card's (x2.30 and x2.79 here, x2.29 and x2.82 stated): each ratio within
    # 10 % of the stated one.
    assert mean_colour / model >= 0.9 * stated["mean_colour_ratio"], (model, mean_colour)
    assert nearest / model >= 0.9 * stated["nearest_visible_ratio"], (model, nearest)
    assert model == pytest.approx(stated["model_mse"], rel=0.1)


def test_baselines_by_hand():
    """One image of two 1-pixel patches, one masked: the mean colour is the visible patch's, so is the nearest."""
    target = torch.tensor([[[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]])  # (1, 2 patches, 1 pixel x 3 channels)
    mask = torch.tensor([[0.0, 1.0]])
    expected = torch.tensor([[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]])
    torch.testing.assert_close(mae_tiny.mean_colour_prediction(target, mask), expected)
    torch.testing.assert_close(mae_tiny.nearest_visible_prediction(target, mask, (1, 2)), expected)
    assert float(mae_tiny.masked_mse(expected, target, mask)) == pytest.approx((16 + 9 + 4) / 3)


def test_pixel_patches_are_in_the_order_the_views_read():
    x = torch.randn(2, 3, 8, 12)
    ours = pixel_patches(x, 4)
    for b in range(2):
        np.testing.assert_array_equal(ours[b].numpy(), mv._patches(x[b].numpy(), 4))


def test_mae_tiny_rebuilds_the_sample_circle_on_the_page(mae):
    """The page's default: the "shapes: circle" sample, masking seed 0. The rebuilt picture is closer to the
    picture than the mean colour of what the encoder saw, on the hidden patches."""
    data = samples.samples()["shapes: circle"]
    result = mv.analyse(mae, data, "circle.png", seed=0)
    np.testing.assert_array_equal(result.mask, random_mask(64, 0.75, 0))
    errors = mv.patch_errors(result)  # [8, 8], NaN where visible
    assert np.isnan(errors).sum() == 16
    target = torch.from_numpy(mv._patches(result.pixels, 4))[None]
    mask = torch.from_numpy(result.mask.astype(np.float32))[None]
    baseline = float(mae_tiny.masked_mse(mae_tiny.mean_colour_prediction(target, mask), target, mask))
    assert np.nanmean(errors) < baseline / 2, (np.nanmean(errors), baseline)  # 0.066 against 0.191
    rebuilt = np.asarray(mv.reconstruction(result), dtype=np.float64)  # the visible patches pasted back
    picture = np.asarray(result.image, dtype=np.float64)
    kept = np.kron(1 - result.mask.reshape(8, 8), np.ones((4, 4))).astype(bool)  # [32, 32] pixels of kept patches
    assert np.abs(rebuilt - picture)[kept].max() <= 1  # to 8-bit rounding
    assert np.abs(rebuilt - picture)[~kept].mean() > 5  # the hidden ones are the model's, not the picture's


def test_mae_photo_preprocessing_matches_the_training_normalisation(mae):
    image = td.make_scenes(1, TEST_SEED).images[0]
    pil = Image.open(io.BytesIO(png_of(image)))
    x = mae.preprocessing(pil)
    torch.testing.assert_close(x, (image - 0.5) / 0.3, atol=0.5 / 255 / 0.3 + 1e-6, rtol=0)


# ---- detr-tiny --------------------------------------------------------------------------------------
def test_detr_tiny_is_a_small_detr_with_a_basic_resnet(detr):
    c = detr.config
    assert isinstance(detr, DETR) and detr.source == "detr-tiny"
    assert (c.n_queries, c.n_encoder_layers, c.n_decoder_layers, c.d_model) == (10, 2, 2, 64)
    assert (c.backbone_layer_type, c.backbone_hidden_sizes, c.backbone_depths) == ("basic", (32, 64), (1, 1))
    assert tuple(detr.output_labels) == td.SHAPE_CLASSES
    trace = detr.trace(torch.zeros(3, 64, 64))
    assert trace.grid_hw == (8, 8) and len(trace.target_tokens) == 10
    assert (
        bundled.file_sha256(bundled.asset_dir("detr-tiny") / "model.safetensors")
        == (bundled.recorded("detr-tiny")["weights_sha256"])
    )


def test_the_training_losses_read_every_decoder_layer_and_the_last_is_the_model(detr):
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        layers = detr_tiny.decoded_layers(detr, x)
        logits, out = detr(x)
    assert len(layers) == 2
    torch.testing.assert_close(layers[-1][0], logits, rtol=0, atol=0)
    torch.testing.assert_close(layers[-1][1], out, rtol=0, atol=0)


def test_the_set_loss_is_small_for_the_right_answer_and_matches_it_whatever_the_query_order():
    scenes = td.make_detection_scenes(4, TEST_SEED)
    Q = 10
    targets = detr_tiny.normalised_targets(scenes)
    logits = torch.full((4, Q, 9), -10.0)
    logits[..., -1] = 10.0  # every query: no object
    boxes_ = torch.full((4, Q, 4), 0.5)
    order = torch.tensor([7, 2, 9, 4])  # the objects answered by these queries, in this order
    for b in range(4):
        k = int(scenes.counts[b])
        logits[b, order[:k], -1] = -10.0
        logits[b, order[:k], scenes.labels[b, :k]] = 10.0
        boxes_[b, order[:k]] = targets[b, :k]
    matches = detr_tiny.match(logits, boxes_, scenes)
    for b, (queries, objects) in enumerate(matches):
        k = int(scenes.counts[b])
        assert queries.tolist() == order[:k].tolist() and objects.tolist() == list(range(k))
    assert float(detr_tiny.set_loss(logits, boxes_, scenes)) < 1e-3
    wrong = boxes_.clone()
    wrong[:, :, :2] += 0.1  # every box moved
    assert float(detr_tiny.set_loss(logits, wrong, scenes)) > 1.0


def sample_scene(count: int) -> tuple[bytes, torch.Tensor, torch.Tensor]:
    """The "scene: <count> shapes" sample and its shapes' labels and boxes, as samples.py chose it."""
    scenes = td.make_detection_scenes(32, seed=2024)
    index = next(
        i for i in range(32) if int(scenes.counts[i]) == count and len(set(scenes.objects(i)[0].tolist())) == count
    )
    data = samples.samples()[f"scene: {count} shapes"]
    assert data == png_of(scenes.images[index])
    return data, *scenes.objects(index)


@pytest.mark.parametrize("count", [3, 4, 2])
def test_detr_tiny_finds_each_shape_of_the_sample_scenes_as_the_page_shows_them(detr, count):
    data, labels, truth = sample_scene(count)
    result = dv.analyse(detr, data, f"scene{count}.png")
    assert result.image.size == (64, 64)
    found = dv.detections(result, detr_tiny.THRESHOLD)  # the page's default threshold
    assert len(found) == count, [(d.label, round(d.probability, 2)) for d in found]
    iou, _ = boxes.box_iou(torch.tensor([d.box for d in found]), truth)  # (found, shapes)
    best = iou.argmax(1)
    assert sorted(best.tolist()) == list(range(count))  # each shape found once
    assert (iou.max(1).values >= 0.5).all(), iou
    assert [d.label for d in found] == [td.SHAPE_CLASSES[int(labels[j])] for j in best]


def test_detr_tiny_precision_and_recall_on_fresh_held_out_scenes_as_its_card_says(detr):
    scenes = td.make_detection_scenes(N_DETR, TEST_SEED)
    probs, predicted = detr_tiny.predict(detr, scenes.images)
    hits = n_found = 0
    for i in range(N_DETR):
        labels, truth = scenes.objects(i)
        found = detr_tiny.detections(probs[i], predicted[i])
        hits += len(detr_tiny._greedy(found, labels, truth, by_class=True))
        n_found += len(found)
    precision, recall = hits / n_found, hits / int(scenes.counts.sum())
    stated = bundled.recorded("detr-tiny")["evaluation"]
    # 92.2 % and 95.7 % here; 92.9 % and 96.4 % stated, on 2,000 other scenes.
    assert precision >= stated["precision"] - 0.03 and recall >= stated["recall"] - 0.03, (precision, recall)


def test_detr_photo_preprocessing_matches_the_training_normalisation(detr):
    image = td.make_detection_scenes(1, TEST_SEED).images[0]
    pil = Image.open(io.BytesIO(png_of(image)))
    x = detr.preprocessing(pil)
    torch.testing.assert_close(x, (image - 0.5) / 0.3, atol=0.5 / 255 / 0.3 + 1e-6, rtol=0)
    assert detr.preprocessing.size(640, 480) == (64, 48)  # a photo keeps its aspect, the longer side 64 px


# ---- cards and training --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mae-tiny", "detr-tiny"])
def test_shipped_cards_are_rendered_from_the_recorded_figures(name):
    from tformer_train import cards

    assert cards.render(bundled.asset_dir(name)) == bundled.model_card(name)
    meta = json.loads((bundled.asset_dir(name) / "config.json").read_text())
    assert meta["training"]["command"] == f"python -m tformer_core.bundled.train {name}"  # the recipe's own steps


def test_the_cards_state_the_measured_figures():
    mae = bundled.recorded("mae-tiny")["evaluation"]["masked"]
    assert f"x{mae['mean_colour_ratio']:.2f}" in bundled.model_card("mae-tiny")
    detr = bundled.recorded("detr-tiny")["evaluation"]
    card = bundled.model_card("detr-tiny")
    assert f"Precision **{detr['precision']:.1%}**, recall **{detr['recall']:.1%}**" in card


TRAINED = ["mae-tiny", "detr-tiny"]


@pytest.fixture(scope="module")
def trained_by_the_command_line(command_lines):
    """The training command line, `NAME --steps 3 --seed 3 --out d/NAME --no-eval`, for both models (one fresh
    process, another string-hash seed: tests/conftest.py); the folder holding their d/."""
    from tformer_train import train

    runs = [[name, "--steps", "3", "--seed", "3", "--out", f"d/{name}", "--no-eval"] for name in TRAINED]
    return command_lines(train.__name__, runs)


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_training_reproduces_the_same_weights_for_the_same_seed(name, tmp_path, trained_by_the_command_line):
    from tformer_train.train import all_trainers

    trainer = all_trainers()[name]
    quiet = lambda message: None  # noqa: E731
    first = trainer(steps=3, seed=3, out=tmp_path / "a", evaluate=False, log=quiet)
    again = trainer(steps=3, seed=3, out=tmp_path / "b", evaluate=False, log=quiet)
    other = trainer(steps=3, seed=4, out=tmp_path / "c", evaluate=False, log=quiet)
    assert first.weights_sha256 == again.weights_sha256 != other.weights_sha256
    written = trained_by_the_command_line / "d" / name / "model.safetensors"
    assert bundled.file_sha256(written) == first.weights_sha256
    model = bundled.load_from_dir(tmp_path / "a", "cpu")  # what was written loads back
    assert model.kind == ("mae" if name == "mae-tiny" else "detr") and not model.training
    assert not torch.are_deterministic_algorithms_enabled()
