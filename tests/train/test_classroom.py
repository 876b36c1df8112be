"""Training in class (tformer_train.classroom): the lectures' encoder copied into the core's Encoder gives the
same numbers, a seed gives the same run, the limits hold, a run can be cancelled. (Its time on the default
sizes is measured in benchmarks/train.py, not here.)"""

import threading

import numpy as np
import pytest
import torch

from tformer_core.errors import InputError
from tformer_train import classroom as cr
from tformer_train import corpora

QUICK_TEXT = dict(n_layers=1, n_heads=2, d_model=32, epochs=2, limit=256)
QUICK_IMAGE = dict(n_layers=1, n_heads=2, d_model=32, epochs=2, limit=256)


@pytest.fixture(scope="module")
def text_run():
    events = []
    return cr.train(cr.TextJob(**QUICK_TEXT), report=events.append, device="cpu"), events


def test_the_lecture_encoder_and_the_core_encoder_compute_the_same(text_run):
    tokenizer = cr.text_tokenizer()
    job = cr.TextJob(n_layers=2, n_heads=2, d_model=32)
    lecture = cr.LectureTextClassifier(len(tokenizer), job)
    cr.initialise(lecture, torch.Generator().manual_seed(3))
    lecture.eval()
    core = cr.to_core_encoder(lecture, tokenizer)
    ids = torch.tensor([tokenizer.encode(cr.FIXED_SENTENCE)])
    weights = []
    with torch.no_grad():
        logits = lecture(ids, None, weights)
    trace = core.trace(ids[0].tolist())
    np.testing.assert_allclose(trace["head.logits"], logits[0].numpy(), atol=1e-5)
    for layer in range(2):  # nn.MultiheadAttention's own weights, per head
        np.testing.assert_allclose(trace.attention(layer), weights[layer][0].numpy(), atol=1e-5)
    assert core.config.ln_eps == 1e-6 and core.config.norm == "post" and core.config.activation == "relu"
    assert trace.tokens[0] == "<bos>"  # the classifier's [CLS]


def test_a_seed_gives_the_same_run_and_another_seed_another(text_run):
    first, _ = text_run
    again = cr.train(cr.TextJob(**QUICK_TEXT), device="cpu")
    other = cr.train(cr.TextJob(**{**QUICK_TEXT, "seed": 1}), device="cpu")
    for a, b in zip(first.model.state_dict().values(), again.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [e.train_loss for e in first.history] == [e.train_loss for e in again.history]
    assert first.test_accuracy == again.test_accuracy
    assert [e.train_loss for e in first.history] != [e.train_loss for e in other.history]


def test_a_run_reports_progress_every_epoch_and_measures_the_test_split(text_run):
    result, events = text_run
    epochs = [e for e in events if isinstance(e, cr.Epoch)]
    steps = [e for e in events if isinstance(e, cr.Progress)]
    assert [e.epoch for e in epochs] == [0, 1]
    assert steps[-1].step == steps[-1].total_steps == 2 * (256 // 64)
    n = len(cr.text_tokenizer().encode(cr.FIXED_SENTENCE))
    assert epochs[-1].attention.shape == (1, 2, n, n)
    np.testing.assert_allclose(epochs[-1].attention.sum(-1), 1.0, rtol=1e-5)
    assert result.test_items == len(corpora.sentences("test"))
    assert 0.0 <= result.test_accuracy <= 1.0
    assert result.model.trace("a witty film").predictions(1)[0][0] in corpora.SENTIMENT_LABELS


def test_a_run_computes_with_one_thread_and_leaves_every_other_threads_count():
    """Two threads on a server's shared cores spin against each other (benchmarks/train.py); the run takes one in
    its own thread, and a request that starts meanwhile, or the caller afterwards, keeps the process's count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    seen, others = [], []

    def other_thread() -> None:
        torch.ones(4).sum()  # a new thread's first operation takes the process's count
        others.append(torch.get_num_threads())

    def report(event):
        seen.append(torch.get_num_threads())
        if not others:
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()

    try:
        cr.train(cr.TextJob(**{**QUICK_TEXT, "epochs": 1}), report=report, device="cpu")
        assert set(seen) == {cr.TRAIN_THREADS} == {1} and others == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_a_tiny_vit_learns_the_digits_and_keeps_its_class_token_attention():
    result = cr.train(cr.ImageJob(n_layers=1, n_heads=2, d_model=32, epochs=3), device="cpu")
    assert result.test_accuracy > 0.5  # chance is 0.1
    last = result.history[-1]
    assert last.attention.shape == (1, 2, 17, 17)  # [CLS] + 4 x 4 patches of 2 px
    assert result.model.class_names == list(corpora.DIGIT_LABELS)
    picture = cr.digit_pixels(corpora.digits("test")[0][:1])[0]
    assert result.model.trace(picture).predictions(1)[0][0] in corpora.DIGIT_LABELS


def test_sizes_outside_the_limits_are_refused_with_a_message():
    with pytest.raises(InputError, match=r"^layers must be 1 to 4, got 9$"):
        cr.TextJob(n_layers=9)
    with pytest.raises(InputError, match=r"^d_model must be one of \(32, 64, 96, 128\), got 50$"):
        cr.TextJob(d_model=50)
    with pytest.raises(InputError, match=r"^epochs must be 1 to 10 for this model, got 11$"):
        cr.TextJob(epochs=11)
    with pytest.raises(InputError, match=r"^the patch size must be 2 or 4 pixels \(8 x 8 pictures\), got 3$"):
        cr.ImageJob(patch_size=3)


def test_a_cancelled_run_stops_between_batches():
    calls = []

    def cancelled():
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(cr.Cancelled):
        cr.train(cr.TextJob(**QUICK_TEXT), cancelled=cancelled, device="cpu")
    assert len(calls) == 3
