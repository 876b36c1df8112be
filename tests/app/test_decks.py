"""A deck kept on the server for the lecturer's browser, driven through the whole app (AppTest): every change saved
at once; a fresh session (a reload, a typed address, a new tab, another browser) opens it by the browser's cookie or
by the deck's link, before presenter mode's bar is drawn; a deck changed in another browser is never overwritten
with an old copy; a link or cookie that opens nothing, and a deck the server will not keep, are said (and logged
with their cause), never a traceback.

AppTest has no browser cookie: `decks._browser_token` stands for it, holding what the first session's page wrote
(COOKIE_VALUE), as tests/app/test_class_guard.py does for a student's token.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import app, ok, shown
from tformer_app import deck_store, decks
from tformer_app.deck_store import DeckSettings, DeckStore, FileBackend, new_token

EARLY = "app_pages/before_transformers.py"
STEP = "app_pages/step_by_step.py"
PAGES = ("", "early", "step-by-step", "text", "positional")


def use_store(monkeypatch, folder: Path, most: int = 2000) -> DeckStore:
    store = DeckStore(FileBackend(folder), DeckSettings(folder=folder, most=most))
    monkeypatch.setattr(deck_store, "_STORE", store)
    return store


@pytest.fixture
def store(monkeypatch, tmp_path) -> DeckStore:
    """The server's deck store: files in this test's folder (the module's store as it was, afterwards)."""
    return use_store(monkeypatch, tmp_path / "decks")


@pytest.fixture
def app_log(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """The app's log lines (its logger may not propagate to the root's once the app configured it)."""
    logger = logging.getLogger("tformer_app")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def failures(log: pytest.LogCaptureFixture) -> list[str]:
    lines = (r.getMessage() for r in log.records if r.name == "tformer_app" and r.levelno == logging.WARNING)
    return list(dict.fromkeys(lines))


def slides_label(at: AppTest) -> str:
    return next(e.label for e in at.sidebar.expander if e.label.startswith("Slides ("))


def notes(at: AppTest) -> list[str]:
    return [shown(e.value) for e in [*at.sidebar.warning, *at.sidebar.info]]


def add(at: AppTest) -> AppTest:
    return ok(at.sidebar.button(key="_tformer.deck.add").click().run())


def lecturer_deck() -> tuple[AppTest, str]:
    """A lecturer who added two slides (Home, Attention before Transformers): their app, and the deck's token."""
    lecturer = add(app())
    add(ok(lecturer.switch_page(EARLY).run()))
    return lecturer, lecturer.session_state[decks.TOKEN]


def test_a_deck_is_saved_at_each_change_and_opens_in_a_fresh_session_by_cookie_and_by_link(store, monkeypatch):
    lecturer, token = lecturer_deck()
    slides = lecturer.session_state[decks.DECK]
    assert [s["page"] for s in slides] == ["", "early"] and slides_label(lecturer) == "Slides (2)"
    assert lecturer.session_state[decks.COOKIE_VALUE] == token  # what the page's element writes in the cookie
    assert store.load(token, PAGES).slides == slides  # saved at once
    assert lecturer.sidebar.code[0].value.endswith(f"/?deck={token}")  # the deck's link, to copy
    # A reload, a typed address, a new tab: a fresh session whose browser holds the cookie. In presenter mode the
    # bar, drawn before the page, offers the deck in that first run.
    monkeypatch.setattr(decks, "_browser_token", lambda: token)
    again = ok(app(present="1"))
    assert again.session_state[decks.DECK] == slides and slides_label(again) == "Slides (2)"
    assert again.button(key="_tformer.bar.start").label == "Present the slides (2)"
    ok(again.button(key="_tformer.bar.start").click().run())
    assert again.session_state[decks.SHOWING] == 0
    # Another browser (the projector's), without the cookie, given the link: the deck, and its token leaves the
    # address (a reload finds it by the cookie the page then writes).
    monkeypatch.setattr(decks, "_browser_token", lambda: "")
    projector = ok(app(deck=token))
    assert projector.session_state[decks.DECK] == slides and "deck" not in projector.query_params
    assert projector.session_state[decks.COOKIE_VALUE] == token and not notes(projector)
    ok(projector.sidebar.button(key="_tformer.deck.down.0").click().run())  # its change is saved for both
    assert [s["page"] for s in store.load(token, PAGES).slides] == ["early", ""]


def test_a_change_is_made_on_the_deck_as_saved_never_on_an_old_copy(store, monkeypatch):
    laptop, token = lecturer_deck()
    projector = ok(app(deck=token))
    ok(projector.sidebar.button(key="_tformer.deck.remove.0").click().run())  # the projector removes slide 1
    ok(laptop.sidebar.button(key="_tformer.deck.down.0").click().run())  # the laptop, still showing two, moves it
    assert [s["page"] for s in laptop.session_state[decks.DECK]] == ["early"]  # the deck as saved; nothing moved
    assert notes(laptop) == [
        "This deck was changed in another browser meanwhile: here it is as saved there (1 slides). Make your change "
        "again."
    ]
    add(laptop)  # now in step: saved, and the note goes
    assert [s["page"] for s in store.load(token, PAGES).slides] == ["early", "early"] and not notes(laptop)


def test_a_link_or_a_cookie_that_opens_no_deck_is_said_and_logged(store, monkeypatch, app_log):
    bad = ok(app(deck="../../etc/passwd"))
    assert notes(bad) == [
        "The deck link could not be opened: this is not a deck's token (a deck link ends in deck= and 32 letters, "
        "digits, - or _)."
    ]
    assert bad.session_state[decks.DECK] == [] and "deck" not in bad.query_params
    assert not notes(ok(bad.sidebar.button(key="_tformer.deck.note.ok").click().run()))  # OK puts it away
    unknown = ok(app(deck=new_token()))
    assert notes(unknown)[0].startswith("The deck link could not be opened: no deck is saved under this token on this")
    # A cookie whose deck expired, and one whose file was damaged on the disk: said once, the cookie forgotten.
    expired, damaged = new_token(), new_token()
    store.save(expired, [{"page": "", "title": "Home", "query": ""}], PAGES)
    old = os.stat(store.settings.folder / f"{expired}.json").st_mtime - 31 * 86400
    os.utime(store.settings.folder / f"{expired}.json", (old, old))
    (store.settings.folder / f"{damaged}.json").write_text('{"format": "tformer-deck", "slides": [{"page": 1}]}')
    whys = {
        expired: "the deck saved under this token expired (30 days after its last change)",
        damaged: "the deck saved under this token cannot be opened: slide 1 is not a page and a link's query",
    }
    for token, why in whys.items():
        monkeypatch.setattr(decks, "_browser_token", lambda token=token: token)
        at = ok(app())
        assert notes(at) == [f"The deck this browser kept could not be opened: {why}."]
        assert at.session_state[decks.COOKIE_VALUE] == "" and at.session_state[decks.DECK] == []
    logged = failures(app_log)
    assert len(logged) == 4 and all("failed: " in line for line in logged), logged
    assert logged[0].startswith("opening the deck of this browser's link (../../…) failed: BadToken: ")
    assert logged[3].startswith(f"opening the deck of this browser's cookie ({damaged[:6]}…) failed: BrokenDeck: ")
    assert "(cause: DeckError: slide 1 is not a page and a link's query)" in logged[3]


def test_a_deck_the_server_will_not_keep_stays_in_its_tab_with_a_message(monkeypatch, tmp_path, app_log):
    full = use_store(monkeypatch, tmp_path, most=1)
    full.save(new_token(), [], PAGES)  # someone else's deck fills the server
    at = add(app())
    assert len(at.session_state[decks.DECK]) == 1 and decks.TOKEN not in at.session_state  # in the tab only
    assert notes(at) == [
        "This change is not saved on the server: the server keeps at most 1 deck (TFORMER_DECKS) and has that "
        "many; none is deleted before it expires (30 days after its last change): tell whoever runs the server. The "
        "deck stays in this tab while it is open; *Export the deck* keeps a copy."
    ]
    assert failures(app_log)[0].startswith("saving deck ")
    assert "failed: Refused: the server keeps at most 1 deck " in failures(app_log)[0]


def test_a_browser_forgets_its_deck_which_stays_under_its_link(store, monkeypatch):
    lecturer, token = lecturer_deck()
    ok(lecturer.sidebar.button(key="_tformer.deck.forget").click().run())
    assert lecturer.session_state[decks.DECK] == [] and lecturer.session_state[decks.COOKIE_VALUE] == ""
    assert notes(lecturer)[0].startswith("This browser no longer keeps the deck. It stays on the server until ")
    assert lecturer.sidebar.code[0].value.endswith(f"/?deck={token}")  # its link, to open it again
    assert len(store.load(token, PAGES).slides) == 2
    add(lecturer)  # a new deck from here, under a new token
    assert lecturer.session_state[decks.TOKEN] != token


def test_a_slide_never_opens_a_deck(store, monkeypatch):
    """A slide's link carrying ?deck= (a deck file made by hand) opens its view, and this browser keeps its own deck."""
    lecturer, token = lecturer_deck()
    other = new_token()
    store.save(other, [], PAGES)
    lecturer.session_state[decks.DECK] = [{"page": "step-by-step", "title": "Step", "query": f"deck={other}"}]
    ok(lecturer.run())
    ok(lecturer.sidebar.button(key="_tformer.deck.start").click().run())
    assert lecturer.session_state[decks.SHOWING] == 0 and "deck" not in lecturer.query_params
    assert lecturer.session_state[decks.TOKEN] == token
