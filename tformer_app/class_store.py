"""A class session's shared state: the lecturer's view, the questions and the class's answers (no Streamlit here).

    store = open_store()                                 # Redis when TFORMER_REDIS_URL is set, else this process
    lecture = store.create()                             # lecture.code "K7M2QX", lecture.secret (the lecturer's)
    seat = store.join("k7m2qx", client="10.0.0.7")       # a student: seat.sid, seat.student, seat.token
    store.rejoin(seat.token)                             # the same student (a reload): the token is signed
    store.set_view(sid, secret, View("text", {"layer": "3", "head": "1"}))   # version 1
    store.poll(sid)                                      # what every student's page polls (woken by each move):
                                                         # the version, or ClassEnded (ended, expired, lost)
    q = store.ask(sid, secret, Question(kind="token", prompt="...", choices=[...], answer=10))
    store.answer(sid, q, student, "10")                  # once per student per question, validated
    store.histogram(sid, q), store.reveal(sid, secret, q), store.export_csv(sid, secret)
    store.vote_again(sid, secret, q)                     # peer instruction: a second vote, kept beside the first
    store.here(sid, student), store.present(sid)         # who is in the room now (the projector's live count)

Every session and replica of the server sees the same state when it lives in Redis (several replicas behind
nginx); one process alone may keep it in memory (`MemoryBackend`, the default). Both backends offer the same
few primitives (`Backend`), and `ClassStore` builds everything on them once, so the two are tested alike.
Keys expire: a session after `session_ttl_s` without the lecturer's activity, its join code after `code_ttl_s`.

A student is who holds a token the store signed for that session (`Seat.token`, an HMAC with the session's own
key): the browser keeps it (a cookie), so a reload or a second join is the same student, with the same answers,
not one more on the roster; a token made up, or signed for another session, is no student. Guessing is limited:
wrong join codes per client address and in all (tformer_app.throttle), new students and answers per address and
per session. A session that ends says how (`ClassEnded`: ended by its lecturer, expired, or lost with the store),
for the students' pages to tell them.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from tformer_views.class_questions import (
    MAX_EFFECT,
    ClassError,
    Question,
    check_question,
    histogram,
    parse_answer,
    vote_shift,
)

from . import settings
from .throttle import Guesses, Locked

log = logging.getLogger("tformer_app")

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read off a projector at the back of a room
CODE_LENGTH = 6
PREFIX = "tformer:class:"
MAX_NAME = 40  # characters of a student's chosen name
MAX_QUESTIONS = 200  # per session
MAX_PARAMS = 6000  # characters of a view's query parameters (a link's limit, tformer_app.url.MAX_LINK)
ENDED_KEPT_S = 24 * 3600  # how long a session that ended is remembered as ended (for its students' pages)
SID_FORM = re.compile(r"[A-Za-z0-9_-]{16}")  # secrets.token_urlsafe(12), as `create` makes them
RETRY_S = (1, 2, 4, 8, 16, 32, 60)  # waits between tries of an unreachable Redis (then every 60 s)
PRESENT_S = 30  # a student is present while their page said so within this long (`here`: every 10 s)
MOVED = PREFIX + "moved"  # the channel that carries a session's id each time it moved (its version changed)


__all__ = [
    "ClassEnded",
    "ClassError",
    "ClassStore",
    "Question",
    "Seat",
    "View",
    "check_question",
    "histogram",
    "parse_answer",
]


# ---- settings: the one place TFORMER_REDIS_URL and the class's limits are read ---------------------------------
@dataclass(frozen=True)
class ClassSettings:
    redis_url: str | None  # None: the in-process store (one server process)
    session_ttl_s: int = 6 * 3600  # a session lives this long after the lecturer's last change
    code_ttl_s: int = 3 * 3600  # a join code admits students this long after it was made (or renewed)
    answers_per_s: int = 200  # per session: a class of 100 answering in the same second, twice over
    joins_per_min: int = 300  # per session
    # Per client address (TFORMER_CLASS_PER_ADDRESS): new students a minute, and answers every 10 s. An address is
    # a laptop, or a whole room behind one NAT (a lecture hall of 100 reaching a server outside the campus: all of
    # them join and answer within the same minute); the server's own machine (tests, benchmarks) is not limited.
    per_address: int = 150
    code_guesses: int = 10  # wrong join codes a minute per address,
    code_guesses_overall: int = 30  # and from every address together (then one each: tformer_app.throttle)


def class_settings(environ: Mapping[str, str] | None = None) -> ClassSettings:
    """TFORMER_REDIS_URL and TFORMER_CLASS_HOURS, read and checked by tformer_core.settings (a bad value is logged
    once and the default used); `environ` stands for the process's environment (tests)."""
    url, hours = settings.value("TFORMER_REDIS_URL", environ), settings.value("TFORMER_CLASS_HOURS", environ)
    ttl = int(hours * 3600)
    per_address = settings.value("TFORMER_CLASS_PER_ADDRESS", environ)
    return ClassSettings(redis_url=url, session_ttl_s=ttl, code_ttl_s=min(ttl, 3 * 3600), per_address=per_address)


# ---- the primitives a backend offers --------------------------------------------------------------------------
class Backend(Protocol):
    """What `ClassStore` needs of a store: Redis's semantics (strings, hashes, counters, expiry)."""

    def get(self, key: str) -> str | None: ...
    def set(self, key: str, value: str, ttl_s: int, only_new: bool = False) -> bool: ...
    def incr(self, key: str, ttl_s: int) -> int: ...
    def hset(self, key: str, field: str, value: str, ttl_s: int, only_new: bool = False) -> bool: ...
    def hget(self, key: str, field: str) -> str | None: ...
    def hgetall(self, key: str) -> dict[str, str]: ...
    def expire(self, keys: Sequence[str], ttl_s: int) -> None: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def publish(self, channel: str, message: str) -> bool:
        """Send `message` to every process listening on `channel`; False: this backend has no other processes
        (the store delivers it itself)."""
        ...


class MemoryBackend:
    """The backend in this process's memory (one server process: the embedded default). Thread-safe: every
    Streamlit session runs in a thread of its own. Expired keys are dropped when read, and swept now and then."""

    def __init__(self, clock=time.monotonic) -> None:
        self._data: dict[str, Any] = {}
        self._expires: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._writes = 0

    def _live(self, key: str) -> Any:
        deadline = self._expires.get(key)
        if deadline is not None and self._clock() >= deadline:
            self._data.pop(key, None)
            self._expires.pop(key, None)
        return self._data.get(key)

    def _touch(self, key: str, ttl_s: int) -> None:
        self._expires[key] = self._clock() + ttl_s
        self._writes += 1
        if self._writes % 1000 == 0:  # a sweep: sessions nobody reads again must not stay in memory
            now = self._clock()
            for k in [k for k, t in self._expires.items() if t <= now]:
                self._data.pop(k, None)
                self._expires.pop(k, None)

    def get(self, key: str) -> str | None:
        with self._lock:
            value = self._live(key)
            return value if isinstance(value, str) else None

    def set(self, key: str, value: str, ttl_s: int, only_new: bool = False) -> bool:
        with self._lock:
            if only_new and self._live(key) is not None:
                return False
            self._data[key] = value
            self._touch(key, ttl_s)
            return True

    def incr(self, key: str, ttl_s: int) -> int:
        """Add one; a new counter expires after ttl_s (as INCR then EXPIRE NX)."""
        with self._lock:
            value = int(self._live(key) or 0) + 1
            new = key not in self._data
            self._data[key] = str(value)
            if new:
                self._touch(key, ttl_s)
            return value

    def hset(self, key: str, field: str, value: str, ttl_s: int, only_new: bool = False) -> bool:
        with self._lock:
            table = self._live(key)
            if table is None:
                table = self._data[key] = {}
            if only_new and field in table:
                return False
            table[field] = value
            self._touch(key, ttl_s)
            return True

    def hget(self, key: str, field: str) -> str | None:
        with self._lock:
            table = self._live(key)
            return table.get(field) if isinstance(table, dict) else None

    def hgetall(self, key: str) -> dict[str, str]:
        with self._lock:
            table = self._live(key)
            return dict(table) if isinstance(table, dict) else {}

    def expire(self, keys: Sequence[str], ttl_s: int) -> None:
        with self._lock:
            for key in keys:
                if self._live(key) is not None:
                    self._expires[key] = self._clock() + ttl_s

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._data.pop(key, None)
                self._expires.pop(key, None)

    def publish(self, channel: str, message: str) -> bool:
        return False  # one process: the store tells its own listeners


class RedisBackend:
    """The backend in Redis (several replicas of the server share it). One connection pool per process."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        import redis  # only where Redis is configured

        self._redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self.url = url

    def ping(self) -> None:
        self._redis.ping()

    def get(self, key: str) -> str | None:
        return _text(self._redis.get(key))

    def set(self, key: str, value: str, ttl_s: int, only_new: bool = False) -> bool:
        return bool(self._redis.set(key, value, ex=ttl_s, nx=only_new))

    def incr(self, key: str, ttl_s: int) -> int:
        pipe = self._redis.pipeline()
        pipe.incr(key)
        pipe.expire(key, ttl_s, nx=True)
        return int(pipe.execute()[0])

    def hset(self, key: str, field: str, value: str, ttl_s: int, only_new: bool = False) -> bool:
        pipe = self._redis.pipeline()
        if only_new:
            pipe.hsetnx(key, field, value)
        else:
            pipe.hset(key, field, value)
        pipe.expire(key, ttl_s)
        added = pipe.execute()[0]
        return bool(added) if only_new else True

    def hget(self, key: str, field: str) -> str | None:
        return _text(self._redis.hget(key, field))

    def hgetall(self, key: str) -> dict[str, str]:
        return {str(_text(k)): str(_text(v)) for k, v in self._redis.hgetall(key).items()}

    def expire(self, keys: Sequence[str], ttl_s: int) -> None:
        pipe = self._redis.pipeline()
        for key in keys:
            pipe.expire(key, ttl_s)
        pipe.execute()

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            self._redis.delete(*keys)

    def publish(self, channel: str, message: str) -> bool:
        self._redis.publish(channel, message)
        return True

    def listen(self, channel: str, deliver: Callable[[str], object], stop: threading.Event) -> None:
        """Call deliver(message) for every message on `channel`, in a thread of its own, until `stop` is set. A
        connection that fails is opened again (after 1, 2, 4 ... 30 s); meanwhile the students' pages follow by
        their poll. Its own connection: a subscribed connection can do nothing else, and waits without timeout."""
        import redis

        def run() -> None:
            failures = 0
            while not stop.is_set():
                try:
                    client = redis.Redis.from_url(
                        self.url, decode_responses=True, socket_connect_timeout=2.0, health_check_interval=30
                    )
                    pubsub = client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(channel)
                    if failures:
                        log.warning("class sessions: Redis's messages are heard again (%s)", shown_url(self.url))
                    failures = 0
                    while not stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message is not None and message.get("type") == "message":
                            deliver(str(message["data"]))
                    pubsub.close()
                    client.close()
                except Exception as error:
                    failures += 1
                    if failures == 1:
                        log.warning("class sessions: Redis's messages cannot be heard (%s); students' pages follow "
                                    "by their poll until they can", error)  # fmt: skip
                    stop.wait(min(30.0, 2.0 ** (failures - 1)))

        threading.Thread(target=run, name="tformer-class-moves", daemon=True).start()


# ---- what a class session holds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lecture:
    """A new session, as its lecturer gets it: the id, the code students type, and the lecturer's secret."""

    sid: str
    code: str
    secret: str


@dataclass(frozen=True)
class View:
    """The lecturer's view: a page (its url path), its query parameters, and the deck's slide (or None)."""

    page: str
    params: dict[str, str]
    slide: int | None = None
    version: int = 0


@dataclass(frozen=True)
class Seat:
    """A student in a session: the session, the student's id, and the token their browser keeps (signed by the
    session: `ClassStore.rejoin` takes it back). `returning`: the student had joined before (no new one counted)."""

    sid: str
    student: str
    token: str
    returning: bool = False


Ending = Literal["ended", "expired", "lost"]
ENDINGS: dict[str, str] = {
    "ended": "the lecturer ended this class session",
    "expired": "this class session expired (its lecturer made no change for TFORMER_CLASS_HOURS)",
    "lost": "this class session is no longer on the server (its store was restarted or replaced)",
}


class ClassEnded(ClassError):
    """The session is over: `how` is "ended" (by its lecturer), "expired" (TFORMER_CLASS_HOURS after the lecturer's
    last change) or "lost" (the store no longer has it: Redis restarted empty, or the server changed stores)."""

    def __init__(self, how: Ending) -> None:
        super().__init__(ENDINGS[how])
        self.how: Ending = how


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def normal_code(code: str) -> str:
    """A typed code as stored: upper case, without the spaces or dashes a student may type."""
    return "".join(str(code).split()).replace("-", "").upper()[:16]


class ClassStore:
    """Class sessions on a backend (memory or Redis); every method is one or a few round trips."""

    def __init__(self, backend: Backend, settings: ClassSettings | None = None, clock=time.time) -> None:
        self.backend = backend  # replaced by Redis when it comes back (`open_store`)
        self.settings = settings or ClassSettings(redis_url=None)
        self._clock = clock
        self._listeners: list[Callable[[str], object]] = []  # on_move
        self._heard: Backend | None = None  # the backend whose moves reach the listeners
        self._stop_hearing = threading.Event()
        self._listeners_lock = threading.Lock()
        self.codes = Guesses(
            "wrong join codes",
            per_client=self.settings.code_guesses,
            overall=self.settings.code_guesses_overall,
            window_s=60,
            counters=lambda: self.backend,
            fallback=MemoryBackend(),
            clock=clock,
        )

    # moves: every process's listeners hear when a session moved
    def on_move(self, listener: Callable[[str], object]) -> None:
        """listener(sid) from now on, in every process (Redis's pub/sub), each time session `sid` moves: a view, a
        question, a reveal, its end. Called once more with the same listener, nothing changes."""
        with self._listeners_lock:
            if listener not in self._listeners:
                self._listeners.append(listener)
        self._hear()

    def _hear(self) -> None:
        """The backend's moves reach the listeners: Redis's by a thread that listens (started again for a new
        backend: Redis came back); the memory's directly (`_moved`)."""
        backend = self.backend
        if self._heard is backend or not self._listeners:
            return
        with self._listeners_lock:
            if self._heard is backend:
                return
            self._stop_hearing.set()
            self._stop_hearing = threading.Event()
            listen = getattr(backend, "listen", None)
            if listen is not None:
                listen(MOVED, self._deliver, self._stop_hearing)
            self._heard = backend

    def _moved(self, sid: str) -> None:
        self._hear()
        try:
            if self.backend.publish(MOVED, sid):
                return
        except Exception as error:  # the students' polls still find the move
            log.warning("class %s: its move could not be sent to the other replicas (%s)", sid, error)
        self._deliver(sid)

    def _deliver(self, sid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(sid)
            except Exception:  # a listener's failure must not fail the lecturer's change
                log.exception("class %s: a listener of its moves failed", sid)

    # keys
    def _k(self, sid: str, part: str) -> str:
        return f"{PREFIX}{sid}:{part}"

    def _keys(self, sid: str, questions: int = 0) -> list[str]:
        fixed = ["meta", "view", "version", "questions", "qcount", "current", "students", "seen"]
        answers = [self._answers_key(sid, i, r) for i in range(1, questions + 1) for r in (1, 2)]
        return [self._k(sid, p) for p in fixed] + answers

    def _answers_key(self, sid: str, qid: int, round: int) -> str:
        """A question's answers in one vote: round 1 where answers always were, round 2 (*Vote again*) beside."""
        return self._k(sid, f"answers:{qid}" if round == 1 else f"answers:{qid}:{round}")

    def _meta(self, sid: str) -> dict[str, Any]:
        raw = self.backend.get(self._k(sid, "meta"))
        if raw is None:
            raise self._gone(sid)
        return json.loads(raw)

    def _gone(self, sid: str) -> ClassEnded:
        """How a session the store does not have ended: its lecturer's end and its expiry leave a mark for a while
        (ENDED_KEPT_S); a store that lost everything (Redis restarted empty) has neither."""
        if self.backend.get(self._k(sid, "ended")) is not None:
            return ClassEnded("ended")
        if self.backend.get(self._k(sid, "existed")) is not None:
            return ClassEnded("expired")
        return ClassEnded("lost")

    def _lecturer(self, sid: str, secret: str) -> dict[str, Any]:
        meta = self._meta(sid)
        if not hmac.compare_digest(meta["secret"], _digest(str(secret))):
            log.warning("class %s: a request with a wrong lecturer secret was refused", sid)
            raise ClassError("only the lecturer can do that")
        return meta

    def _limit(self, sid: str, what: str, per: int, window_s: int, message: str = "") -> None:
        bucket = int(self._clock() // window_s)
        count = self.backend.incr(self._k(sid, f"rate:{what}:{bucket}"), window_s * 2)
        if count > per:
            if count == per + 1:  # one line per window, not one per refused request
                log.warning("class %s: more than %d %s in %d s; refused until the %d s are over", sid, per, what,
                            window_s, window_s)  # fmt: skip
            raise ClassError(message or "too many requests at once in this class; try again in a moment")

    def _sign(self, meta: dict[str, Any], sid: str, student: str) -> str:
        """The token of `student` in session `sid`: "sid.student.signature", an HMAC with the session's own key."""
        mac = hmac.new(str(meta.get("key", "")).encode(), f"{sid}.{student}".encode(), hashlib.sha256).hexdigest()
        return f"{sid}.{student}.{mac[:32]}"

    def _signed(self, meta: dict[str, Any], sid: str, token: str | None) -> str | None:
        """The student a token names, if the session signed it (a made-up one, or one of another session: None)."""
        parts = str(token or "").split(".")
        if len(parts) != 3 or parts[0] != sid or not meta.get("key"):
            return None
        return parts[1] if hmac.compare_digest(self._sign(meta, sid, parts[1]), str(token)) else None

    # the lecturer
    def create(self, title: str = "") -> Lecture:
        """A new session with a join code no other live session has, and its lecturer's secret."""
        ttl = self.settings.session_ttl_s
        sid, secret = secrets.token_urlsafe(12), secrets.token_urlsafe(24)
        for _ in range(20):
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            if self.backend.set(f"{PREFIX}code:{code}", sid, self.settings.code_ttl_s, only_new=True):
                break
        else:
            raise ClassError("no free join code; try again")
        meta = {
            "code": code,
            "secret": _digest(secret),
            "key": secrets.token_hex(16),  # signs the students' tokens (every replica reads it here)
            "title": str(title)[:80],
            "created": self._clock(),
        }
        self.backend.set(self._k(sid, "meta"), json.dumps(meta), ttl)
        # The version exists while the session does: its poll finds the end in the same one GET (`poll`).
        self.backend.set(self._k(sid, "version"), "0", ttl)
        self.backend.set(self._k(sid, "existed"), "1", ttl + ENDED_KEPT_S)
        log.info("class %s: started (code %s)", sid, code)
        return Lecture(sid=sid, code=code, secret=secret)

    def lecturer(self, sid: str, secret: str) -> str:
        """The session's join code when `secret` is its lecturer's (another device of theirs takes the session
        over), else ClassError (or ClassEnded: the session is over). The session id is input: checked first."""
        if not SID_FORM.fullmatch(str(sid)):
            raise ClassError("this lecturer link is not valid")
        return str(self._lecturer(sid, secret)["code"])

    def renew_code(self, sid: str, secret: str) -> str:
        """Let students in for another code_ttl_s with the same code (or a new one if it was taken meanwhile)."""
        meta = self._lecturer(sid, secret)
        key = f"{PREFIX}code:{meta['code']}"
        holder = self.backend.get(key)
        if holder not in (None, sid):
            raise ClassError("the code was given to another class; start a new session")
        self.backend.set(key, sid, self.settings.code_ttl_s)
        self._touch(sid)
        return meta["code"]

    def _touch(self, sid: str) -> None:
        """The lecturer is active: the session lives session_ttl_s from now."""
        count = int(self.backend.get(self._k(sid, "qcount")) or 0)
        self.backend.expire(self._keys(sid, count), self.settings.session_ttl_s)
        self.backend.expire([self._k(sid, "existed")], self.settings.session_ttl_s + ENDED_KEPT_S)

    def set_view(self, sid: str, secret: str, view: View) -> int:
        """Publish the lecturer's view; returns its version (one more than the last)."""
        self._lecturer(sid, secret)
        params = {str(k)[:40]: str(v) for k, v in view.params.items()}
        if sum(len(k) + len(v) for k, v in params.items()) > MAX_PARAMS:
            raise ClassError("this view's link is too long to share with the class")
        ttl = self.settings.session_ttl_s
        version = self.backend.incr(self._k(sid, "version"), ttl)
        body = {"page": str(view.page)[:80], "params": params, "slide": view.slide, "version": version}
        self.backend.set(self._k(sid, "view"), json.dumps(body), ttl)
        self._touch(sid)
        self._moved(sid)
        return version

    def ask(self, sid: str, secret: str, question: Question) -> int:
        """Ask the class a question (checked); returns its number (1, 2, ...)."""
        self._lecturer(sid, secret)
        q = check_question(question)
        ttl = self.settings.session_ttl_s
        qid = self.backend.incr(self._k(sid, "qcount"), ttl)
        if qid > MAX_QUESTIONS:
            raise ClassError(f"a session holds at most {MAX_QUESTIONS} questions")
        body = asdict(q) | {"qid": qid, "revealed": False, "closed": False}
        self.backend.hset(self._k(sid, "questions"), str(qid), json.dumps(body), ttl)
        self.backend.set(self._k(sid, "current"), str(qid), ttl)
        self.set_view_version_bump(sid)
        return qid

    def set_view_version_bump(self, sid: str) -> None:
        """Students poll one number (the version): a new question or a reveal moves it too."""
        self.backend.incr(self._k(sid, "version"), self.settings.session_ttl_s)
        self._moved(sid)

    def _update(self, sid: str, secret: str, qid: int, **changes: Any) -> None:
        self._lecturer(sid, secret)
        q = self.question(sid, qid)
        body = asdict(q) | changes
        self.backend.hset(self._k(sid, "questions"), str(qid), json.dumps(body), self.settings.session_ttl_s)
        self.set_view_version_bump(sid)

    def reveal(self, sid: str, secret: str, qid: int, effect: dict[str, Any] | None = None) -> None:
        """Show the model's answer to the class (answers are closed with it), and what the reveal ran (`effect`,
        tformer_views.class_questions.ablation_effect: the class's choice ablated beside the model's answer)."""
        changes: dict[str, Any] = {"revealed": True, "closed": True}
        if effect is not None:
            text = json.dumps(effect)
            if len(text) > MAX_EFFECT:
                raise ClassError(f"a reveal's effect is at most {MAX_EFFECT:,} characters")
            changes["effect"] = json.loads(text)
        self._update(sid, secret, qid, **changes)

    def vote_again(self, sid: str, secret: str, qid: int) -> None:
        """Peer instruction: after the class has talked, a second vote on the same question (once); the first
        vote's answers are kept beside it, and the model's answer is hidden again until the next reveal."""
        if self.question(sid, qid).round != 1:
            raise ClassError("this question was voted on twice already")
        self._update(sid, secret, qid, round=2, closed=False, revealed=False)

    def close(self, sid: str, secret: str, qid: int) -> None:
        self._update(sid, secret, qid, closed=True)

    def end(self, sid: str, secret: str) -> None:
        """End the session now: its code, view, questions and answers are deleted."""
        meta = self._lecturer(sid, secret)
        count = int(self.backend.get(self._k(sid, "qcount")) or 0)
        self.backend.set(self._k(sid, "ended"), "1", ENDED_KEPT_S)  # first: a poll meanwhile reads "ended"
        self.backend.delete([f"{PREFIX}code:{meta['code']}", *self._keys(sid, count)])
        log.info("class %s: ended by the lecturer", sid)
        self._moved(sid)

    # everyone
    def join(self, code: str, name: str = "", client: str | None = None, token: str | None = None) -> Seat:
        """A student joins by code. `token`: what their browser kept from an earlier join (a cookie); signed by this
        session, it makes them the same student again (not one more). `client`: their address (None: this
        machine), which may add `per_address` students a minute and guess `code_guesses` wrong codes. A name is
        kept only if given (a returning student's changes only when one is given)."""
        try:
            attempt = self.codes.begin(client or "this machine")
        except Locked as locked:
            raise ClassError(
                f"too many wrong join codes from your address; try again in {locked.wait_s:.0f} s"
            ) from None
        sid = self.backend.get(f"{PREFIX}code:{normal_code(code)}")
        raw = self.backend.get(self._k(sid, "meta")) if sid is not None else None
        if sid is None or raw is None:
            self.codes.wrong(attempt)
            raise ClassError("no class has this code (it may have expired): check it with your lecturer")
        self.codes.right(attempt)
        return self._seat(sid, json.loads(raw), name, client, token)

    def rejoin(self, token: str, client: str | None = None) -> Seat:
        """The student a browser's token names, back in their session (a reload). ClassError for a token no session
        signed; ClassEnded when its session is over."""
        sid = str(token).split(".")[0]
        meta = self._meta(sid) if SID_FORM.fullmatch(sid) else None  # a cookie is input: no key made of just any text
        if meta is None or self._signed(meta, sid, token) is None:
            raise ClassError("this browser's class token is not valid (made up, or from another server)")
        return self._seat(sid, meta, "", client, token)

    def _seat(self, sid: str, meta: dict[str, Any], name: str, client: str | None, token: str | None) -> Seat:
        self._limit(sid, "joins", self.settings.joins_per_min, 60)
        shown = " ".join(str(name).split())[:MAX_NAME]
        students, ttl = self._k(sid, "students"), self.settings.session_ttl_s
        student = self._signed(meta, sid, token)
        if student is not None and self.backend.hget(students, student) is not None:
            if shown:
                self.backend.hset(students, student, json.dumps({"name": shown}), ttl)
            return Seat(sid, student, self._sign(meta, sid, student), returning=True)
        if client is not None:  # a new student: counted against their address
            self._limit(sid, f"new students from {client[:64]}", self.settings.per_address, 60,
                        "too many students joined from your address just now; try again in a minute")  # fmt: skip
        student = student or secrets.token_urlsafe(12)
        self.backend.hset(students, student, json.dumps({"name": shown}), ttl)
        return Seat(sid, student, self._sign(meta, sid, student))

    def code(self, sid: str) -> str:
        return self._meta(sid)["code"]

    def version(self, sid: str) -> int:
        """The number every student polls: it moves with each view, question and reveal."""
        return int(self.backend.get(self._k(sid, "version")) or 0)

    def poll(self, sid: str) -> int:
        """The session's version, as `version`, in one GET while it lives; ClassEnded once it is over (ended by its
        lecturer, expired, or lost with the store), for its students' pages to say so."""
        raw = self.backend.get(self._k(sid, "version"))
        if raw is not None:
            return int(raw)
        self._meta(sid)  # a session without a version key: ClassEnded unless it lives
        return 0

    def view(self, sid: str) -> View | None:
        raw = self.backend.get(self._k(sid, "view"))
        if raw is None:
            return None
        body = json.loads(raw)
        return View(page=body["page"], params=body["params"], slide=body.get("slide"), version=body["version"])

    def alive(self, sid: str) -> bool:
        return self.backend.get(self._k(sid, "meta")) is not None

    def question(self, sid: str, qid: int) -> Question:
        raw = self.backend.hget(self._k(sid, "questions"), str(qid))
        if raw is None:
            raise ClassError("no such question in this class")
        body = json.loads(raw)
        body["grid"] = tuple(body["grid"]) if body.get("grid") else None
        return Question(**body)

    def current(self, sid: str) -> Question | None:
        """The question asked last (open, closed or revealed), or None."""
        raw = self.backend.get(self._k(sid, "current"))
        return self.question(sid, int(raw)) if raw else None

    def questions(self, sid: str) -> list[Question]:
        table = self.backend.hgetall(self._k(sid, "questions"))
        return [self.question(sid, int(k)) for k in sorted(table, key=int)]

    def answer(self, sid: str, qid: int, student: str, raw: str, client: str | None = None) -> float | int:
        """A student's answer: checked, counted once per vote (a second one is refused), while the question is open.
        `client`: the address it came from (None: this machine), which may send `per_address` answers in 10 s."""
        if not self.alive(sid) or self.backend.hget(self._k(sid, "students"), str(student)) is None:
            raise ClassError("join the class first")
        q = self.question(sid, qid)
        if q.closed:
            raise ClassError("this question is closed")
        value = parse_answer(q, raw)
        if client is not None:
            self._limit(sid, f"answers from {client[:64]}", self.settings.per_address, 10,
                        "too many answers from your address just now; try again in a few seconds")  # fmt: skip
        self._limit(sid, "answers", self.settings.answers_per_s, 1)
        body = json.dumps({"value": value, "at": round(self._clock(), 3)})
        key, ttl = self._answers_key(sid, qid, q.round), self.settings.session_ttl_s
        if not self.backend.hset(key, str(student), body, ttl, only_new=True):
            raise ClassError("you have answered this question already" + (" in this vote" if q.round > 1 else ""))
        self.here(sid, str(student))
        return value

    def answer_of(self, sid: str, qid: int, student: str, round: int | None = None) -> float | int | None:
        """This student's answer in a vote (None: the question's current one), or None (a reloaded page shows it)."""
        vote = self.question(sid, qid).round if round is None else round
        raw = self.backend.hget(self._answers_key(sid, qid, vote), str(student))
        return None if raw is None else json.loads(raw)["value"]

    def answers(self, sid: str, qid: int, round: int = 1) -> dict[str, float | int]:
        """student id -> answer in one vote (for the lecturer's counts; a student is never shown another's)."""
        table = self.backend.hgetall(self._answers_key(sid, qid, round))
        return {s: json.loads(v)["value"] for s, v in table.items()}

    def histogram(self, sid: str, qid: int, round: int = 1) -> list[tuple[str, int]]:
        return histogram(self.question(sid, qid), list(self.answers(sid, qid, round).values()))

    def shift(self, sid: str, qid: int) -> dict[str, int]:
        """How the second vote moved against the first (`class_questions.vote_shift`)."""
        return vote_shift(self.question(sid, qid), self.answers(sid, qid, 1), self.answers(sid, qid, 2))

    def students(self, sid: str) -> int:
        return len(self.backend.hgetall(self._k(sid, "students")))

    def here(self, sid: str, student: str) -> None:
        """A student's page is open (it says so every 10 s, and with each answer): one field per student on the
        roster, so the stamps are as many as the students, whoever leaves."""
        if self.backend.hget(self._k(sid, "students"), str(student)) is None:
            return  # not a student of this class: no field for just any id
        self.backend.hset(self._k(sid, "seen"), str(student), f"{self._clock():.1f}", self.settings.session_ttl_s)

    def left(self, sid: str, student: str) -> None:
        """A student left the class (its button): no longer present, at once (their stamp is kept, at 0)."""
        if self.backend.hget(self._k(sid, "seen"), str(student)) is not None:
            self.backend.hset(self._k(sid, "seen"), str(student), "0", self.settings.session_ttl_s)

    def present(self, sid: str, within_s: float = PRESENT_S) -> set[str]:
        """The students whose page was open within the last `within_s` seconds (those who left drop out)."""
        now = self._clock()
        return {s for s, t in self.backend.hgetall(self._k(sid, "seen")).items() if now - float(t) <= within_s}

    def export_csv(self, sid: str, secret: str, names: bool = False) -> str:
        """Every question and answer as CSV: question, kind, prompt, the model's answer, student, answer, correct.
        Students are "student 1", "student 2"... (in the order they joined), or the name they chose if `names`."""
        self._lecturer(sid, secret)
        roster = self.backend.hgetall(self._k(sid, "students"))
        order = {s: i + 1 for i, s in enumerate(roster)}
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            ["question", "kind", "prompt", "model_answer", "student", "answer", "correct", "answer_2", "correct_2"]
        )
        for q in self.questions(sid):
            model = q.label(q.answer) if q.answer is not None else ""
            first, second = self.answers(sid, q.qid, 1), self.answers(sid, q.qid, 2)
            for student in sorted(first.keys() | second.keys(), key=lambda s: order.get(s, 0)):
                chosen = json.loads(roster.get(student, "{}")).get("name", "") if names else ""
                who = chosen or f"student {order.get(student, 0)}"
                votes = []
                for vote in (first, second):  # a vote they did not cast: two empty cells
                    value = vote.get(student)
                    shown = "" if value is None else _cell(q.label(value))
                    votes += [shown, "" if value is None or q.answer is None else _correct(q, value)]
                writer.writerow([q.qid, q.kind, _cell(q.prompt), _cell(model), _cell(who), *votes])
        return out.getvalue()


def _text(value: bytes | str | None) -> str | None:
    """What the Redis client gives (str: the client decodes responses), as text."""
    return value.decode() if isinstance(value, bytes) else value


def _correct(q: Question, value: float | int) -> str:
    if q.answer is None:
        return ""
    if q.kind == "number":  # within 5% of the range: a weight read off a heatmap is not read to 4 digits
        return "yes" if abs(float(value) - float(q.answer)) <= 0.05 * (q.hi - q.lo) else "no"
    return "yes" if int(value) == int(q.answer) else "no"


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet will not run as a formula (a name or token starting with =, +, -, @)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


_STORE: ClassStore | None = None
_STORE_LOCK = threading.Lock()
_RETRY: threading.Event | None = None  # set: the retries of the store made last stop (a new one replaced it)


def shown_url(url: str) -> str:
    """A Redis address as the log shows it: without the password it may carry."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    return parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()


def open_store(settings: ClassSettings | None = None) -> ClassStore:
    """The server's store, made once: Redis when TFORMER_REDIS_URL is set and answers, else this process's memory.
    A Redis that does not answer is tried again in the background, after 1, 2, 4 ... then every 60 s, and the
    store moves to it once it answers (the log says when it could not be reached, and when it came back)."""
    global _STORE, _RETRY
    with _STORE_LOCK:
        if _STORE is None or settings is not None:
            settings = settings or class_settings()
            if _RETRY is not None:
                _RETRY.set()
                _RETRY = None
            backend: Backend = MemoryBackend()
            if settings.redis_url:
                try:
                    redis_backend = RedisBackend(settings.redis_url)
                    redis_backend.ping()
                    backend = redis_backend
                except Exception as error:  # any failure (refused, auth, timeout): the class works in this process
                    log.error(
                        "TFORMER_REDIS_URL=%s cannot be reached (%s): class sessions stay in this process, so "
                        "students on other replicas will not find them, until it answers (tried again after "
                        "%s s, then every %d s)",
                        shown_url(settings.redis_url),
                        error,
                        ", ".join(map(str, RETRY_S[:-1])),
                        RETRY_S[-1],
                    )
                    _RETRY = threading.Event()
            _STORE = ClassStore(backend, settings)
            if _RETRY is not None and settings.redis_url:
                threading.Thread(
                    target=_retry_redis, args=(_STORE, settings.redis_url, _RETRY), name="tformer-redis", daemon=True
                ).start()
        return _STORE


def _retry_redis(store: ClassStore, url: str, stop: threading.Event, waits: Sequence[float] = RETRY_S) -> None:
    """Try the unreachable Redis again and again (waits between tries: `waits`, the last one repeated); once it
    answers, the store uses it. Sessions started in this process meanwhile stay behind: their pages say so."""
    started, tries = time.monotonic(), 0
    while not stop.wait(waits[min(tries, len(waits) - 1)]):
        tries += 1
        try:
            backend = RedisBackend(url)
            backend.ping()
        except Exception as error:
            log.debug("TFORMER_REDIS_URL=%s still cannot be reached (%s)", shown_url(url), error)
            continue
        with _STORE_LOCK:
            if stop.is_set():
                return
            left = store.backend
            store.backend = backend
        behind = 0
        if isinstance(left, MemoryBackend):
            with left._lock:
                behind = sum(1 for k in left._data if k.startswith(PREFIX) and k.endswith(":meta"))
        log.warning(
            "TFORMER_REDIS_URL=%s answers again (try %d, %.0f s after the first failure): class sessions live in "
            "Redis from now on; %d session(s) started in this process meanwhile are left behind (their lecturers "
            "and students are told)",
            shown_url(url),
            tries,
            time.monotonic() - started,
            behind,
        )
        return
