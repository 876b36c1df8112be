"""Questions about a view, with the model's answer computed from the same weights; the projector's chart."""

from __future__ import annotations

import numpy as np

from tformer_views.class_questions import Question, answer_chart, histogram, text_questions, vision_questions


def test_text_questions_answer_from_the_views_weights():
    labels = ["[CLS]", "the", "cat", "it", "[SEP]"]
    w = np.full((2, 3, 5, 5), 0.2)  # uniform rows (sum to 1) but one: layer 1, head 2, query "it"
    w[1, 2, 3] = [0.05, 0.05, 0.7, 0.1, 0.1]
    w[0, 1, 3] = [0.0, 0.0, 0.9, 0.1, 0.0]  # the head that links "it" to "cat" most
    token, head, number = text_questions(labels, w, layer=1, head=2, query=3)
    assert token.prompt == "Which token does “it” attend to most in layer 1, head 2?"
    assert token.answer == 2 and token.choices == labels
    assert head.prompt == "Which head links “it” to “cat” most strongly?"
    assert head.choices[head.answer] == "L0 H1" and head.grid == (2, 3)
    assert number.answer == 0.7 and (number.lo, number.hi) == (0.0, 1.0)


def test_vision_question_picks_the_brightest_patch():
    grid = np.zeros((2, 3))
    grid[1, 0] = 0.4
    patch, number = vision_questions(grid, layer=11, head=None, who="the class token")
    assert patch.answer == 3 and patch.choices[3] == "row 1, col 0" and patch.grid == (2, 3)
    assert patch.prompt == "Which patch does the class token attend to most in layer 11, the mean of the heads?"
    assert number.answer == 0.4


def test_the_projector_chart_outlines_the_model_answer_only_once_revealed():
    q = Question("token", "Which?", choices=["a", "b", "c"], answer=1)
    counts = [n for _, n in histogram(q, [0, 1, 1, 2, 1])]
    assert counts == [1, 3, 1]
    hidden = answer_chart(q, counts, revealed=False)["datasets"]["answers"]
    shown = answer_chart(q, counts, revealed=True)["datasets"]["answers"]
    assert list(hidden["answers"]) == [1, 3, 1] and not hidden["model"].any()
    assert list(shown["model"]) == [False, True, False]
    patch = Question("patch", "Where?", choices=[f"{i}" for i in range(6)], answer=4, grid=(2, 3))
    cells = answer_chart(patch, [0, 0, 2, 0, 1, 0], revealed=True)["datasets"]["answers"]
    assert cells[["row", "col", "answers"]].values.tolist()[2] == [0, 2, 2] and cells["model"].tolist()[4]
