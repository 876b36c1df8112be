"""What the Train page shows of a training: the loss and the accuracy each on an axis of its own, the attention
snapshot at the cell size asked, the digits a trained ViT is opened on."""

import io

import numpy as np
from PIL import Image

from tformer_train import classroom, corpora
from tformer_views import samples
from tformer_views import training as tv
from tformer_views.charts.export import validate


def _epochs(n: int, tokens: int = 5) -> list[classroom.Epoch]:
    attention = np.full((1, 2, tokens, tokens), 1 / tokens, dtype=np.float32)
    names = tuple(f"t{i}" for i in range(tokens))
    return [classroom.Epoch(i, 2.0 - 0.3 * i, 0.3 + 0.1 * i, attention, names, 1.0) for i in range(n)]


def test_the_loss_and_the_accuracy_have_an_axis_each_with_its_own_scale_and_title():
    spec = tv.curves_chart(_epochs(4), 480)
    validate(spec)
    assert spec["resolve"] == {"scale": {"y": "independent"}}
    loss, accuracy = (layer["encoding"]["y"] for layer in spec["layer"])
    assert (loss["field"], loss["title"], loss["axis"]["orient"]) == ("training loss", "training loss", "left")
    assert (accuracy["title"], accuracy["axis"]["orient"], accuracy["scale"]) == (
        "validation accuracy",
        "right",
        {"domain": [0, 1]},
    )
    assert loss["axis"]["titleColor"] != accuracy["axis"]["titleColor"]  # each axis in its curve's colour
    (frame,) = spec["datasets"].values()
    assert list(frame["epoch"]) == [1, 2, 3, 4] and list(frame["training loss"]) == [2.0, 1.7, 1.4, 1.1]


def test_the_snapshot_takes_the_cell_size_it_is_given():
    epoch = _epochs(1, tokens=17)[0]
    assert tv.snapshot_chart(epoch, 0, 1, image=False, cell=20)["width"] == 17 * 20
    picture = classroom.Epoch(0, 1.0, 0.5, np.full((1, 1, 17, 17), 1 / 17, np.float32), ("[CLS]",) * 17, 1.0)
    assert tv.snapshot_chart(picture, 0, 0, image=True, cell=30)["width"] == 4 * 30  # 16 patches: 4 x 4


def test_the_digit_samples_are_the_test_pictures_as_the_digits_vit_reads_them():
    found = samples.digit_samples()
    assert list(found) == [f"digit: {d}" for d in range(10)]
    images, labels = corpora.digits("test")
    first = samples.first_digit()
    assert first == f"digit: {labels[0]}"
    pixels = np.asarray(Image.open(io.BytesIO(found[first])))
    assert pixels.shape == (8, 8)  # read as it is: the preprocessing's 8 x 8 resize changes nothing
    np.testing.assert_allclose(pixels / 255, images[0] / 16, atol=1 / 255)
