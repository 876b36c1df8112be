"""Waking the students' pages the moment their class moves, instead of at their next poll.

    class_wake.watch(sid)     # in the student's poll (a fragment): this session wants to hear when `sid` moves
    class_wake.forget()       # the student left the class: stop waking this session
    class_wake.wake(sid)      # the class moved (a view, a question, a reveal, its end): run their polls now

A student's page polls its class every few seconds (tformer_app.class_session._watch, a fragment). Polling alone
made a follow wait for the next poll (on average half its period, plus the lecturer's whole run before the view
was published); polling faster costs every student's server time all lecture long. So the store tells every
server process when a class moved (tformer_app.class_store: in this process, or over Redis's pub/sub to every
replica), and each process runs the poll fragment of its own students of that class at once, as if their browsers
had asked: the fragment reads the new version and opens the lecturer's view. The poll stays, slower, for what a
wake can miss (a replica whose Redis connection was down a moment).

Streamlit offers no public way for the server to start a session's run; this asks the session's script runner
for a run of the one fragment, as the browser's timer does, on the session's event loop (`_run_fragment`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("tformer_app")

_lock = threading.Lock()
_watching: dict[str, dict[str, str]] = {}  # class sid -> {Streamlit session id: its poll fragment's id}


def watch(sid: str) -> None:
    """Call inside the poll fragment: a move of class `sid` runs this fragment of this session at once."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    fragment = _fragment_id()
    if ctx is None or not fragment:
        return
    with _lock:
        for other, sessions in list(_watching.items()):  # one class per session: a join elsewhere leaves the last
            if other != sid and sessions.pop(ctx.session_id, None) is not None and not sessions:
                del _watching[other]
        _watching.setdefault(sid, {})[ctx.session_id] = fragment


def _fragment_id() -> str | None:
    """The id of the fragment running now (Streamlit keeps it in its thread state since 1.5x), or None."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState

        return ThreadState.get().fragment_id
    except (ImportError, RuntimeError):  # an older Streamlit: on the run's context
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        return getattr(get_script_run_ctx(), "current_fragment_id", None)


def forget() -> None:
    """This session left its class (or was told it ended): no more wakes for it."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return
    with _lock:
        for sid, sessions in list(_watching.items()):
            if sessions.pop(ctx.session_id, None) is not None and not sessions:
                del _watching[sid]


def watched(sid: str) -> int:
    """How many sessions of this process wait on class `sid`."""
    with _lock:
        return len(_watching.get(sid, {}))


def wake(sid: str) -> int:
    """Run the poll fragment of every session of this process that watches class `sid`; returns how many were
    woken. A session that closed is forgotten here (its tab is gone; a resumed tab polls and watches again)."""
    with _lock:
        sessions = dict(_watching.get(sid, {}))
    if not sessions:
        return 0
    try:
        from streamlit import runtime

        manager = runtime.get_instance()._session_mgr
    except Exception as error:  # not in a running server (a test's AppTest, a script): the poll does it
        log.debug("class %s moved; no server to wake sessions in (%s)", sid, error)
        return 0
    woken, gone = 0, []
    for session_id, fragment in sessions.items():
        info = manager.get_active_session_info(session_id)
        if info is None:
            gone.append(session_id)
            continue
        try:
            _run_fragment(info.session, fragment)
            woken += 1
        except Exception:  # one session's failure must not keep the others waiting: its poll still comes
            log.exception("class %s: waking a student's page failed", sid)
    if gone:
        with _lock:
            left = _watching.get(sid, {})
            for session_id in gone:
                left.pop(session_id, None)
            if not left:
                _watching.pop(sid, None)
    return woken


def _run_fragment(session: Any, fragment: str) -> None:
    """Ask Streamlit's `session` (an AppSession) for a run of `fragment`, as its browser's timer would, from any
    thread. No widget states go with it: the session's own stay as they are, and a click of the student's still
    waiting to run is merged with this run, not overwritten (AppSession.request_rerun takes a whole ClientState,
    and the browser's last one may be older than that click)."""
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

    last = session._client_state  # its page and address as its browser sent them last

    def request() -> None:
        if not session.has_fragment(fragment):  # the page ran without its poll (the student left the class)
            return
        data = RerunData(
            query_string=last.query_string,
            # The page the session's last run drew (its browser's last request may be older than a page the
            # class opened since: a run for that page would clear the page on screen).
            page_script_hash=getattr(session._pages_manager, "current_page_script_hash", last.page_script_hash),
            page_name=last.page_name,
            fragment_id=fragment,
            is_auto_rerun=True,
            context_info=last.context_info if last.HasField("context_info") else None,
        )
        runner = session._scriptrunner
        if runner is None or not runner.request_rerun(data):
            session._create_scriptrunner(data)

    loop = getattr(session, "_event_loop", None)
    if loop is not None and loop.is_running():
        loop.call_soon_threadsafe(request)
    else:
        request()
