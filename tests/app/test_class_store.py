"""The class session store: the same tests on the in-process backend and on a real redis-server.

Redis runs from Debian's binary on a free port in a temporary folder (deploy/redis_server.py); without it
those cases skip and say so. No Streamlit in the store: a test imports it in a fresh interpreter and checks.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time

import pytest

from deploy.redis_server import RedisServer, find_redis
from tformer_app.class_store import (
    ClassError,
    ClassSettings,
    ClassStore,
    MemoryBackend,
    Question,
    RedisBackend,
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


def token_question(answer: int | None = 2) -> Question:
    return Question(kind="token", prompt="Which word does 'it' attend to most?", choices=TOKENS, answer=answer)


def test_a_lecturer_starts_a_session_and_students_join_by_its_code(store):
    lecture = store.create("Attention")
    assert len(lecture.code) == 6 and lecture.code.isalnum() and not set(lecture.code) & set("01OIL")
    sid, me = store.join(lecture.code.lower())  # typed in lower case: the same code
    sid2, other = store.join(f" {lecture.code[:3]}-{lecture.code[3:]} ", name="Ada")
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
    sid, _ = store.join(lecture.code)
    for wrong in ("", "guess", lecture.secret[:-1]):
        with pytest.raises(ClassError, match="only the lecturer"):
            store.set_view(sid, wrong, View("text", {"q": "a student's sentence"}))
    assert store.view(sid).page == "vision" and store.version(sid) == 2  # a student cannot drive it


def test_a_question_of_each_kind_counts_answers_once_per_student(store):
    lecture = store.create()
    sid, secret = lecture.sid, lecture.secret
    students = [store.join(lecture.code)[1] for _ in range(5)]
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
    sid, student = store.join(lecture.code)
    token = store.ask(lecture.sid, lecture.secret, token_question())
    number = store.ask(lecture.sid, lecture.secret, Question("number", "A weight?", lo=0.0, hi=1.0))
    for bad in ("14", "-1", "2.5", "nan", "two", "1e400", ""):
        with pytest.raises(ClassError):
            store.answer(sid, token, student, bad)
    for bad in ("1.01", "-0.1", "inf", "nan", "<b>1</b>"):
        with pytest.raises(ClassError):
            store.answer(sid, number, student, bad)
    with pytest.raises(ClassError, match="join the class first"):
        store.answer(sid, token, "someone-who-never-joined", "2")
    assert store.answers(sid, token) == {} and store.answers(sid, number) == {}  # nothing bad was counted
    assert store.answer(sid, token, student, " 10 ") == 10


def test_questions_are_checked_when_asked(store):
    lecture = store.create()
    bad = [
        Question("essay", "Why?", choices=["a"]),
        Question("token", "   ", choices=TOKENS),
        Question("token", "x" * 301, choices=TOKENS),
        Question("token", "Which?", choices=[]),
        Question("token", "Which?", choices=TOKENS, answer=14),
        Question("number", "How much?", lo=1.0, hi=0.0),
        Question("number", "How much?", answer=2.0, lo=0.0, hi=1.0),
    ]
    for question in bad:
        with pytest.raises(ClassError):
            store.ask(lecture.sid, lecture.secret, question)
    assert store.questions(lecture.sid) == []


def test_reveal_closes_answers_and_asking_moves_the_version(store):
    lecture = store.create()
    sid, student = store.join(lecture.code)
    before = store.version(sid)
    qid = store.ask(sid, lecture.secret, token_question())
    assert store.version(sid) > before and not store.current(sid).revealed
    with pytest.raises(ClassError, match="only the lecturer"):
        store.reveal(sid, "not-the-secret", qid)
    at_ask = store.version(sid)
    store.reveal(sid, lecture.secret, qid)
    assert store.current(sid).revealed and store.version(sid) > at_ask
    with pytest.raises(ClassError, match="closed"):
        store.answer(sid, qid, student, "2")


def test_export_has_questions_and_answers_and_names_only_when_asked(store):
    lecture = store.create()
    sid, ada = store.join(lecture.code, name='=HYPERLINK("x") Ada')
    _, anonymous = store.join(lecture.code)
    qid = store.ask(sid, lecture.secret, token_question(answer=2))
    store.answer(sid, qid, ada, "2")
    store.answer(sid, qid, anonymous, "10")
    rows = list(csv.reader(io.StringIO(store.export_csv(sid, lecture.secret))))
    assert rows[0] == ["question", "kind", "prompt", "model_answer", "student", "answer", "correct"]
    assert sorted(rows[1:]) == [
        ["1", "token", "Which word does 'it' attend to most?", "animal", "student 1", "animal", "yes"],
        ["1", "token", "Which word does 'it' attend to most?", "animal", "student 2", "it", "no"],
    ]
    named = list(csv.reader(io.StringIO(store.export_csv(sid, lecture.secret, names=True))))
    assert sorted(r[4] for r in named[1:]) == ['\'=HYPERLINK("x") Ada', "student 2"]  # no formula in a sheet
    with pytest.raises(ClassError, match="only the lecturer"):
        store.export_csv(sid, "a student's guess")


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
    students = [store.join(lecture.code)[1] for _ in range(4)]
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
    sid, student = store.join(lecture.code)
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
        assert store.join(lecture.code)[0] == lecture.sid
    finally:
        open_store(ClassSettings(redis_url=None))


def test_the_store_does_not_import_streamlit():
    code = "import sys, tformer_app.class_store; print('streamlit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
