"""Decks kept on the server (tformer_app.deck_store): the same tests on files and on a real redis-server (Debian's
binary, tests/app/conftest.py's fixture; skipped without it), a fake clock where the files' expiry is the point.

A deck comes back as it was saved, from another store on the same folder too (a restarted server); it expires
TFORMER_DECK_DAYS after its last change, not after its first; at most TFORMER_DECKS are kept and a new one past
them is refused, never an older one deleted; a token is checked before it names a file, and a stored deck before
it is trusted.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tformer_app.deck_file import DECK_FORMAT, MAX_DECK_BYTES, MAX_QUERY, MAX_SLIDES, read_deck
from tformer_app.deck_store import (
    INDEX,
    BadToken,
    BrokenDeck,
    DeckSettings,
    DeckStore,
    FileBackend,
    NoDeck,
    RedisBackend,
    Refused,
    StoreDown,
    deck_settings,
    new_token,
    open_backend,
)
from tformer_app.url import MAX_LINK

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("", "text", "positional", "block")
DAY = 86400
SLIDES = [
    {"page": "text", "title": "Text attention", "query": "layer=2&head=3"},
    {"page": "positional", "title": "Positional encoding", "query": ""},
]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def file_store(folder: Path, clock: Clock | None = None, days: float = 30, most: int = 2000) -> DeckStore:
    settings = DeckSettings(folder=folder, ttl_s=round(days * DAY), most=most)
    return DeckStore(FileBackend(folder, clock or Clock()), settings)


@pytest.fixture(params=["files", "redis"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def make_store(kind, tmp_path, request):
    """A function making a store of this test's kind (files in one folder, or one Redis): two calls stand for two
    server processes (a restart, or two replicas)."""

    def make(clock: Clock | None = None, days: float = 30, most: int = 2000) -> DeckStore:
        if kind == "files":
            return file_store(tmp_path / "decks", clock, days, most)
        server = request.getfixturevalue("redis_server")
        settings = DeckSettings(folder=None, redis_url=server.url, ttl_s=round(days * DAY), most=most)
        return DeckStore(RedisBackend(server.url, clock or Clock(time.time())), settings)

    return make


def test_a_deck_comes_back_as_it_was_saved_after_a_restart_too(make_store, kind, tmp_path):
    clock = Clock()
    store, token = make_store(clock), new_token()
    assert len(token) == 32
    saved = store.save(token, SLIDES, PAGES)
    assert saved.slides == SLIDES and saved.expires == pytest.approx(clock.now + 30 * DAY, abs=2)
    again = make_store(clock).load(token, PAGES)  # another store on the same folder / Redis: a restarted server
    assert again.slides == SLIDES and again.expires == pytest.approx(saved.expires, abs=2)
    store.save(token, SLIDES[::-1], PAGES)  # a change replaces the deck
    assert make_store(clock).load(token, PAGES).slides == SLIDES[::-1]
    store.save(token, [], PAGES)  # emptied: still this browser's deck, with no slides
    assert store.load(token, PAGES).slides == []
    if kind == "files":  # what is stored is an exported deck file: it opens as one (and nothing but it is left)
        # As sets: a token can begin with "-", which sorts before ".lock" (1 in 64 runs failed a sorted list).
        assert set(os.listdir(tmp_path / "decks")) == {".lock", f"{token}.json"}
        store.save(token, SLIDES, PAGES)
        body = (tmp_path / "decks" / f"{token}.json").read_bytes()
        assert json.loads(body)["format"] == DECK_FORMAT and read_deck(body, PAGES) == SLIDES
        assert (tmp_path / "decks" / f"{token}.json").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "decks").stat().st_mode & 0o777 == 0o700


def test_a_deck_expires_its_days_after_its_last_change(tmp_path):
    clock = Clock()
    store, token = file_store(tmp_path, clock, days=30), new_token()
    store.save(token, SLIDES, PAGES)
    clock.now += 30 * DAY - 60
    assert store.load(token, PAGES).slides == SLIDES  # a minute before it expires
    store.save(token, SLIDES[:1], PAGES)  # a change: 30 days from now
    clock.now += 29 * DAY
    assert store.load(token, PAGES).expires == pytest.approx(clock.now + DAY - 60)
    clock.now += DAY
    with pytest.raises(NoDeck, match=r"expired \(30 days after its last change\)"):
        store.load(token, PAGES)
    assert not (tmp_path / f"{token}.json").exists()  # deleted when found expired
    with pytest.raises(NoDeck, match="no deck is saved under this token on this server"):
        store.load(token, PAGES)
    assert store.save(token, SLIDES, PAGES).slides == SLIDES  # this browser's next change saves it anew


def test_redis_expires_a_deck_with_its_ttl(redis_server):
    settings = DeckSettings(folder=None, redis_url=redis_server.url, ttl_s=1)
    store, token = DeckStore(RedisBackend(redis_server.url), settings), new_token()
    store.save(token, SLIDES, PAGES)
    backend = RedisBackend(redis_server.url)
    assert 0 < backend._redis.pttl(f"tformer:deck:{token}") <= 1000
    deadline = time.monotonic() + 10
    while True:  # Redis expires the key itself: real time, until it has
        try:
            store.load(token, PAGES)
        except NoDeck:
            break
        assert time.monotonic() < deadline, "Redis did not expire the deck"
        time.sleep(0.05)  # polling interval of the condition above


def test_at_most_so_many_decks_a_new_one_past_them_refused_and_none_deleted(make_store, kind):
    clock = Clock() if kind == "files" else Clock(time.time())
    store = make_store(clock, days=30, most=2)
    first, second, third = new_token(), new_token(), new_token()
    store.save(second, SLIDES, PAGES)
    clock.now += DAY
    store.save(first, SLIDES, PAGES)
    with pytest.raises(Refused, match=r"at most 2 decks \(TFORMER_DECKS\) and has that many; none is deleted"):
        store.save(third, SLIDES, PAGES)
    with pytest.raises(NoDeck, match=r"^no deck is saved under this token on this server"):
        store.load(third, PAGES)
    store.save(first, SLIDES[:1], PAGES)  # the decks kept still change
    assert [store.load(t, PAGES).slides for t in (first, second)] == [SLIDES[:1], SLIDES]
    clock.now += 30 * DAY - 60  # the second expires; the first, saved a day later, lives
    store.save(third, SLIDES, PAGES)  # room again: the expired one no longer counts
    assert store.load(third, PAGES).slides == SLIDES and store.load(first, PAGES).slides == SLIDES[:1]
    if kind == "files":
        assert sorted(p.name for p in Path(store.settings.folder).glob("*.json")) == sorted(
            f"{t}.json" for t in (first, third)
        )
    else:
        index = RedisBackend(str(store.settings.redis_url))._redis.zrange(INDEX, 0, -1)
        assert sorted(index) == sorted(t.encode() for t in (first, third))


def test_the_count_holds_when_many_save_new_decks_at_once(tmp_path):
    """Eight threads (each with its own lock file's descriptor, as the processes of replicas have) save 40 new decks
    into room for 10: exactly 10 are kept."""
    store = file_store(tmp_path, Clock(), most=10)
    refused: list[int] = []

    def saver() -> None:
        for _ in range(5):
            try:
                store.save(new_token(), SLIDES, PAGES)
            except Refused:
                refused.append(1)

    threads = [threading.Thread(target=saver) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(list(tmp_path.glob("*.json"))) == 10 and len(refused) == 30


def test_a_deck_past_a_decks_limits_is_not_saved(tmp_path):
    store, token = file_store(tmp_path), new_token()
    too_many = [{"page": "text", "title": str(i), "query": ""} for i in range(MAX_SLIDES + 1)]
    with pytest.raises(Refused, match=f"it has {MAX_SLIDES + 1} slides; a deck holds at most {MAX_SLIDES}"):
        store.save(token, too_many, PAGES)
    with pytest.raises(Refused, match="slide 1's link is 6,001 characters; a link holds 6,000"):
        store.save(token, [{"page": "text", "title": "x", "query": "a" * (MAX_QUERY + 1)}], PAGES)
    with pytest.raises(Refused, match="pages this app does not have: nope"):
        store.save(token, [{"page": "nope", "title": "x", "query": ""}], PAGES)
    assert list(tmp_path.iterdir()) == []  # nothing written
    # The largest deck there is, with titles of 80 non-ASCII characters, fits (written as UTF-8, not \\u escapes).
    largest = [{"page": "text", "title": "é" * 80, "query": "q" * MAX_QUERY} for _ in range(MAX_SLIDES)]
    assert store.save(token, largest, PAGES).slides == largest
    assert (tmp_path / f"{token}.json").stat().st_size <= MAX_DECK_BYTES


@pytest.mark.parametrize(
    "token",
    ["../x", "../" * 10 + "etc/passwd", "a" * 31 + "/", "a" * 31, "a" * 33, "a" * 31 + ".", "", "a" * 31 + "\0",
     "é" * 32, None, 12345, ".lock"],
    ids=["parent", "deep", "slash", "short", "long", "dot", "empty", "nul", "unicode", "none", "number", "lock"],
)  # fmt: skip
def test_a_token_is_checked_before_it_names_a_file(make_store, tmp_path, token):
    store = make_store()
    for action in (lambda: store.load(token, PAGES), lambda: store.save(token, SLIDES, PAGES)):
        with pytest.raises(BadToken, match="not a deck's token"):
            action()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"]  # nothing read or written
    with pytest.raises(BadToken, match=r"^this is not a deck's token \(a deck link ends in deck= and 32 letters"):
        FileBackend(tmp_path).read(str(token), DAY)  # the backend checks it again


def write_raw(folder: Path, token: str, body: bytes, when: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{token}.json").write_bytes(body)
    os.utime(folder / f"{token}.json", (when, when))


@pytest.mark.parametrize(
    "body, why",
    [
        (b"{not json", "it is not valid JSON"),
        (b"\xff\xfe", "it is not a text file"),
        (b"[" * 100_000, "it nests more than 8 levels deep"),
        (b" " * (MAX_DECK_BYTES + 10), "the file is 321 kB; a deck of 50 slides takes at most 321 kB"),
        (
            b'{"format": "tformer-deck", "slides": [{"page": "admin", "query": ""}]}',
            "slides for pages this app does not have: admin",
        ),
        (b'{"format": "other", "slides": []}', "it is not a tformer deck"),
    ],
    ids=["json", "binary", "nested", "large", "page", "format"],
)
def test_a_stored_deck_changed_on_the_disk_is_refused_with_its_reason(tmp_path, body, why):
    clock, token = Clock(), new_token()
    write_raw(tmp_path, token, body, clock.now)
    with pytest.raises(BrokenDeck, match=f"the deck saved under this token cannot be opened: {why}"):
        file_store(tmp_path, clock).load(token, PAGES)


def test_a_link_in_place_of_a_deck_and_a_store_that_fails_say_so(tmp_path):
    token, target = new_token(), tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": DECK_FORMAT, "slides": SLIDES}))
    (tmp_path / "decks").mkdir()
    (tmp_path / "decks" / f"{token}.json").symlink_to(target)
    with pytest.raises(StoreDown, match="the server could not read its saved decks"):  # not followed
        file_store(tmp_path / "decks").load(token, PAGES)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreDown, match=r"the server could not save the deck \(File exists\)"):
        file_store(tmp_path / "a-file").save(new_token(), SLIDES, PAGES)  # its folder cannot be made


def test_an_unreachable_redis_says_so_and_leaves_the_files_alone():
    from deploy.redis_server import _free_port

    url = f"redis://127.0.0.1:{_free_port()}/0"
    store = DeckStore(RedisBackend(url, timeout_s=0.5), DeckSettings(folder=None, redis_url=url))
    with pytest.raises(StoreDown, match=r"the server could not save the deck \(ConnectionError\)"):
        store.save(new_token(), SLIDES, PAGES)
    with pytest.raises(StoreDown, match="the server could not read its saved decks"):
        store.load(new_token(), PAGES)


def test_settings_choose_the_store_and_bad_values_are_logged(tmp_path, caplog):
    cache = str(tmp_path / "cache")
    plain = deck_settings({"TFORMER_CACHE_DIR": cache})
    assert plain == DeckSettings(folder=tmp_path / "cache" / "decks", redis_url=None, ttl_s=30 * DAY, most=2000)
    redis = deck_settings({"TFORMER_REDIS_URL": "redis://127.0.0.1:6390/0", "TFORMER_DECK_DAYS": "0.5"})
    assert redis.folder is None and redis.redis_url == "redis://127.0.0.1:6390/0" and redis.ttl_s == DAY // 2
    both = deck_settings({"TFORMER_REDIS_URL": "redis://127.0.0.1:6390/0", "TFORMER_DECK_DIR": str(tmp_path)})
    assert both.folder == tmp_path and both.redis_url is None  # a folder named wins: files outlive a Redis
    assert isinstance(open_backend(both), FileBackend)
    core = logging.getLogger("tformer_core")  # the app's log may not propagate to the root's (caught there too)
    core.addHandler(caplog.handler)
    try:
        bad = deck_settings({"TFORMER_DECK_DAYS": "0", "TFORMER_DECKS": "1.5", "TFORMER_CACHE_DIR": cache})
        assert deck_settings({"TFORMER_DECK_DAYS": "4000", "TFORMER_CACHE_DIR": cache}).ttl_s == 30 * DAY
    finally:
        core.removeHandler(caplog.handler)
    assert bad.ttl_s == 30 * DAY and bad.most == 2000
    lines = list(dict.fromkeys(r.getMessage() for r in caplog.records if "TFORMER_DECK" in r.getMessage()))
    assert lines == [
        "TFORMER_DECK_DAYS='0' is refused (not a positive number); using 30",
        "TFORMER_DECKS='1.5' is refused (not a whole number); using 2000",
        "TFORMER_DECK_DAYS='4000' is refused (a number of days in (0, 3650]); using 30",
    ]


@pytest.mark.slow
def test_the_store_imports_no_streamlit_and_a_slide_holds_what_a_link_does():
    """The store is read by whatever runs the server (no Streamlit in it, nor in the deck file's checks it uses)."""
    code = "import sys, tformer_app.deck_store; print('streamlit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert MAX_QUERY == MAX_LINK
