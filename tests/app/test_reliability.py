"""Every input a message, every failure in the server's log with its cause, and nothing a failure keeps alive.

Each case was found by a hostile-input run on the live app (issue 21): a deck nested 100,000 levels raised
RecursionError; 1e308 in a step-by-step matrix gave NaN weights under "each row sums to 1"; the distance page
replaced a link's model silently; a numpy ValueError (a bug) was shown as if the input were wrong; a failed load
was raised again as the same exception, its traceback growing with every page that hit it.
"""

from __future__ import annotations

import logging
import traceback

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.app.pages import messages, no_exception, run
from tformer_app import logs, models
from tformer_app.budget import ByteBudgetCache
from tformer_app.deck_file import MAX_DECK_BYTES, DeckError, read_deck
from tformer_core.checkpoints import CheckpointError

PAGES = {"text", "vision", "step-by-step"}


@pytest.fixture
def app_log():
    """The records the tformer_app logger writes during a test (whatever handlers the app configured)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("tformer_app")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def link_line(at) -> str:
    return next(m for m in messages(at, "info") if m.startswith("From the link:"))


# ---- bugs are not input errors -------------------------------------------------------------------------------
def _page_with_a_bug_and_a_bad_input() -> None:
    import numpy as np

    from tformer_app.page import run_safely
    from tformer_core.errors import InputError

    def bad_input():
        raise InputError("the sentence is empty: type at least one word")

    run_safely(bad_input, "Sentence")
    run_safely(lambda: np.ones(2) @ np.ones(3), "Heatmap")  # a ValueError from numpy: a bug, not the input


def test_run_safely_shows_input_errors_as_such_and_a_bug_as_a_note_with_an_id_in_the_log(app_log):
    at = AppTest.from_function(_page_with_a_bug_and_a_bad_input).run()
    no_exception(at)
    shown = messages(at, "error")
    assert shown[0] == "Sentence: the sentence is empty: type at least one word"
    assert shown[1].startswith("Heatmap: something went wrong on the server (not in what you gave)")
    assert "matmul" not in shown[1] and "ValueError" not in shown[1]
    note_id = shown[1].rsplit("error ", 1)[1].rstrip(".")
    bugs = [r for r in app_log if r.levelno == logging.ERROR]
    assert len(bugs) == 1 and note_id in bugs[0].getMessage() and "ValueError" in bugs[0].getMessage()
    assert bugs[0].exc_info is not None  # the traceback is in the log
    failures = [r.getMessage() for r in app_log if r.levelno == logging.WARNING]
    assert failures == ["Sentence failed: InputError: the sentence is empty: type at least one word"]


# ---- failed loads: logged once with their cause, raised anew ---------------------------------------------------
def test_a_failed_load_is_logged_with_its_cause_and_raised_as_a_new_exception(tmp_path, monkeypatch, app_log):
    folder = tmp_path / "models" / "broken"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{not json")
    monkeypatch.setenv("TFORMER_MODEL_DIRS", str(tmp_path / "models"))
    models.clear_models()
    errors = []
    for _ in range(4):
        with pytest.raises(CheckpointError, match=r"^config\.json is not valid JSON \(Expecting") as caught:
            models.cached_model("models/broken")
        errors.append(caught.value)
    models.clear_models()
    assert len({id(e) for e in errors}) == 4  # a new exception each time: nothing accumulates on one
    depths = [len(traceback.extract_tb(e.__traceback__)) for e in errors]
    assert depths[1:] == depths[:1] * 3, depths  # the same exception raised again grew 6 -> 8 -> 10 -> 12 frames
    lines = [r.getMessage() for r in app_log if r.levelno == logging.WARNING]
    assert lines == [
        "loading the model 'models/broken' failed: CheckpointError: config.json is not valid JSON (Expecting property "
        "name enclosed in double quotes at line 1, column 2) (cause: JSONDecodeError: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1))"
    ]
    debug = [r for r in app_log if r.levelno == logging.DEBUG and r.exc_info]
    assert len(debug) == 1 and "The above exception was the direct cause" in logging.Formatter().format(debug[0])


def test_the_log_is_configured_once_one_logger_per_package(monkeypatch):
    monkeypatch.setattr(logs, "_configured", False)
    monkeypatch.setenv("TFORMER_LOG_LEVEL", "debug")
    before = {name: list(logging.getLogger(name).handlers) for name in logs.PACKAGES}
    try:
        logs.configure()
        logs.configure()  # once per process, whatever the number of runs
        for name in logs.PACKAGES:
            logger = logging.getLogger(name)
            added = [h for h in logger.handlers if h not in before[name]]
            assert len(added) == 1 and logger.level == logging.DEBUG and not logger.propagate
    finally:
        for name in logs.PACKAGES:
            logger = logging.getLogger(name)
            logger.handlers[:] = before[name]
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
    assert logs.one_line("a\nb\x00c") == "a\\x0ab\\x00c"  # one line, and what it holds visible


# ---- inputs ---------------------------------------------------------------------------------------------------
def test_a_deck_file_is_checked_before_it_is_parsed():
    with pytest.raises(DeckError, match="nests more than 8 levels deep"):
        read_deck(b"[" * 100_000, PAGES)  # json.loads raised RecursionError
    with pytest.raises(DeckError, match="nests more than 8"):
        read_deck(b'{"format": "tformer-deck", "slides": ' + b'{"a": ' * 20 + b"1" + b"}" * 21, PAGES)
    with pytest.raises(DeckError, match="kB; a deck of 50 slides takes at most"):
        read_deck(b" " * (MAX_DECK_BYTES + 1), PAGES)
    with pytest.raises(DeckError, match="not a text file"):
        read_deck(b"\xff\xfe", PAGES)
    with pytest.raises(DeckError, match="slides for pages this app does not have: nope"):
        read_deck(b'{"format": "tformer-deck", "slides": [{"page": "nope", "query": ""}]}', PAGES)
    deck = b'{"format": "tformer-deck", "slides": [{"page": "text", "title": "[\\"x", "query": "head=3"}]}'
    assert read_deck(deck, PAGES) == [{"page": "text", "title": '["x', "query": "head=3"}]  # brackets in strings


def test_numbers_past_float64s_range_in_a_link_are_named_and_no_caption_says_what_is_false():
    at = run("step_by_step", e_X="1,0,1e308,0;0,2,0,2;1,1,1,1")
    no_exception(at)
    errors = messages(at, "error")
    assert any(e.startswith("V overflowed: 1 number is not finite (row 0 (I), column 3 = +inf)") for e in errors)
    assert any(e.startswith("QKᵀ overflowed") for e in errors), errors
    assert not [c for c in messages(at, "caption") if "Each row sums to 1" in c]
    assert "QKᵀ overflowed (see the message above): the scores, the weights and Z are not shown." in messages(
        at, "info"
    )


def test_a_bad_padding_in_a_link_says_which_default_it_used():
    at = run("step_by_step", pad="x")
    no_exception(at)
    assert "pad=x is not a valid value; using none" in link_line(at)


def test_the_distance_pages_link_says_what_it_replaced_and_left_out():
    at = run("attention_distance", timeout=240, text_model="someone/not-offered", samples="nope,photo: cat")
    no_exception(at)
    line = link_line(at)
    assert "text_model=someone/not-offered is not one of the choices here; using minilm" in line
    assert "samples: left out nope (not offered here)" in line
    assert at.selectbox(key="mad.text_model").value == "minilm"


def test_a_nul_in_a_model_id_is_shown_escaped_never_raw():
    at = run("text_attention", model="bert\x00<b>x</b>")
    no_exception(at)
    texts = [e.value for kind in ("error", "info", "warning", "markdown", "caption") for e in at.get(kind)]
    assert not [t for t in texts if "\x00" in t]
    assert any("bert\\x00<b>x</b>" in m and "control characters" in m for m in messages(at, "error"))


# ---- memory: what sessions hold shares the results' budget -------------------------------------------------------
def test_bytes_held_elsewhere_share_the_budget():
    held = {"bytes": 0}
    cache = ByteBudgetCache("t", 100, weigh=lambda v: v, shared=lambda: held["bytes"])
    for key in "abc":
        cache.get_or_compute(key, lambda: 30)
    assert cache.stats().used_bytes == 90
    held["bytes"] = 40  # the sessions' uploads grew: the cache keeps what fits beside them (60 bytes)
    cache.get_or_compute("d", lambda: 30)
    assert cache.stats().used_bytes == 60 and cache.peek("d") == 30 and cache.peek("c") == 30
    assert cache.peek("a") is None and cache.peek("b") is None
    held["bytes"] = 500  # more than the budget: the most recent result is still kept (it is in use)
    cache.get_or_compute("e", lambda: 10)
    assert cache.stats().entries == 1 and cache.peek("e") == 10
    assert np.isclose(cache.trim(), 0)
