"""The "Why here?" lesson (tformer_views.lessons.why_here): the lecture's cell and the numbers its steps say are the
core's."""

import pytest

import tformer_core as tc
from tformer_core.score_sources import SOURCES_KEPT, remove_source, score_sources
from tformer_views.lessons.why_here import LECTURE_SENTENCE, lecture_cell, why_here


@pytest.fixture(scope="module")
def minilm():
    return tc.load_model("minilm", device="cpu")


def test_the_lesson_walks_it_to_animal_with_the_cores_numbers(minilm):
    lesson = why_here(minilm)
    trace = minilm.trace(LECTURE_SENTENCE, keep=SOURCES_KEPT)
    cell = lecture_cell(trace)
    assert (trace.tokens[cell.query], trace.tokens[cell.key]) == ("it", "animal")
    weights = trace.all_attention()[:, :, cell.query, cell.key]
    assert weights[cell.layer, cell.head] == weights.max()  # the head Text attention's lecture line names
    s = score_sources(minilm, trace, cell)
    steps = dict(lesson.steps)
    assert f"gives “animal” {s.weight:.3f} of its attention" in steps["The head"]
    assert f"q·k/√d_k = **{s.score:.4f}**" in steps["The score"]
    assert f"the {len(s.query_sources) * len(s.key_sources)} pairs sum to {s.total:.4f}" in steps["Split into sources"]
    top = s.query_sources[int(abs(s.query_totals).argmax())]
    assert steps["The query side"].startswith(f"What “it” brings: **{top}**")
    removed = remove_source(minilm, s, top, LECTURE_SENTENCE)
    assert f"a real pass without it gives {removed.real_weight:.3f}" in steps["Remove the largest"]
    assert f"the linear prediction is {removed.linear_weight:.3f}" in steps["Remove the largest"]
