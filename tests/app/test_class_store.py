"""The class session store: the same tests on the in-process backend and on a real redis-server.

Redis runs from Debian's binary on a free port in a temporary folder (deploy/redis_server.py); without it
those cases skip and say so. No Streamlit in the store: a test imports it in a fresh interpreter and checks.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
import time

import pytest

from deploy.redis_server import RedisServer, find_redis
from tformer_app.class_store import (
    ClassEnded,
    ClassError,
    ClassSettings,
    ClassStore,
    MemoryBackend,
    Question,
    RedisBackend,
    Seat,
    View,
    class_settings,
    histogram,
    open_store,
)

TOKENS = [
    "[CLS]",
    "the",
    "animal",
    "didn",
    "'",
    "t",
    "cross",
    "the",
    "street",
    "because",
    "it",
    "was",
    "tired",
    "[SEP]",
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_url():
    if find_redis() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server): Redis store not tested")
    with RedisServer() as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


def make(kind: str, request, **limits) -> tuple[ClassStore, Clock]:
    clock = Clock()
    settings = ClassSettings(redis_url=None, **limits)
    if kind == "memory":
        backend = MemoryBackend(clock=clock)
    else:
        url = request.getfixturevalue("redis_url")
        backend = RedisBackend(url)
        backend._redis.flushdb()
    return ClassStore(backend, settings, clock=clock), clock


@pytest.fixture
def store(kind, request):
    return make(kind, request)[0]


def seat(s: Seat) -> tuple[str, str]:
    return s.sid, s.student


def token_question(answer: int | None = 2) -> Question:
    return Question(kind="token", prompt="Which word does 'it' attend to most?", choices=TOKENS, answer=answer)


def test_a_lecturer_starts_a_session_and_students_join_by_its_code(store):
    lecture = store.create("Attention")
    assert len(lecture.code) == 6 and lecture.code.isalnum() and not set(lecture.code) & set("01OIL")
    sid, me = seat(store.join(lecture.code.lower()))  # typed in lower case: the same code
    sid2, other = seat(store.join(f" {lecture.code[:3]}-{lecture.code[3:]} ", name="Ada"))
    assert sid == sid2 == lecture.sid and me != other
    assert store.students(sid) == 2 and store.code(sid) == lecture.code
    with pytest.raises(ClassError, match="no class has this code"):
        store.join("ZZZZZZ")
    assert store.create().code != lecture.code  # two live sessions never share a code


def test_the_view_moves_with_a_version_only_the_lecturer_can_set(store):
    lecture = store.create()
    assert store.view(lecture.sid) is None and store.version(lecture.sid) == 0
    v1 = store.set_view(lecture.sid, lecture.secret, View("text", {"layer": "3", "head": "1"}))
    v2 = store.set_view(lecture.sid, lecture.secret, View("vision", {"model": "vit-tiny"}, slide=2))
    assert (v1, v2) == (1, 2) and store.version(lecture.sid) == 2
    assert store.view(lecture.sid) == View("vision", {"model": "vit-tiny"}, slide=2, version=2)
    sid, _ = seat(store.join(lecture.code))
    for wrong in ("", "guess", lecture.secret[:-1]):
        with pytest.raises(ClassError, match=r"^only the lecturer can do that$"):
            store.set_view(sid, wrong, View("text", {"q": "a student's sentence"}))
    assert store.view(sid).page == "vision" and store.version(sid) == 2  # a student cannot drive it


def test_a_question_of_each_kind_counts_answers_once_per_student(store):
    lecture = store.create()
    sid, secret = lecture.sid, lecture.secret
    students = [store.join(lecture.code).student for _ in range(5)]
    questions = {
        "token": (token_question(), ["2", "2", "10", "2", "1"], {"animal": 3, "it": 1, "the": 1}),
        "patch": (
            Question("patch", "Which patch does [CLS] attend to?", [f"{r},{c}" for r in range(2) for c in range(3)],
                     answer=4, grid=(2, 3)),
            ["4", "4", "0", "5", "4"], {"1,1": 3, "0,0": 1, "1,2": 1},
        ),
        "head": (
            Question("head", "Which head links it to animal?", [f"{l},{h}" for l in range(2) for h in range(2)],
                     answer=3, grid=(2, 2)),
            ["3", "3", "3", "3", "0"], {"1,1": 4, "0,0": 1},
        ),
        "number": (
            Question("number", "What is this softmax weight?", answer=0.42, lo=0.0, hi=1.0),
            ["0.42", "0.4", "0.05", "1", "0.99"], {"0.4–0.5": 2, "0–0.1": 1, "0.9–1": 2},
        ),
    }  # fmt: skip
    for kind, (question, raw, expected) in questions.items():
        qid = store.ask(sid, secret, question)
        for student, value in zip(students, raw):
            store.answer(sid, qid, student, value)
        with pytest.raises(ClassError, match="answered this question already"):
            store.answer(sid, qid, students[0], raw[1])  # not twice, not even a different answer
        counts = {label: n for label, n in store.histogram(sid, qid) if n}
        assert counts == expected, kind
        assert sum(n for _, n in store.histogram(sid, qid)) == len(students)
        assert store.current(sid).qid == qid and store.current(sid).kind == kind
    assert [q.kind for q in store.questions(sid)] == ["token", "patch", "head", "number"]


def test_answers_are_validated(store):
    lecture = store.create()
    sid, student = seat(store.join(lecture.code))
    token = store.ask(lecture.sid, lecture.secret, token_question())
    number = store.ask(lecture.sid, lecture.secret, Question("number", "A weight?", lo=0.0, hi=1.0))
    not_a_choice = "that is not one of the choices"
    not_finite, not_a_number = "an answer is a finite number", "an answer is a number"
    token_answers = {
        "14": not_a_choice,
        "-1": not_a_choice,
        "2.5": not_a_choice,
        "nan": not_finite,
        "two": not_a_number,
        "1e400": not_finite,  # read as inf
        "": not_a_number,
    }
    for bad, message in token_answers.items():
        with pytest.raises(ClassError, match=f"^{message}$"):
            store.answer(sid, token, student, bad)
    outside = "the answer must lie between 0 and 1"
    number_answers = {"1.01": outside, "-0.1": outside, "inf": not_finite, "nan": not_finite, "<b>1</b>": not_a_number}
    for bad, message in number_answers.items():
        with pytest.raises(ClassError, match=f"^{message}$"):
            store.answer(sid, number, student, bad)
    with pytest.raises(ClassError, match=r"^join the class first$"):
        store.answer(sid, token, "someone-who-never-joined", "2")
    assert store.answers(sid, token) == {} and store.answers(sid, number) == {}  # nothing bad was counted
    assert store.answer(sid, token, student, " 10 ") == 10


def test_questions_are_checked_when_asked(store):
    lecture = store.create()
    bad = [
        (
            Question("essay", "Why?", choices=["a"]),
            "a question is one of token, patch, head, number, output, layer, not 'essay'",
        ),
        (Question("token", "   ", choices=TOKENS), "a question needs a prompt of 1 to 300 characters"),
        (Question("token", "x" * 301, choices=TOKENS), "a question needs a prompt of 1 to 300 characters"),
        (Question("token", "Which?", choices=[]), "a token question needs 1 to 1024 choices"),
        (Question("token", "Which?", choices=TOKENS, answer=14), "the model's answer is not one of the choices"),
        (Question("number", "How much?", lo=1.0, hi=0.0), "a number question needs a range lo < hi"),
        (
            Question("number", "How much?", answer=2.0, lo=0.0, hi=1.0),
            "the model's number is outside the question's range",
        ),
    ]
    for question, message in bad:
        with pytest.raises(ClassError, match=f"^{re.escape(message)}$"):
            store.ask(lecture.sid, lecture.secret, question)
    assert store.questions(lecture.sid) == []


def test_reveal_closes_answers_and_asking_moves_the_version(store):
    lecture = store.create()
    sid, student = seat(store.join(lecture.code))
    before = store.version(sid)
    qid = store.ask(sid, lecture.secret, token_question())
    assert store.version(sid) > before and not store.current(sid).revealed
    with pytest.raises(ClassError, match=r"^only the lecturer can do that$"):
        store.reveal(sid, "not-the-secret", qid)
    at_ask = store.version(sid)
    store.reveal(sid, lecture.secret, qid)
    assert store.current(sid).revealed and store.version(sid) > at_ask
    with pytest.raises(ClassError, match=r"^this question is closed$"):
        store.answer(sid, qid, student, "2")


def test_export_has_questions_and_answers_and_names_only_when_asked(store):
    lecture = store.create()
    sid, ada = seat(store.join(lecture.code, name='=HYPERLINK("x") Ada'))
    _, anonymous = seat(store.join(lecture.code))
    qid = store.ask(sid, lecture.secret, token_question(answer=2))
    store.answer(sid, qid, ada, "2")
    store.answer(sid, qid, anonymous, "10")
    rows = list(csv.reader(io.StringIO(store.export_csv(sid, lecture.secret))))
    assert rows[0] == [
        "question", "kind", "prompt", "model_answer", "student", "answer", "correct", "answer_2", "correct_2"
    ]  # fmt: skip
    assert sorted(rows[1:]) == [
        ["1", "token", "Which word does 'it' attend to most?", "animal", "student 1", "animal", "yes", "", ""],
        ["1", "token", "Which word does 'it' attend to most?", "animal", "student 2", "it", "no", "", ""],
    ]
    named = list(csv.reader(io.StringIO(store.export_csv(sid, lecture.secret, names=True))))
    assert sorted(r[4] for r in named[1:]) == ['\'=HYPERLINK("x") Ada', "student 2"]  # no formula in a sheet
    with pytest.raises(ClassError, match=r"^only the lecturer can do that$"):
        store.export_csv(sid, "a student's guess")


def test_a_second_vote_is_kept_beside_the_first_once_per_student_and_exported(store):
    """Peer instruction: round 1, the class talks, *Vote again*: each student answers once per round, the rounds'
    answers are kept apart, the shift counts who moved to the model's answer, and the CSV has both votes."""
    lecture = store.create()
    sid, secret = lecture.sid, lecture.secret
    ada, bob, cy = (store.join(lecture.code).student for _ in range(3))
    qid = store.ask(sid, secret, token_question(answer=2))  # the model: "animal"
    for student, raw in ((ada, "10"), (bob, "2"), (cy, "10")):
        store.answer(sid, qid, student, raw)
    with pytest.raises(ClassError, match=r"^only the lecturer can do that$"):
        store.vote_again(sid, "a student's guess", qid)
    store.close(sid, secret, qid)
    store.vote_again(sid, secret, qid)
    q = store.question(sid, qid)
    assert (q.round, q.closed, q.revealed) == (2, False, False)
    assert store.answer_of(sid, qid, ada) is None and store.answer_of(sid, qid, ada, round=1) == 10
    for student, raw in ((ada, "2"), (bob, "10")):  # Ada moves to the model's answer, Bob away from it; Cy is away
        store.answer(sid, qid, student, raw)
    with pytest.raises(ClassError, match="already in this vote"):
        store.answer(sid, qid, ada, "1")
    assert store.answers(sid, qid, 1) == {ada: 10, bob: 2, cy: 10} and store.answers(sid, qid, 2) == {ada: 2, bob: 10}
    assert {k: n for k, n in store.histogram(sid, qid, 2) if n} == {"animal": 1, "it": 1}
    assert store.shift(sid, qid) == {"both": 2, "first_right": 1, "second_right": 1, "moved": 1, "left": 1}
    with pytest.raises(ClassError, match=r"^this question was voted on twice already$"):
        store.vote_again(sid, secret, qid)
    effect = {"lines": ["The class's choice removed"], "class": {"choice": 2, "value": 0.5}}
    store.reveal(sid, secret, qid, effect=effect)
    assert store.question(sid, qid).effect == effect and store.question(sid, qid).revealed
    with pytest.raises(ClassError, match="effect is at most"):
        store.reveal(sid, secret, qid, effect={"lines": ["x" * 13_000]})
    rows = {r[4]: r[5:] for r in csv.reader(io.StringIO(store.export_csv(sid, secret)))}
    assert rows["student 1"] == ["it", "no", "animal", "yes"]
    assert rows["student 2"] == ["animal", "yes", "it", "no"]
    assert rows["student 3"] == ["it", "no", "", ""]  # no second vote: empty cells, not a guess


def test_present_students_are_those_seen_lately(kind, request):
    """ "3 of 40 answered" stays true when students leave: a student is present while their page says so (every
    10 s, and with an answer); one who closed the page drops out after PRESENT_S, and nobody else gets a stamp."""
    from tformer_app.class_store import PRESENT_S

    store, clock = make(kind, request)
    lecture = store.create()
    ada, bob = (store.join(lecture.code).student for _ in range(2))
    assert store.present(lecture.sid) == set()
    store.here(lecture.sid, ada)
    qid = store.ask(lecture.sid, lecture.secret, token_question())
    store.answer(lecture.sid, qid, bob, "2")  # an answer says the page is there
    store.here(lecture.sid, "made-up-student")
    assert store.present(lecture.sid) == {ada, bob}
    clock.now += PRESENT_S - 1
    store.here(lecture.sid, ada)
    clock.now += 2  # Bob's page said nothing for PRESENT_S + 1 s: he left
    assert store.present(lecture.sid) == {ada}
    assert len(store.backend.hgetall(store._k(lecture.sid, "seen"))) == 2  # one stamp per student, no more
    store.left(lecture.sid, ada)  # "Leave the class": gone now, not PRESENT_S later
    assert store.present(lecture.sid) == set()


def test_codes_and_sessions_expire(kind, request):
    store, clock = make(kind, request, session_ttl_s=2, code_ttl_s=1)
    lecture = store.create()
    store.set_view(lecture.sid, lecture.secret, View("text", {}))
    wait = (lambda s: setattr(clock, "now", clock.now + s)) if kind == "memory" else None
    if kind == "memory":
        store.backend._clock = lambda: clock.now  # the backend's expiry on the same fake clock
    _pass(wait, 1.2, lambda: _gone(lambda: store.join(lecture.code)))
    assert store.alive(lecture.sid)  # the code expired first; the session is still there for its lecturer
    _pass(wait, 1.2, lambda: not store.alive(lecture.sid))
    assert store.view(lecture.sid) is None


def _gone(call) -> bool:
    try:
        call()
    except ClassError:
        return True
    return False


def _pass(wait, seconds: float, condition) -> None:
    """Fake time moves on (memory), or real time until the condition holds (Redis expires keys itself)."""
    if wait is not None:
        wait(seconds)
        assert condition()
        return
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "Redis did not expire the keys"
        time.sleep(0.1)  # polling interval of the condition above


def test_rate_limits_per_session(kind, request):
    store, clock = make(kind, request, answers_per_s=3, joins_per_min=4)
    lecture = store.create()
    students = [store.join(lecture.code).student for _ in range(4)]
    with pytest.raises(ClassError, match="too many requests"):
        store.join(lecture.code)
    qid = store.ask(lecture.sid, lecture.secret, token_question())
    for s in students[:3]:
        store.answer(lecture.sid, qid, s, "2")
    with pytest.raises(ClassError, match="too many requests"):
        store.answer(lecture.sid, qid, students[3], "2")
    clock.now += 1.0  # the next second: answers are taken again
    store.answer(lecture.sid, qid, students[3], "2")
    assert len(store.answers(lecture.sid, qid)) == 4


def test_ending_a_session_removes_everything(store):
    lecture = store.create()
    sid, student = seat(store.join(lecture.code))
    qid = store.ask(sid, lecture.secret, token_question())
    store.answer(sid, qid, student, "2")
    store.end(sid, lecture.secret)
    assert not store.alive(sid) and store.current(sid) is None and store.answers(sid, qid) == {}
    assert _gone(lambda: store.join(lecture.code))


def test_histogram_of_numbers_puts_edges_in_the_upper_bin():
    q = Question("number", "w?", lo=0.0, hi=1.0)
    counts = [n for _, n in histogram(q, [0.0, 0.1, 0.15, 0.999, 1.0], bins=10)]
    assert counts == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]


def test_settings_read_once_and_checked(caplog):
    assert class_settings({}).redis_url is None
    assert class_settings({"TFORMER_REDIS_URL": "redis://127.0.0.1:6390/0"}).redis_url == "redis://127.0.0.1:6390/0"
    assert class_settings({"TFORMER_REDIS_URL": "http://example.com"}).redis_url is None
    assert class_settings({"TFORMER_CLASS_HOURS": "2"}).session_ttl_s == 7200
    assert class_settings({"TFORMER_CLASS_HOURS": "-3"}).session_ttl_s == 6 * 3600
    assert "TFORMER_REDIS_URL" in caplog.text and "TFORMER_CLASS_HOURS" in caplog.text


def test_an_unreachable_redis_leaves_the_class_in_this_process(caplog):
    from deploy.redis_server import _free_port

    store = open_store(ClassSettings(redis_url=f"redis://127.0.0.1:{_free_port()}/0"))
    try:
        assert isinstance(store.backend, MemoryBackend)
        assert "cannot be reached" in caplog.text
        lecture = store.create()
        assert store.join(lecture.code).sid == lecture.sid
    finally:
        open_store(ClassSettings(redis_url=None))


@pytest.mark.slow
def test_the_store_does_not_import_streamlit():
    code = "import sys, tformer_app.class_store; print('streamlit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- guards: one student per browser, guesses throttled, every end said, Redis tried again (issue 34) -------------
def test_a_returning_student_is_the_same_student_and_a_forged_token_is_none(kind, request):
    """A browser that leaves, rejoins and answers again was one more student each time (27 answers in 60 s from one
    browser). Its token, signed by the session, makes it the same student: one roster entry, one answer."""
    store, _ = make(kind, request)
    lecture, other = store.create(), store.create()
    first = store.join(lecture.code, name="Ada")
    qid = store.ask(lecture.sid, lecture.secret, token_question())
    store.answer(lecture.sid, qid, first.student, "2")
    for _ in range(5):  # leave, join again with what the browser kept, answer again
        again = store.join(lecture.code, token=first.token)
        assert (again.sid, again.student, again.returning) == (lecture.sid, first.student, True)
        with pytest.raises(ClassError, match="answered this question already"):
            store.answer(lecture.sid, qid, again.student, "10")
    reloaded = store.rejoin(first.token)  # a reload: no code, the token alone
    assert reloaded.student == first.student and store.answer_of(lecture.sid, qid, reloaded.student) == 2
    assert store.students(lecture.sid) == 1 and store.answers(lecture.sid, qid) == {first.student: 2}

    sid, student, mac = first.token.split(".")
    forged = [f"{sid}.{student}.{'0' * 32}", f"{sid}.someone-else.{mac}", f"{sid}.{student}", "", "a.b.c"]
    for token in forged:
        assert store.join(lecture.code, token=token).student != first.student  # a new student, not Ada
        with pytest.raises(
            ClassError, match=r"^this browser's class token is not valid \(made up, or from another server\)$"
        ):
            store.rejoin(token)
    elsewhere = store.join(other.code, token=first.token)  # signed for another session: a new student there
    assert elsewhere.student != first.student and not elsewhere.returning
    with pytest.raises(ClassError, match=r"^join the class first$"):
        store.answer(other.sid, store.ask(other.sid, other.secret, token_question()), first.student, "2")
    assert store.students(lecture.sid) == 1 + len(forged) and store.students(other.sid) == 1


def test_new_students_and_answers_are_limited_per_address(kind, request):
    """A client without cookies (a script) is a new student at each join: its address may add `per_address`
    students a minute and send `per_address` answers in 10 s; another address, a returning student and the
    server's own machine are not held back by it."""
    store, clock = make(kind, request, per_address=3)
    lecture = store.create()
    seats = [store.join(lecture.code, client="10.0.0.7") for _ in range(3)]
    with pytest.raises(ClassError, match="too many students joined from your address"):
        store.join(lecture.code, client="10.0.0.7")
    assert store.join(lecture.code, client="10.0.0.7", token=seats[0].token).returning  # not a new one
    more = [store.join(lecture.code, client="10.0.0.8") for _ in range(3)]
    assert len({s.student for s in [*seats, *more]}) == 6 and store.students(lecture.sid) == 6
    for _ in range(10):
        store.join(lecture.code)  # this machine (tests, benchmarks): not counted per address
    qids = [store.ask(lecture.sid, lecture.secret, token_question()) for _ in range(2)]
    for qid in qids:
        for s in seats[: 3 if qid == qids[0] else 0]:
            store.answer(lecture.sid, qid, s.student, "2", client="10.0.0.7")
    with pytest.raises(ClassError, match="too many answers from your address"):
        store.answer(lecture.sid, qids[1], seats[0].student, "2", client="10.0.0.7")
    store.answer(lecture.sid, qids[1], more[0].student, "2", client="10.0.0.8")
    clock.now += 10
    store.answer(lecture.sid, qids[1], seats[0].student, "2", client="10.0.0.7")
    clock.now += 60
    store.join(lecture.code, client="10.0.0.7")  # the next minute: one more
    assert store.students(lecture.sid) == 17


def test_wrong_join_codes_are_throttled_per_address_and_in_all(kind, request, caplog):
    """Wrong join codes were never throttled (19.5 a second from 10 sessions, a log line each). An address has
    `code_guesses` wrong codes a minute, then even the right code is not checked until the minute is over; once
    every address together gave `code_guesses_overall`, each has one. One log line per address and minute."""
    store, clock = make(kind, request, code_guesses=3, code_guesses_overall=5)
    clock.now = 60_000.0  # the start of a minute
    lecture = store.create()
    caplog.set_level("INFO", logger="tformer_app")
    for _ in range(3):
        with pytest.raises(ClassError, match="no class has this code"):
            store.join("ZZZZZZ", client="10.0.0.7")
    for code in ("ZZZZZZ", lecture.code):  # locked out: not even the right code is looked at
        with pytest.raises(ClassError, match="too many wrong join codes from your address; try again in 60 s"):
            store.join(code, client="10.0.0.7")
    assert store.join(lecture.code, client="10.0.0.8").sid == lecture.sid  # another address: in
    assert store.join(lecture.code.lower(), client="10.0.0.8").sid == lecture.sid  # a right code costs nothing
    for _ in range(2):
        with pytest.raises(ClassError, match="no class has this code"):
            store.join("YYYYYY", client="10.0.0.8")  # five wrong codes in all: from now on, one per address
    with pytest.raises(ClassError, match="no class has this code"):
        store.join("XXXXXX", client="10.0.0.9")
    with pytest.raises(ClassError, match="too many wrong join codes"):
        store.join(lecture.code, client="10.0.0.9")
    assert "wrong join codes" not in caplog.text  # no line per try
    lines = sorted(store.codes.bursts.flush())
    assert lines == [
        "1 wrong join codes from 10.0.0.9 in the last 60 s; 1 more refused unchecked (too many)",
        "2 wrong join codes from 10.0.0.8 in the last 60 s",
        "3 wrong join codes from 10.0.0.7 in the last 60 s; 2 more refused unchecked (too many)",
    ]
    assert caplog.text.count("wrong join codes from") == 3
    clock.now += 45
    with pytest.raises(ClassError, match="try again in 15 s"):
        store.join(lecture.code, client="10.0.0.7")
    clock.now += 15  # the next minute
    assert store.join(lecture.code, client="10.0.0.7").sid == lecture.sid


def test_ten_sessions_of_one_address_guessing_at_once_get_its_guesses_only(kind, request):
    """Ten sessions of one address guessing in parallel: the tries are counted before the code is looked at, so
    exactly `code_guesses` codes are checked in the minute, however the threads interleave."""
    from concurrent.futures import ThreadPoolExecutor

    store, _ = make(kind, request, code_guesses=10)
    store.create()

    def guess(i: int) -> str:
        try:
            store.join(f"WRONG{i % 10}", client="10.0.0.7")
        except ClassError as error:
            return "checked" if "no class has this code" in str(error) else "refused"
        return "joined"

    with ThreadPoolExecutor(10) as pool:
        outcomes = list(pool.map(guess, range(100)))
    assert outcomes.count("checked") == 10 and outcomes.count("refused") == 90


def test_a_session_says_how_it_ended(kind, request):
    """A class that ended was never told to its students: the poll read 0 for a session that was gone. Now the
    poll is the version while the session lives, and ClassEnded once it is over: ended by its lecturer, expired,
    or lost (the store has nothing of it: Redis restarted empty)."""
    store, clock = make(kind, request, session_ttl_s=2, code_ttl_s=1)
    if kind == "memory":
        store.backend._clock = lambda: clock.now  # the backend's expiry on the same fake clock
    ended, expiring, lost = store.create(), store.create(), store.create()
    for lecture in (ended, expiring, lost):
        assert store.poll(lecture.sid) == 0
    assert store.set_view(ended.sid, ended.secret, View("text", {})) == store.poll(ended.sid) == 1
    store.end(ended.sid, ended.secret)
    with pytest.raises(ClassEnded, match="the lecturer ended") as error:
        store.poll(ended.sid)
    assert error.value.how == "ended"
    _pass(
        (lambda s: setattr(clock, "now", clock.now + s)) if kind == "memory" else None,
        2.5,
        lambda: not store.alive(expiring.sid),
    )
    with pytest.raises(
        ClassEnded, match=r"^this class session expired \(its lecturer made no change for TFORMER_CLASS_HOURS\)$"
    ) as error:
        store.poll(expiring.sid)
    assert error.value.how == "expired"
    with pytest.raises(
        ClassEnded, match=r"^this class session expired \(its lecturer made no change for TFORMER_CLASS_HOURS\)$"
    ):
        store.set_view(expiring.sid, expiring.secret, View("text", {}))  # the lecturer is told the same
    store.backend.delete([k for k in _keys(store) if lost.sid in k])  # all of it gone, as after a restart
    with pytest.raises(ClassEnded, match="no longer on the server") as error:
        store.poll(lost.sid)
    assert error.value.how == "lost"


def _keys(store: ClassStore) -> list[str]:
    backend = store.backend
    return list(backend._data) if isinstance(backend, MemoryBackend) else list(backend._redis.keys("*"))


def test_an_unreachable_redis_is_tried_again_until_it_answers(caplog):
    """Redis unreachable when the server started was never tried again: the class stayed in one replica (0 keys
    in Redis after it came up). It is tried again with back-off, and the store moves to it, saying so."""
    from deploy.redis_server import _free_port

    if find_redis() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    caplog.set_level("INFO", logger="tformer_app")
    port = _free_port()
    store = open_store(ClassSettings(redis_url=f"redis://:hunter2@127.0.0.1:{port}/0"))
    try:
        assert isinstance(store.backend, MemoryBackend)
        meanwhile = store.create()
        with RedisServer(port=port) as server:
            server_backend = RedisBackend(server.url)
            deadline = time.monotonic() + 60  # the tries after 1, 2, 4 ... s: one of the first ones finds it
            while not isinstance(store.backend, RedisBackend):
                assert time.monotonic() < deadline, "the store never moved to Redis"
                time.sleep(0.1)  # polling interval of the condition above
            assert "answers again" in caplog.text and "1 session(s) started in this process" in caplog.text
            assert "hunter2" not in caplog.text  # the password stays out of the log
            lecture = store.create()
            assert server_backend.get(f"tformer:class:{lecture.sid}:meta") is not None
            assert store.join(lecture.code).sid == lecture.sid
            with pytest.raises(ClassEnded, match="no longer on the server"):
                store.poll(meanwhile.sid)  # the session made in memory is said lost to its students
    finally:
        open_store(ClassSettings(redis_url=None))


def test_every_process_hears_each_move_of_a_session_once(kind, request):
    """The students' pages are woken by the moves (tformer_app.class_wake): a view, a question, a reveal and the
    end each reach every listener once, whichever process made them; with Redis, a listener of another process
    (another store on the same Redis) hears them too, and nothing else does: a wrong secret moves nothing."""
    here, _ = make(kind, request)
    heard: dict[str, list[str]] = {"here": [], "there": []}
    here.on_move(heard["here"].append)
    here.on_move(heard["here"].append)  # the same listener twice: still heard once
    stores = [here]
    if kind == "redis":
        there = ClassStore(RedisBackend(request.getfixturevalue("redis_url")), here.settings)
        there.on_move(heard["there"].append)
        stores.append(there)
        time.sleep(0.2)  # the listening threads subscribe (a message sent before that is missed by design)
    lecture = here.create()
    other = here.create()
    here.set_view(lecture.sid, lecture.secret, View("text", {"head": "3"}))
    with pytest.raises(ClassError, match=r"^only the lecturer can do that$"):
        here.set_view(lecture.sid, "not the secret", View("text", {"head": "4"}))
    qid = here.ask(lecture.sid, lecture.secret, token_question())
    here.reveal(lecture.sid, lecture.secret, qid)
    here.set_view(other.sid, other.secret, View("vision", {}))
    here.end(lecture.sid, lecture.secret)
    expected = [lecture.sid] * 3 + [other.sid, lecture.sid]
    deadline = time.monotonic() + 10
    names = ["here", "there"][: len(stores)]
    while any(len(heard[n]) < len(expected) for n in names) and time.monotonic() < deadline:
        time.sleep(0.01)
    for n in names:
        assert heard[n] == expected, n
