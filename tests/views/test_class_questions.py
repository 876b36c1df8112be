"""Questions about a view, with the model's answer computed from the same weights; the projector's chart."""

from __future__ import annotations

import base64
import io

import numpy as np

from tformer_views.class_questions import (
    Question,
    ablation_effect,
    answer_chart,
    effect_chart,
    head_questions,
    histogram,
    key_token,
    patch_answer_picker,
    question_picture,
    text_questions,
    vision_questions,
    vote_shift,
)


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


def test_the_key_token_of_a_pair_question_is_never_a_special_token_or_the_sink():
    """Generated questions asked "which head links 'it' to '[CLS]'?": the key token skips [CLS], [SEP], a BOS
    (<|im_start|>) and the first token (the sink), unless the row has nothing else."""
    labels = ["[CLS]", "the", "cat", "it", "[SEP]"]
    w = np.full((1, 2, 5, 5), 0.0)
    w[0, 0, 3] = [0.6, 0.05, 0.25, 0.0, 0.1]  # [CLS] first, then "cat"
    w[0, 1, 3] = [0.1, 0.05, 0.05, 0.0, 0.8]  # [SEP] first
    token, head, number = text_questions(labels, w, layer=0, head=0, query=3)
    assert token.answer == 0  # the token question's answer is the model's, [CLS] included
    assert head.prompt == "Which head links “it” to “cat” most strongly?"
    assert head.choices[head.answer] == "L0 H0" and number.answer == 0.25  # "cat" gets 0.25 from H0, 0.05 from H1
    assert key_token(labels, w[0, 1, 3]) == 1  # "the" (0.05) wins a tie with "cat" (0.05) as the earlier token
    bos = ["<|im_start|>", "The", "cat", "<|im_end|>", "it"]
    assert key_token(bos, np.array([0.5, 0.3, 0.1, 0.05, 0.05])) == 1
    assert key_token(bos, np.array([0.5, 0.0, 0.0, 0.5, 0.0])) == 0  # nothing ordinary attended: the row's top
    assert key_token(["The", "cat"], np.array([1.0, 0.0])) == 0  # a causal query at the start: only the sink


def test_the_answer_pickers_fit_a_phone_and_a_patch_question_shows_its_picture():
    from PIL import Image

    heads = Question("head", "Which?", choices=[f"L{i} H{j}" for i in range(30) for j in range(9)], grid=(30, 9))
    spec = patch_answer_picker(heads)
    assert spec["width"]["step"] * 9 <= 300 and spec["height"]["step"] * 30 <= 600 and spec["title"] == "Click a head"
    assert spec["datasets"]["cells"].loc[12, ["row", "col", "label"]].tolist() == [1, 3, "L1 H3"]
    wide = Question("head", "Which?", choices=[f"L{i} H{j}" for i in range(12) for j in range(12)], grid=(12, 12))
    assert patch_answer_picker(wide)["width"] == {"step": 25}  # 300 px of cells and the axis on a 390-px phone
    photo = Image.new("RGB", (640, 480), (200, 30, 30))
    uri = question_picture(photo)
    assert uri.startswith("data:image/jpeg;base64,") and len(uri) < 20_000
    shown = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert shown.size == (192, 144)  # downscaled, its shape kept
    patch = vision_questions(np.eye(2, 3), layer=0, head=1, who="the class token", picture=uri)[0]
    layers = patch_answer_picker(patch)["layer"]
    assert layers[0]["mark"]["type"] == "image" and layers[0]["data"]["values"][0]["url"] == uri
    assert layers[0]["mark"]["width"] == 3 * 28 and layers[0]["mark"]["height"] == 2 * 28  # the grid's size
    assert layers[1]["params"][0]["name"] == "patch"  # the click gives the patch index, as before


def test_vote_shift_counts_who_moved_to_the_models_answer():
    q = Question("token", "Which?", choices=["a", "b", "c"], answer=1)
    first = {"ada": 0, "bob": 1, "cy": 2, "dee": 0}
    second = {"ada": 1, "bob": 0, "cy": 1, "eve": 1}
    assert vote_shift(q, first, second) == {"both": 3, "first_right": 1, "second_right": 3, "moved": 2, "left": 1}


def test_head_questions_answer_from_the_study_and_the_reveal_ablates_the_class_choice_exactly():
    """The /heads questions on a real (tiny, float64) language model: the head question's answer is the study's
    largest change; the output question's is the top output with the page's head removed; the lens question's is
    the first layer from which the answer stays first. The reveal's ablation of the class's head equals a
    single-head ablation computed here without the study or its probe: the model run under the intervention."""
    import torch

    from tests.core.test_interventions import tiny_llama
    from tformer_core.interventions import Head, ablate_heads
    from tformer_views import head_matters as hm

    model = tiny_llama().double()
    ids = [3, 7, 1, 12, 9, 4]
    study = hm.study("text", model, ids)
    effects = study.importance.effects["decoder"]
    chosen = hm.ablation(model, study.kind, study.inputs, study.output, Head("decoder", 1, 3))
    head, output, layer = head_questions(study, "decoder", chosen)
    assert head.kind == "head" and head.grid == (2, 4) and head.action == "ablate" and head.stack == "decoder"
    assert head.choices[head.answer] == "L{} H{}".format(*np.unravel_index(np.argmax(np.abs(effects)), (2, 4)))
    assert head.prompt == f"Which head, removed, changes {study.what} most?"
    assert output.kind == "output" and output.choices[:5] == [label for label, _ in study.prediction]
    assert output.choices[output.answer] == chosen.prediction[0][0]
    assert output.prompt.startswith("What will the model predict with decoder L1 H3 removed?")
    ranks = study.lens.rank
    assert layer.kind == "layer" and layer.choices == ["the embedding", "layer 0", "layer 1"]
    assert ranks[layer.answer:].max() == 0 and (layer.answer == 0 or ranks[layer.answer - 1] > 0)  # fmt: skip

    counts = [0] * 8
    counts[2], counts[5] = 3, 1  # the class chose L0 H2 most
    calls = []

    def ablate(layer: int, h: int):
        calls.append((layer, h))
        return hm.ablation(model, study.kind, study.inputs, study.output, Head("decoder", layer, h))

    effect = ablation_effect(head, counts, study.importance.clean, ablate)
    assert calls == [(0, 2), divmod(head.answer, 4)]  # one intervention for the class's choice, one for the model's
    with model.intervene(ablate_heads([Head("decoder", 0, 2)])), torch.no_grad():
        logits = model(torch.tensor([ids]))
    independent = float(torch.softmax(logits[0, -1], -1)[study.output])
    assert abs(effect["class"]["value"] - independent) < 1e-6
    assert effect["class"]["choice"] == 2 and effect["class"]["change"] == effect["class"]["value"] - effect["clean"]
    assert abs(effect["model"]["value"] - study.importance.scores["decoder"][divmod(head.answer, 4)]) < 1e-9
    assert effect["lines"][0].startswith("The class's choice, L0 H2 (3 of 4 votes), removed:")
    assert ablation_effect(head, [0] * 8, 0.5, ablate)["lines"][0].startswith("Nobody answered")
    # Beside the votes once revealed: the study's own grid, and the lens's rank of the answer after each layer.
    with_grid = Question(**{**head.__dict__, "effect": ablation_effect(head, counts, 0.5, ablate, effects)})
    cells = effect_chart(with_grid)["datasets"]
    values = next(iter(cells.values()))
    np.testing.assert_allclose(values.sort_values(["row", "col"])["value"], effects.ravel(), rtol=1e-5)
    assert effect_chart(layer)["datasets"]["ranks"]["rank"].tolist() == [int(r) + 1 for r in ranks]
    assert effect_chart(output) is None


def test_a_reveal_of_the_largest_offline_grid_fits_the_store():
    """SmolLM2's 30 x 9 heads, each drop to 6 significant digits, with the reveal's lines: within MAX_EFFECT (the
    store refuses a larger effect), so its reveal is never refused for its size."""
    import json

    from tformer_views.class_questions import MAX_EFFECT

    class Ablated:
        value, prediction = 0.123456789, [("␣Paris", 0.123456789)]

    grid = -np.random.default_rng(0).random((30, 9)) * 1e-3 - 1e-7  # the longest numbers: "-0.000123457"
    q = Question("head", "Which head, removed?", choices=[f"L{i} H{j}" for i in range(30) for j in range(9)],
                 answer=5, grid=(30, 9), action="ablate", stack="decoder")  # fmt: skip
    effect = ablation_effect(q, [1] * 270, 0.773, lambda layer, head: Ablated(), grid)
    assert len(effect["grid"]) == 30 and effect["grid"][0][0] == float(f"{grid[0, 0]:.6g}")
    assert len(json.dumps(effect)) < MAX_EFFECT
