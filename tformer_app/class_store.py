"""A class session's shared state: the lecturer's view, the questions and the class's answers (no Streamlit here).

    store = open_store()                                 # Redis when TFORMER_REDIS_URL is set, else this process
    lecture = store.create()                             # lecture.code "K7M2QX", lecture.secret (the lecturer's)
    sid = store.join("k7m2qx")                           # a student: the session id, or a ClassError
    store.set_view(sid, secret, View("text", {"layer": "3", "head": "1"}))   # version 1
    store.view(sid)                                      # what every student's page polls (about once a second)
    q = store.ask(sid, secret, Question(kind="token", prompt="...", choices=[...], answer=10))
    store.answer(sid, q, student, "10")                  # once per student per question, validated
    store.histogram(sid, q), store.reveal(sid, secret, q), store.export_csv(sid, secret)

Every session and replica of the server sees the same state when it lives in Redis (several replicas behind
nginx); one process alone may keep it in memory (`MemoryBackend`, the default). Both backends offer the same
few primitives (`Backend`), and `ClassStore` builds everything on them once, so the two are tested alike.
Keys expire: a session after `session_ttl_s` without the lecturer's activity, its join code after `code_ttl_s`.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import logging
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tformer_core import settings
from tformer_views.class_questions import ClassError, Question, check_question, histogram, parse_answer

log = logging.getLogger("tformer_app")

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read off a projector at the back of a room
CODE_LENGTH = 6
PREFIX = "tformer:class:"
MAX_NAME = 40  # characters of a student's chosen name
MAX_QUESTIONS = 200  # per session
MAX_PARAMS = 6000  # characters of a view's query parameters (a link's limit, tformer_app.url.MAX_LINK)


__all__ = ["ClassError", "ClassStore", "Question", "View", "check_question", "histogram", "parse_answer"]


# ---- settings: the one place TFORMER_REDIS_URL and the class's limits are read ---------------------------------
@dataclass(frozen=True)
class ClassSettings:
    redis_url: str | None  # None: the in-process store (one server process)
    session_ttl_s: int = 6 * 3600  # a session lives this long after the lecturer's last change
    code_ttl_s: int = 3 * 3600  # a join code admits students this long after it was made (or renewed)
    answers_per_s: int = 200  # per session: a class of 100 answering in the same second, twice over
    joins_per_min: int = 300  # per session


def class_settings(environ: Mapping[str, str] | None = None) -> ClassSettings:
    """TFORMER_REDIS_URL and TFORMER_CLASS_HOURS, read and checked by tformer_core.settings (a bad value is logged
    once and the default used); `environ` stands for the process's environment (tests)."""
    url, hours = settings.value("TFORMER_REDIS_URL", environ), settings.value("TFORMER_CLASS_HOURS", environ)
    ttl = int(hours * 3600)
    return ClassSettings(redis_url=url, session_ttl_s=ttl, code_ttl_s=min(ttl, 3 * 3600))


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


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def normal_code(code: str) -> str:
    """A typed code as stored: upper case, without the spaces or dashes a student may type."""
    return "".join(str(code).split()).replace("-", "").upper()[:16]


class ClassStore:
    """Class sessions on a backend (memory or Redis); every method is one or a few round trips."""

    def __init__(self, backend: Backend, settings: ClassSettings | None = None, clock=time.time) -> None:
        self.backend = backend
        self.settings = settings or ClassSettings(redis_url=None)
        self._clock = clock

    # keys
    def _k(self, sid: str, part: str) -> str:
        return f"{PREFIX}{sid}:{part}"

    def _keys(self, sid: str, questions: int = 0) -> list[str]:
        fixed = ["meta", "view", "version", "questions", "qcount", "current", "students"]
        return [self._k(sid, p) for p in fixed] + [self._k(sid, f"answers:{i}") for i in range(1, questions + 1)]

    def _meta(self, sid: str) -> dict[str, Any]:
        raw = self.backend.get(self._k(sid, "meta"))
        if raw is None:
            raise ClassError("this class session has ended (or never was)")
        return json.loads(raw)

    def _lecturer(self, sid: str, secret: str) -> dict[str, Any]:
        meta = self._meta(sid)
        if not hmac.compare_digest(meta["secret"], _digest(str(secret))):
            log.warning("class %s: a request with a wrong lecturer secret was refused", sid)
            raise ClassError("only the lecturer can do that")
        return meta

    def _limit(self, sid: str, what: str, per: int, window_s: int) -> None:
        bucket = int(self._clock() // window_s)
        if self.backend.incr(self._k(sid, f"rate:{what}:{bucket}"), window_s * 2) > per:
            log.warning("class %s: more than %d %s in %d s; refused", sid, per, what, window_s)
            raise ClassError("too many requests at once in this class; try again in a moment")

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
        meta = {"code": code, "secret": _digest(secret), "title": str(title)[:80], "created": self._clock()}
        self.backend.set(self._k(sid, "meta"), json.dumps(meta), ttl)
        log.info("class %s: started (code %s)", sid, code)
        return Lecture(sid=sid, code=code, secret=secret)

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

    def _update(self, sid: str, secret: str, qid: int, **changes: Any) -> None:
        self._lecturer(sid, secret)
        q = self.question(sid, qid)
        body = asdict(q) | changes
        self.backend.hset(self._k(sid, "questions"), str(qid), json.dumps(body), self.settings.session_ttl_s)
        self.set_view_version_bump(sid)

    def reveal(self, sid: str, secret: str, qid: int) -> None:
        """Show the model's answer to the class (answers are closed with it)."""
        self._update(sid, secret, qid, revealed=True, closed=True)

    def close(self, sid: str, secret: str, qid: int) -> None:
        self._update(sid, secret, qid, closed=True)

    def end(self, sid: str, secret: str) -> None:
        """End the session now: its code, view, questions and answers are deleted."""
        meta = self._lecturer(sid, secret)
        count = int(self.backend.get(self._k(sid, "qcount")) or 0)
        self.backend.delete([f"{PREFIX}code:{meta['code']}", *self._keys(sid, count)])
        log.info("class %s: ended by the lecturer", sid)

    # everyone
    def join(self, code: str, name: str = "") -> tuple[str, str]:
        """A student joins by code: (the session id, the student's own id). A name is kept only if given."""
        sid = self.backend.get(f"{PREFIX}code:{normal_code(code)}")
        if sid is None or self.backend.get(self._k(sid, "meta")) is None:
            raise ClassError("no class has this code (it may have expired): check it with your lecturer")
        self._limit(sid, "joins", self.settings.joins_per_min, 60)
        student = secrets.token_urlsafe(12)
        shown = " ".join(str(name).split())[:MAX_NAME]
        self.backend.hset(self._k(sid, "students"), student, json.dumps({"name": shown}), self.settings.session_ttl_s)
        return sid, student

    def code(self, sid: str) -> str:
        return self._meta(sid)["code"]

    def version(self, sid: str) -> int:
        """The number every student polls: it moves with each view, question and reveal."""
        return int(self.backend.get(self._k(sid, "version")) or 0)

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

    def answer(self, sid: str, qid: int, student: str, raw: str) -> float | int:
        """A student's answer: checked, counted once (a second one is refused), while the question is open."""
        if not self.alive(sid) or self.backend.hget(self._k(sid, "students"), str(student)) is None:
            raise ClassError("join the class first")
        q = self.question(sid, qid)
        if q.closed:
            raise ClassError("this question is closed")
        value = parse_answer(q, raw)
        self._limit(sid, "answers", self.settings.answers_per_s, 1)
        body = json.dumps({"value": value, "at": round(self._clock(), 3)})
        if not self.backend.hset(
            self._k(sid, f"answers:{qid}"), str(student), body, self.settings.session_ttl_s, only_new=True
        ):
            raise ClassError("you have answered this question already")
        return value

    def answers(self, sid: str, qid: int) -> dict[str, float | int]:
        """student id -> answer (for the lecturer's counts; a student is never shown another's)."""
        table = self.backend.hgetall(self._k(sid, f"answers:{qid}"))
        return {s: json.loads(v)["value"] for s, v in table.items()}

    def histogram(self, sid: str, qid: int) -> list[tuple[str, int]]:
        return histogram(self.question(sid, qid), list(self.answers(sid, qid).values()))

    def students(self, sid: str) -> int:
        return len(self.backend.hgetall(self._k(sid, "students")))

    def export_csv(self, sid: str, secret: str, names: bool = False) -> str:
        """Every question and answer as CSV: question, kind, prompt, the model's answer, student, answer, correct.
        Students are "student 1", "student 2"... (in the order they joined), or the name they chose if `names`."""
        self._lecturer(sid, secret)
        roster = self.backend.hgetall(self._k(sid, "students"))
        order = {s: i + 1 for i, s in enumerate(roster)}
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["question", "kind", "prompt", "model_answer", "student", "answer", "correct"])
        for q in self.questions(sid):
            model = q.label(q.answer) if q.answer is not None else ""
            for student, value in sorted(self.answers(sid, q.qid).items(), key=lambda kv: order.get(kv[0], 0)):
                chosen = json.loads(roster.get(student, "{}")).get("name", "") if names else ""
                who = chosen or f"student {order.get(student, 0)}"
                right = "" if q.answer is None else _correct(q, value)
                writer.writerow(
                    [q.qid, q.kind, _cell(q.prompt), _cell(model), _cell(who), _cell(q.label(value)), right]
                )
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


def open_store(settings: ClassSettings | None = None) -> ClassStore:
    """The server's store, made once: Redis when TFORMER_REDIS_URL is set and answers, else this process's memory
    (one replica only: the log says so when Redis was asked for and could not be reached)."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None or settings is not None:
            settings = settings or class_settings()
            backend: Backend = MemoryBackend()
            if settings.redis_url:
                try:
                    redis_backend = RedisBackend(settings.redis_url)
                    redis_backend.ping()
                    backend = redis_backend
                except Exception as error:  # any failure (refused, auth, timeout): the class works in this process
                    log.error(
                        "TFORMER_REDIS_URL=%s cannot be reached (%s): class sessions stay in this process, "
                        "so students on other replicas will not find them",
                        settings.redis_url,
                        error,
                    )
            _STORE = ClassStore(backend, settings)
        return _STORE
