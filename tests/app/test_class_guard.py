"""A class session a whole class can share fairly (AppTest, the in-process store; Redis where a restart is the
point): a student is one per browser and cannot be multiplied by rejoining; wrong join codes and admin tokens
are throttled per address before they are checked, with one log line per burst; a slide never joins a class;
every end of a class (its lecturer's, its expiry, a store that lost it) is said on the students' pages.

Every session here comes from this machine (AppTest has no client address), so they all share one address: ten
AppTest sessions stand for ten tabs of one guesser. A browser's cookie is what `_browser_token` reads; AppTest
has none, so a reload is a new AppTest whose cookie is what the first one's page wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import app, ok
from tformer_app import admin, class_session
from tformer_app.class_store import ClassSettings, open_store

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TEXT = "app_pages/text_attention.py"
MINUTE = 60_000.0  # a fixed time at the start of a minute: the throttles' windows do not turn during a test
JOIN = "FormSubmitter:_tformer.class.join-Join the class"


@pytest.fixture
def store(monkeypatch):
    """A fresh in-process store (its counters and sessions this test's alone), on a clock that stays in one minute."""
    fresh = open_store(ClassSettings(redis_url=None))
    monkeypatch.setattr(fresh.codes, "_clock", lambda: MINUTE)
    yield fresh
    open_store(ClassSettings(redis_url=None))


def lecture(**params: str) -> tuple[AppTest, str, str]:
    """A lecturer on Text attention with a class session: (their app, the session id, its join code)."""
    lecturer = app(**params)
    lecturer.sidebar.button(key="_tformer.class.start").click().run()
    lecturer.switch_page(TEXT).run()
    ok(lecturer)
    sid = lecturer.session_state[class_session.SID]
    return lecturer, sid, open_store().code(sid)


def join_by_form(at: AppTest, code: str) -> AppTest:
    at.sidebar.text_input(key="_tformer.class.code").input(code)
    return ok(at.sidebar.button(key=JOIN).click().run())


def answer_pills(at: AppTest) -> list:
    return [b for b in at.get("button_group") if str(b.key).startswith("_tformer.class.answer.")]


def texts(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown]


def test_a_student_who_leaves_and_joins_again_is_the_same_student(store, monkeypatch):
    """One browser that left, rejoined and answered added 27 answers in 60 s and inflated the roster. Now the
    student keeps their signed token: a rejoin, five times over, and a reload (the cookie) are the same student,
    with the same answer shown, one on the roster and one answer counted."""
    lecturer, sid, code = lecture(layer="2")
    student = ok(app(**{"class": code}))
    me = student.session_state[class_session.STUDENT]
    offered = lecturer.session_state[class_session.OFFER]
    lecturer.button(key=f"_tformer.class.ask.{[q.kind for q in offered].index('token')}").click().run()
    q = store.current(sid)
    ok(student.run())
    answer_pills(student)[0].set_value(q.choices.index("animal")).run()
    for _ in range(5):
        assert "Your answer: **animal**" in texts(ok(student))
        student.sidebar.button(key="_tformer.class.leave").click().run()
        assert class_session.STUDENT not in student.session_state
        join_by_form(student, code)
        assert student.session_state[class_session.STUDENT] == me
        assert not answer_pills(student)  # answered already: nothing to click again
    assert store.students(sid) == 1 and store.answers(sid, q.qid) == {me: 2}

    cookie = student.session_state[class_session.COOKIE_VALUE]
    assert cookie.startswith(f"{sid}.{me}.")  # what the page's element writes into the browser's cookie
    monkeypatch.setattr(class_session, "_browser_token", lambda: cookie)
    reloaded = ok(app())  # a reload: a new session of the same browser, at the address it had
    assert reloaded.session_state[class_session.STUDENT] == me and reloaded.session_state[class_session.FOLLOWING]
    ok(reloaded.run())
    assert "Your answer: **animal**" in texts(reloaded) and store.students(sid) == 1

    student.sidebar.button(key="_tformer.class.leave").click().run()
    away = student.session_state[class_session.COOKIE_VALUE]
    assert away == cookie + class_session.AWAY
    monkeypatch.setattr(class_session, "_browser_token", lambda: away)
    assert class_session.SID not in ok(app()).session_state  # left: a reload does not take them back in

    monkeypatch.setattr(class_session, "_browser_token", lambda: cookie[:-1] + ("0" if cookie[-1] != "0" else "1"))
    forged = ok(app())
    assert class_session.SID not in forged.session_state and store.students(sid) == 1  # a forged token: no one


def test_wrong_join_codes_from_ten_sessions_are_throttled(store, caplog):
    """Ten sessions of one address guessed 19.5 codes a second, each a log line. Now the address has ten wrong
    codes a minute, whatever number of sessions it opens; then not even the right code is checked until the
    minute is over. The log has one line for the burst."""
    _, sid, code = lecture()
    caplog.set_level("INFO", logger="tformer_app")
    said = []
    for i in range(10):
        session = ok(app())
        for guess in ("NOPE99", "NOPE98"):
            join_by_form(session, f"{guess}{i}")
            said += [w.value for w in session.sidebar.warning]
    assert sum("no class has this code" in s for s in said) == 10
    assert sum("too many wrong join codes from your address; try again in 60 s" in s for s in said) == 10
    late = join_by_form(ok(app()), code)  # the right code, from the same address, within the minute
    assert class_session.SID not in late.session_state and store.students(sid) == 0
    assert "wrong join code" not in caplog.text  # no line per try
    assert store.codes.bursts.flush() == [
        "10 wrong join codes from this machine in the last 60 s; 11 more refused unchecked (too many)"
    ]


def test_wrong_admin_tokens_from_ten_sessions_are_throttled(store, monkeypatch, caplog):
    """A wrong admin token "cost a second" by sleeping in its own session: ten sessions made ten tries a second
    (16 measured). Now an address has three wrong tokens a minute, counted before the check, and no thread sleeps;
    then even the right token is not checked until the minute is over. One log line for the burst."""
    token = "a-token-of-twenty-four-c"
    monkeypatch.setenv("TFORMER_ADMIN", "1")
    monkeypatch.setenv("TFORMER_ADMIN_TOKEN", token)
    monkeypatch.setattr(admin.GUESSES, "_clock", lambda: MINUTE)
    admin.GUESSES.bursts.flush()  # what earlier tests' wrong tokens left to say (tests/app/test_caches.py has one)
    caplog.clear()
    caplog.set_level("INFO", logger="tformer_app")
    server_page = str(ROOT / "app_pages" / "server.py")
    said = []
    for i in range(10):
        session = AppTest.from_file(server_page, default_timeout=60).run()
        session.text_input(key=admin.TYPED).input(f"a-wrong-guess-number-{i:03d}").run()
        said += [e.value for e in ok(session).error]
        if i == 0:
            ok(session.run())  # the page again with the same wrong token: no new guess
            said += [e.value for e in session.error]
    assert said[:4] == ["That is not the token."] * 4
    assert said[4:] == ["Too many wrong tokens from your address: try again in 60 s."] * 7
    right = AppTest.from_file(server_page, default_timeout=60).run()
    right.text_input(key=admin.TYPED).input(token).run()
    assert not ok(right).dataframe and admin.GRANTED not in right.session_state
    assert [e.value for e in right.error] == ["Too many wrong tokens from your address: try again in 60 s."]
    assert "wrong admin token" not in caplog.text
    assert admin.GUESSES.bursts.flush() == [
        "3 wrong admin tokens from this machine in the last 60 s; 8 more refused unchecked (too many)"
    ]
    monkeypatch.setattr(admin.GUESSES, "_clock", lambda: MINUTE + 60)  # the next minute: the right token opens it
    assert ok(right.run()).dataframe and right.session_state[admin.GRANTED]


def test_a_slide_link_never_joins_a_class(store):
    """A deck's slide is a page link; one that carried ?class=<a live code> made the presenter join that class and
    follow its lecturer. Presenting it opens the slide's view, and no class."""
    _, sid, code = lecture()
    presenter_app = ok(app())
    presenter_app.session_state["_tformer.deck"] = [{"page": "text", "title": "Text", "query": f"layer=2&class={code}"}]
    ok(presenter_app.run())
    presenter_app.sidebar.button(key="_tformer.deck.start").click().run()
    ok(presenter_app)
    assert presenter_app.session_state["text.layer"] == 2  # the slide opened
    assert class_session.SID not in presenter_app.session_state and store.students(sid) == 0
    assert "class" not in presenter_app.query_params


def ended_notice(at: AppTest) -> list[str]:
    return [w.value for w in at.main.warning if "class session" in w.value]


def sidebar_texts(at: AppTest) -> list[str]:
    return [m.value for m in at.sidebar.markdown]


def test_a_student_is_told_when_the_lecturer_ends_the_class(store):
    """After *End the session* students still read "Following the lecturer". Now their page says it ended and what
    to do next, and offers to join another class; OK puts the notice away."""
    lecturer, _, code = lecture()
    student = ok(app(**{"class": code}))
    assert "**Following the lecturer**" in sidebar_texts(student)
    lecturer.sidebar.button(key="_tformer.class.end").click().run()
    ok(student.run())
    assert ended_notice(student) == [class_session.NOTICES["ended"]]
    assert class_session.NOTICES["ended"] == (
        "The lecturer ended the class session. Your page stays as it is; explore on your own or join another class."
    )
    assert "**Following the lecturer**" not in sidebar_texts(student) and class_session.SID not in student.session_state
    assert student.sidebar.button(key=JOIN)  # join another class from here
    assert student.session_state[class_session.COOKIE_VALUE] == ""  # the browser forgets the token
    student.button(key="_tformer.class.ended.ok").click().run()
    assert not ended_notice(ok(student))


def test_a_student_is_told_when_the_class_expires(store):
    """TFORMER_CLASS_HOURS after the lecturer's last change the session's keys expire: its students are told."""
    _, _, code = lecture()
    student = ok(app(**{"class": code}))
    now = store.backend._clock()
    store.backend._clock = lambda: now + store.settings.session_ttl_s + 1
    ok(student.run())
    assert ended_notice(student) == [class_session.NOTICES["expired"]]
    assert "**Following the lecturer**" not in sidebar_texts(student)


def test_a_student_is_told_when_redis_restarts_empty(redis_server):
    """Redis restarted empty took every session with it, and students still read "Following the lecturer". Now
    the poll finds nothing of their session and their page says it is lost; the lecturer is told too."""
    open_store(ClassSettings(redis_url=redis_server.url))
    lecturer, _, code = lecture()
    student = ok(app(**{"class": code}))
    assert "**Following the lecturer**" in sidebar_texts(student)
    redis_server.stop()
    redis_server.start()  # the same port, nothing in it
    ok(student.run())
    assert ended_notice(student) == [class_session.NOTICES["lost"]]
    assert "**Following the lecturer**" not in sidebar_texts(student)
    ok(lecturer.run())
    assert class_session.SID not in lecturer.session_state
    assert any("no longer on the server" in w.value for w in lecturer.sidebar.warning)
