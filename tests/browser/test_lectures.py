"""The pages of issue 26 in a real browser: Attention before Transformers (a sentence typed in, its weights
redrawn), a training on the Train page followed live (the queue's fragment polling every second) to its
result and opened in the Text attention page, the Inductive bias and Masked autoencoder pages offline.
Screenshots go to the `screenshots` folder (early.png, train_live.png, train_done.png, shift.png, mae.png)."""

from __future__ import annotations

import pytest

from .helpers import (
    CHART,
    IMAGE,
    assert_no_error,
    press_button,
    screenshot,
    settle,
    type_into,
    wait_for_count,
    wait_for_text,
    wait_for_url,
)

pytestmark = pytest.mark.browser


def test_attention_before_transformers_redraws_for_a_new_sentence(server_url, page, screenshots):
    page.goto(f"{server_url}/early")
    settle(page)
    wait_for_text(page, "Score functions side by side")
    wait_for_text(page, "attention pooling says")
    wait_for_count(page, CHART, 3)  # the weights over the words, the RNN's alpha, the translator's cross-attention
    type_into(page, "A sentence about a film", "The worst film of the year, a dull and tedious mess.")
    wait_for_url(page, "sentence=The+worst")
    settle(page)
    wait_for_text(page, "negative (")
    wait_for_text(page, "The two put their largest weight on the same source word for")
    assert_no_error(page)
    screenshot(page, screenshots / "early.png")


def test_a_training_is_followed_live_and_opens_in_the_text_page(server_url, page, screenshots):
    page.goto(f"{server_url}/train?layers=2&d=32&epochs_text=2")
    settle(page)
    press_button(page.get_by_role("button", name="Train", exact=True))
    wait_for_text(
        page, ", loss ", timeout=120
    )  # "epoch 1 of 2, step 5 of 246, loss 0.69": redrawn by the polling fragment
    screenshot(page, screenshots / "train_live.png")
    wait_for_text(page, "Your text classifier", timeout=300)
    settle(page)
    wait_for_text(page, "Test accuracy (1035 sentences never trained on)")
    wait_for_count(page, CHART, 2)  # the curves and the attention snapshot
    # The snapshot whole in its half of the page (its chart box scrolls what does not fit: 523 px in a 402-px column).
    snapshot = page.locator(CHART).filter(has=page.locator("svg, canvas")).nth(1)
    assert snapshot.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), snapshot.evaluate(
        "e => [e.scrollWidth, e.clientWidth]"
    )
    assert_no_error(page)
    screenshot(page, screenshots / "train_done.png")
    press_button(page.get_by_role("button", name="in Text attention"))
    wait_for_url(page, "/text")
    settle(page)
    wait_for_url(page, "model=session%3Atext-classifier-")
    wait_for_text(page, "Classification of the whole input")  # its negative / positive head, read by the page
    assert_no_error(page)


def test_inductive_bias_and_the_mae_masking_offline(server_url, page, screenshots):
    page.goto(f"{server_url}/shift")
    settle(page)
    wait_for_text(page, "every patch embedding is the same vector as before", timeout=120)
    wait_for_count(page, IMAGE, 4)
    wait_for_text(page, "Every shift from 0 to")
    assert_no_error(page)
    screenshot(page, screenshots / "shift.png")
    page.goto(f"{server_url}/mae?seed=7")  # the bundled mae-tiny, offline
    settle(page)
    wait_for_text(page, "48 of 64 patches masked (75%); the encoder sees 16")
    wait_for_text(page, "times smaller than filling them with the mean colour")
    wait_for_count(page, IMAGE, 5)
    assert_no_error(page)
    screenshot(page, screenshots / "mae.png")
