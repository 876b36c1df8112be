"""The server's log, configured in this one place: one logger per package (tformer_core, tformer_views,
tformer_app), written to the server's standard error at TFORMER_LOG_LEVEL (default INFO).

    logs.configure()                               # app.py, every run; acts once per process
    logs.failure("loading bert-base-uncased", e)   # a message a user was shown: one line with its cause
    note_id = logs.bug("Picture", e)               # anything else: an id the page shows, the traceback logged

Every failure a user is shown as a message gets one line here: what was done (with the model id or the file),
the exception's type and message, and the exception it was written for (its cause: the OSError, the
hub's error, the JSON error); the traceback follows at DEBUG level. A bug gets an ERROR line with an id the
page shows, and its traceback.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import uuid

from . import settings
from .markdown import escape

PACKAGES = ("tformer_core", "tformer_views", "tformer_app")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("tformer_app")

_configured = False
_lock = threading.Lock()
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def configure() -> None:
    """Give each package's logger a handler to standard error at TFORMER_LOG_LEVEL, once per process, and read
    every setting once (bad values and unknown TFORMER_ names are logged then)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        level = settings.value("TFORMER_LOG_LEVEL")
        for name in PACKAGES:
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = False  # Streamlit's own root configuration would print each line twice
    settings.check_environment()


def one_line(text: object, limit: int = 300) -> str:
    """Text for a log line: control characters (newlines, NUL, terminal escapes) written as \\xNN, cut to `limit`."""
    shown = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {one_line(error)}"


def cause_of(error: BaseException) -> BaseException | None:
    """The exception `error` was raised for (raise ... from cause, or raised while handling it)."""
    return error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def failure(what: str, error: BaseException, logger: logging.Logger = log) -> None:
    """One WARNING line for a failure shown to a user: what was done, the error, its cause; the traceback at DEBUG."""
    cause = cause_of(error)
    because = f" (cause: {_described(cause)})" if cause is not None else ""
    logger.warning("%s failed: %s%s", one_line(what, 200), _described(error), because)
    logger.debug("%s: traceback", one_line(what, 200), exc_info=(type(error), error, error.__traceback__))


def bug(what: str, error: BaseException, logger: logging.Logger = log) -> str:
    """An ERROR line and the traceback for an exception that is not the user's doing; returns the id the page
    shows, so that a student's report and the operator's log can be matched."""
    note_id = uuid.uuid4().hex[:8]
    trace = (type(error), error, error.__traceback__)
    logger.error("bug %s in %s: %s", note_id, one_line(what, 200), _described(error), exc_info=trace)
    return note_id


class ReportedBug(Exception):
    """A bug already logged with its traceback (by the thread that met it, e.g. a worker of tformer_app.work):
    a page that shows it shows its id, `note_id`, and logs nothing more."""

    def __init__(self, note_id: str) -> None:
        super().__init__(f"bug {note_id}, logged")
        self.note_id = note_id


def bug_note(what: str, note_id: str) -> str:
    """What a page shows for a bug (Markdown): nothing about the input, and the id the server's log has."""
    return (
        f"{escape(what)}: something went wrong on the server (not in what you gave). The rest of the page still "
        f"works; if it happens again, tell whoever runs the server: error {note_id}."
    )
