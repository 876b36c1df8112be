"""Decks kept on the server for a lecturer's browser, each under an unguessable token (no Streamlit here).

    store = open_store()                         # files in a folder, or Redis (`deck_settings` says which)
    token = new_token()                          # 32 characters of secrets.token_urlsafe: 192 random bits
    saved = store.save(token, slides, pages)     # SavedDeck(slides, expires): checked as an opened deck file is
    saved = store.load(token, pages)             # the same slides, or a DeckStoreError that says why not

The token is the only key: nothing lists the decks, and a deck is found only by whoever holds its token (the
lecturer's browser keeps it in a cookie; the deck's link carries it to another device). A token is checked
(`TOKEN_FORM`) before it names a file or a key. What is stored is an exported deck file (tformer_app.deck_file's
format), checked by `read_deck` when it is saved and again when it is read: a file changed on the disk is refused
with the reason, never trusted.

Limits: a deck lives `ttl_s` after its last change (TFORMER_DECK_DAYS); it holds at most deck_file.MAX_SLIDES
slides, links of at most MAX_QUERY characters and MAX_DECK_BYTES in all; the server keeps at most `most` decks
(TFORMER_DECKS). Past that a new deck is refused, and no deck is deleted to make room: a deck prepared the evening
before must still be there in the morning, whoever made decks meanwhile; the one refused is told at once, while
their deck is still in their tab (to export).

Files: one per deck, `<token>.json` in the folder, written to a temporary file and renamed over the old one (a
reader sees the old deck or the new, never half of one; a crash leaves the old). Its modification time is its last
change. A new deck is counted under a file lock (`.lock`, flock), so the replicas of one machine (deploy/), which
share the folder, keep the count together; expired files are deleted then. Redis: one key per deck with the TTL,
and a sorted set of the tokens by last change, counted and added to in one script (atomic across replicas).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tformer_core.errors import InputError

from . import settings
from .deck_file import DECK_FORMAT, MAX_DECK_BYTES, DeckError, read_deck

log = logging.getLogger("tformer_app")

TOKEN_BYTES = 24  # secrets.token_urlsafe(24): 32 characters
TOKEN_FORM = re.compile(r"[A-Za-z0-9_-]{32}")
SUFFIX = ".json"
LOCK = ".lock"
STALE_TEMP_S = 3600  # a temporary file this old was left by a process that died while writing
KEY = "tformer:deck:"  # Redis: the deck's key is KEY + token
INDEX = "tformer:decks"  # Redis: a sorted set of tokens by the time of their last change (to count the decks)

# Save a deck in Redis: KEYS = (the deck's key, the index); ARGV = (now, ttl_s, most, body, token). A deck not
# stored yet is added only while fewer than `most` live; the expired leave the index first. Returns 1, or 0: full.
SAVE_LUA = """
local now, ttl, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[2]) >= most then
  return 0
end
redis.call('SET', KEYS[1], ARGV[4], 'EX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[5])
return 1
"""


# ---- what can go wrong, said for the user -------------------------------------------------------------------
class DeckStoreError(Exception):
    """A deck the store cannot give or keep; the message says why, for the user."""


class BadToken(DeckStoreError, InputError):
    """The token is not one this store makes (a link cut short, a cookie changed by hand)."""


class NoDeck(DeckStoreError):
    """No deck is saved under the token: it expired, or was never saved on this server."""


class BrokenDeck(DeckStoreError):
    """The deck stored under the token fails the checks a deck file gets (changed on the disk, or damaged)."""


class Refused(DeckStoreError, InputError):
    """The deck is not saved: the server keeps as many decks as it may, or the deck is past a deck's limits."""


class StoreDown(DeckStoreError):
    """The store failed (a disk error, Redis unreachable): the deck may be fine; trying again later may work."""


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def checked_token(token: object) -> str:
    """The token, if it has the form the store makes (before it names a file or a key); BadToken otherwise."""
    if not isinstance(token, str) or not TOKEN_FORM.fullmatch(token):
        raise BadToken("this is not a deck's token (a deck link ends in deck= and 32 letters, digits, - or _)")
    return token


def shown_token(token: object) -> str:
    """A token as the log shows it: its first 6 characters (enough to tell decks apart, not to open one)."""
    return str(token)[:6] + "…"


# ---- settings ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeckSettings:
    folder: Path | None  # the files' folder, or None: Redis
    redis_url: str | None = None
    ttl_s: int = 30 * 86400  # a deck lives this long after its last change
    most: int = 2000  # decks kept at once

    @property
    def days(self) -> float:
        return self.ttl_s / 86400


def deck_settings(environ: Mapping[str, str] | None = None) -> DeckSettings:
    """Where decks are kept, and their limits, as tformer_core.settings reads them: TFORMER_DECK_DIR when it is set
    (files); else Redis when TFORMER_REDIS_URL is set (replicas on several machines); else files in
    TFORMER_CACHE_DIR/decks. `environ` stands for the process's environment (tests)."""
    folder = settings.value("TFORMER_DECK_DIR", environ)
    url = settings.value("TFORMER_REDIS_URL", environ)
    if folder is None and url is None:
        folder = Path(settings.value("TFORMER_CACHE_DIR", environ)) / "decks"
    return DeckSettings(
        folder=folder,
        redis_url=None if folder is not None else url,
        ttl_s=max(1, round(settings.value("TFORMER_DECK_DAYS", environ) * 86400)),
        most=int(settings.value("TFORMER_DECKS", environ)),
    )


# ---- backends: bytes under a token ------------------------------------------------------------------------------
class Backend(Protocol):
    """Where decks' bytes are kept. `failures`: the exceptions that mean the store failed (not the deck)."""

    failures: tuple[type[BaseException], ...]

    def read(self, token: str, ttl_s: int) -> tuple[bytes, float]:
        """The deck's bytes (at most MAX_DECK_BYTES + 1 of them) and when it last changed; NoDeck if none lives."""
        ...

    def write(self, token: str, body: bytes, ttl_s: int, most: int) -> float:
        """Keep `body` under the token; returns the time of the change. Refused when the deck is new and `most`
        live already."""
        ...


class FileBackend:
    """One file per deck in `folder`, replaced atomically; the count kept under a file lock across processes."""

    failures: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, folder: Path, clock: Callable[[], float] = time.time) -> None:
        self.folder = Path(folder)
        self._clock = clock

    def _path(self, token: str) -> Path:
        return self.folder / f"{checked_token(token)}{SUFFIX}"  # checked again: nothing else names a path here

    def read(self, token: str, ttl_s: int) -> tuple[bytes, float]:
        path = self._path(token)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NoDeck(_none_saved(ttl_s)) from None
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise BrokenDeck("what is stored under this token is not a deck file")
            if self._clock() - info.st_mtime >= ttl_s:
                self._drop_expired(path, ttl_s)
                raise NoDeck(f"the deck saved under this token expired ({_days(ttl_s)} after its last change)")
            return file.read(MAX_DECK_BYTES + 1), info.st_mtime

    def write(self, token: str, body: bytes, ttl_s: int, most: int) -> float:
        path = self._path(token)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        now = self._clock()
        if self._live(path, now, ttl_s):
            self._replace(path, body, now)
            return now
        with self._locked():  # a new deck (or one expired meanwhile): counted with every process's
            live = self._sweep(now, ttl_s, keep=path)
            if live >= most:
                raise Refused(_full(most, ttl_s))
            self._replace(path, body, now)
        log.info("deck %s: saved for the first time (%d decks kept)", shown_token(token), live + 1)
        return now

    def _live(self, path: Path, now: float, ttl_s: int) -> bool:
        try:
            return now - path.stat().st_mtime < ttl_s
        except FileNotFoundError:
            return False

    def _replace(self, path: Path, body: bytes, now: float) -> None:
        """Write `body` to a temporary file beside `path`, to the disk, and rename it over `path` (atomic)."""
        fd, temporary = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(body)
                file.flush()
                os.fsync(file.fileno())
            os.utime(temporary, (now, now))  # its last change, as the store's clock tells it
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        folder = os.open(self.folder, os.O_RDONLY | os.O_CLOEXEC)  # the rename itself reaches the disk
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed, or by the kernel if this process dies
            yield
        finally:
            os.close(fd)

    def _sweep(self, now: float, ttl_s: int, keep: Path) -> int:
        """Delete expired decks (and temporary files a dead process left); returns how many decks live, but `keep`."""
        live = 0
        with os.scandir(self.folder) as entries:
            for entry in entries:
                name = entry.name
                is_deck = name.endswith(SUFFIX) and TOKEN_FORM.fullmatch(name[: -len(SUFFIX)]) is not None
                if not (is_deck or (name.startswith(".") and name.endswith(".tmp"))):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    age = now - entry.stat(follow_symlinks=False).st_mtime
                    if is_deck and age < ttl_s:
                        live += name != keep.name
                    elif age >= (ttl_s if is_deck else STALE_TEMP_S):
                        os.unlink(entry.path)
        return live

    def _drop_expired(self, path: Path, ttl_s: int) -> None:
        """Delete an expired deck found when it was read (under the lock: it cannot be a deck saved meanwhile)."""
        try:
            with self._locked():
                if not self._live(path, self._clock(), ttl_s):
                    path.unlink(missing_ok=True)
        except OSError as error:  # the sweep of the next new deck deletes it
            log.debug("an expired deck was not deleted: %s", error)


class RedisBackend:
    """One key per deck (its TTL: the deck's life), and a sorted set to count them; shared by every replica."""

    def __init__(self, url: str, clock: Callable[[], float] = time.time, timeout_s: float = 2.0) -> None:
        import redis  # only where Redis is configured

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._save = self._redis.register_script(SAVE_LUA)
        self._clock = clock
        self.failures: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

    def read(self, token: str, ttl_s: int) -> tuple[bytes, float]:
        key = KEY + checked_token(token)
        pipe = self._redis.pipeline()
        pipe.get(key)
        pipe.pttl(key)
        body, left_ms = pipe.execute()
        if body is None:
            raise NoDeck(_none_saved(ttl_s))
        left_s = max(int(left_ms), 0) / 1000
        return bytes(body)[: MAX_DECK_BYTES + 1], self._clock() - (ttl_s - left_s)

    def write(self, token: str, body: bytes, ttl_s: int, most: int) -> float:
        now = self._clock()
        token = checked_token(token)
        if not self._save(keys=[KEY + token, INDEX], args=[now, ttl_s, most, body, token]):
            raise Refused(_full(most, ttl_s))
        return now


def _days(ttl_s: int) -> str:
    days = ttl_s / 86400
    return f"{days:g} days" if days >= 1 else f"{ttl_s / 3600:g} hours"


def _full(most: int, ttl_s: int) -> str:
    return (
        f"the server keeps at most {most:,} deck{'s' if most != 1 else ''} (TFORMER_DECKS) and has that many; none is "
        f"deleted before it expires ({_days(ttl_s)} after its last change): tell whoever runs the server"
    )


def _none_saved(ttl_s: int) -> str:
    return (
        f"no deck is saved under this token on this server (a deck is deleted {_days(ttl_s)} after its last "
        "change; or it was saved on another server)"
    )


# ---- the store ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SavedDeck:
    """A deck as the store keeps it: its slides ({"page", "title", "query"}) and when it expires (Unix time)."""

    slides: list[dict[str, str]]
    expires: float


class DeckStore:
    """Decks under tokens on a backend, every deck checked as a deck file is, both ways."""

    def __init__(self, backend: Backend, settings: DeckSettings) -> None:
        self.backend = backend
        self.settings = settings

    def load(self, token: object, pages: Collection[str]) -> SavedDeck:
        """The deck saved under `token` (checked first); `pages`: the app's url paths, the pages a slide may open.
        BadToken, NoDeck, BrokenDeck or StoreDown otherwise."""
        token = checked_token(token)
        try:
            body, changed = self.backend.read(token, self.settings.ttl_s)
        except self.backend.failures as error:
            raise StoreDown(f"the server could not read its saved decks ({_why(error)})") from error
        try:
            slides = read_deck(body, pages, allow_empty=True)
        except DeckError as error:
            raise BrokenDeck(f"the deck saved under this token cannot be opened: {error}") from error
        return SavedDeck(slides, changed + self.settings.ttl_s)

    def save(self, token: object, slides: list[dict[str, str]], pages: Collection[str]) -> SavedDeck:
        """Keep `slides` under `token` (a new deck if none lives), checked as a deck file; its life starts again.
        BadToken, Refused (too many decks, or past a deck's limits) or StoreDown otherwise."""
        token = checked_token(token)
        body = json.dumps(
            {"format": DECK_FORMAT, "version": 1, "slides": slides}, ensure_ascii=False, separators=(",", ":")
        ).encode()
        try:
            checked = read_deck(body, pages, allow_empty=True)
        except DeckError as error:
            raise Refused(f"this deck cannot be saved: {error}") from error
        try:
            changed = self.backend.write(token, body, self.settings.ttl_s, self.settings.most)
        except self.backend.failures as error:
            raise StoreDown(f"the server could not save the deck ({_why(error)})") from error
        return SavedDeck(checked, changed + self.settings.ttl_s)


def _why(error: BaseException) -> str:
    """A store's failure in a few words for the user (the log has the whole of it)."""
    return getattr(error, "strerror", None) or type(error).__name__


def open_backend(deck: DeckSettings, clock: Callable[[], float] = time.time) -> Backend:
    """Files in deck.folder, else Redis at deck.redis_url. A Redis address its client cannot use (a port that is not
    a number) is logged, and the decks kept in files in TFORMER_CACHE_DIR/decks instead; a Redis that does not
    answer is no reason to change stores: each save and load says so, and the next one tries again."""
    if deck.folder is not None:
        return FileBackend(deck.folder, clock)
    try:
        return RedisBackend(str(deck.redis_url), clock)
    except Exception as error:  # any failure of the client's own: the decks still have a home
        folder = settings.cache_dir() / "decks"
        # Its type only: the client's message may quote the address, and an address may carry a password.
        log.error("decks: TFORMER_REDIS_URL cannot be used (%s); decks are kept in %s", type(error).__name__, folder)
        return FileBackend(folder, clock)


_STORE: DeckStore | None = None
_STORE_LOCK = threading.Lock()


def open_store(deck: DeckSettings | None = None, clock: Callable[[], float] = time.time) -> DeckStore:
    """The server's store, made once from the settings (`deck_settings`), or anew from `deck` (tests)."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None or deck is not None:
            deck = deck or deck_settings()
            _STORE = DeckStore(open_backend(deck, clock), deck)
            where = str(deck.folder) if deck.folder is not None else "Redis (TFORMER_REDIS_URL)"
            log.info("decks: kept in %s for %s after their last change, at most %d", where, _days(deck.ttl_s),
                     deck.most)  # fmt: skip
        return _STORE
