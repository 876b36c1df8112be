"""What Streamlit keeps for each browser session outside tformer's caches: its uploads and the pictures it was
sent. `held_bytes()` counts them (the results cache shares TFORMER_CACHE_MB with them); `release_ended()`
gives back those of sessions that have ended.

Why: Streamlit (1.67) keeps a closed tab's session for `server.disconnectedSessionTTL` (2 minutes) so that it
can be resumed, then drops it from its session storage without shutting it down. Shutting down is what
removes a session's uploaded files and media, so every photo a student ever uploaded stayed in the process's
memory (4.5 MB for a 12-megapixel JPEG, plus the pictures drawn from it) until the server was restarted.
Worse, an expired session is dropped from that storage only when another one is saved there (the next tab
closed): the last tabs of a class stayed alive after the class, and their widgets' values kept their uploads
even after those were handed back (about 110 MB after 160 photos). A sweeper thread looks for sessions Streamlit
no longer knows (neither connected nor waiting to be resumed) every SWEEP_S seconds (or a quarter of that resume
window, when it is shorter), deletes them from the storage and hands their files back; a session is released
only when two sweeps in a row miss it, so one that is being resumed at that moment is never touched. Every
session that ended since the last sweep, released here or dropped by Streamlit (`departed`), is reported to the
caches, which collect what its state left in reference cycles.

This reads Streamlit's runtime (its session manager, upload and media managers): the one place that does.
`tests/app/test_sessions.py` fails if a Streamlit upgrade changes what it relies on.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from . import logs

SWEEP_S = 30.0  # ended sessions are released, and the caches fitted beside the sessions, this often
# Departures are looked for this often: what an ended session's state left in reference cycles waits at most this
# long for the collection that frees it. At 30 s, a class uploading photos kept up to 145 MB of them beyond the
# budget (benchmarks/memory.py); a look costs microseconds, a collection 0.2 s, only after sessions ended.
LOOK_S = 10.0

_missing_before: set[str] = set()
_watched: dict[str, weakref.ref] = {}  # session id -> its AppSession, while it is alive
_released: set[str] = set()  # watched sessions already released (their objects still alive)
_seen: set[str] = set()  # every session id known_sessions() returned since the last sweep
_lock = threading.Lock()
_sweeper: threading.Thread | None = None


def _runtime():  # streamlit.runtime.Runtime, or None outside a running server (AppTest runs a mock of one)
    from streamlit.runtime import Runtime

    runtime = Runtime.instance() if Runtime.exists() else None
    return runtime if type(runtime) is Runtime else None


def known_sessions() -> set[str] | None:
    """Ids of the sessions Streamlit knows: connected, or disconnected and still resumable; None without a server.
    Each is watched (a weak reference) so that `counts` can tell whether it is gone once it has ended."""
    runtime = _runtime()
    if runtime is None:
        return None
    infos = runtime._session_mgr.list_sessions()
    ids = {info.session.id for info in infos}
    with _lock:
        for info in infos:
            _watched.setdefault(info.session.id, weakref.ref(info.session))
        _seen.update(ids)
    return ids


def departed() -> int:
    """How many sessions Streamlit has let go of since the last call (the sweeper's), whoever dropped them.

    Why: most sessions a class ends are not released by this module. While tabs keep closing, each one saved
    for resuming makes Streamlit's storage drop the expired ones (and the least recently used beyond 128);
    a dropped session's object dies at once, its uploads with it, so the sweeper never sees it. Its widget
    state, though, is a web of reference cycles that still holds the bytes of what was uploaded: 160 MB of a
    class's photos (14,500 objects) that no budget counted, until Python's full collection got round to it."""
    known = known_sessions()
    if known is None:
        return 0
    with _lock:
        gone = _seen - known
        _seen.clear()
        _seen.update(known)
    return len(gone)


def _prune() -> None:
    """Forget the watched sessions whose objects are gone (under _lock)."""
    for session_id in [i for i, ref in _watched.items() if ref() is None]:
        del _watched[session_id]
        _released.discard(session_id)


@dataclass(frozen=True)
class SessionCounts:
    connected: int
    resumable: int  # closed tabs Streamlit keeps for server.disconnectedSessionTTL
    ended_in_memory: int  # ended sessions (seen by this module) whose objects are still alive: their state leaks


def counts() -> SessionCounts | None:
    """How many sessions this server holds, for its operator (None without a server)."""
    runtime = _runtime()
    known = known_sessions()
    if runtime is None or known is None:
        return None
    connected = len(runtime._session_mgr.list_active_sessions())
    with _lock:
        _prune()
        lingering = sum(1 for session_id in _watched if session_id not in known)
    return SessionCounts(connected, len(known) - connected, lingering)


def _holders() -> set[str]:
    """Ids of the sessions that hold uploads or media references."""
    runtime = _runtime()
    uploads = runtime.uploaded_file_mgr
    media = runtime.media_file_mgr
    holders = set(getattr(uploads, "file_storage", {}))
    holders |= set(media._files_by_session_and_coord)
    return holders


def release_ended() -> int:
    """Give back the uploads and media of sessions Streamlit has forgotten (missed by two calls in a row);
    returns how many sessions were released."""
    runtime = _runtime()
    known = known_sessions()
    if runtime is None or known is None:
        return 0
    with _lock:
        _prune()
        gone = (_holders() | set(_watched)) - known - _released
        ended = gone & _missing_before
        _missing_before.clear()
        _missing_before.update(gone - ended)
        # Released once: an object still alive after that is counted (`counts`), not released again.
        _released.update(ended & set(_watched))
    storage = runtime._session_mgr._session_storage
    for session_id in ended:
        # Streamlit drops an expired session from its storage only when another session is saved there (the next
        # tab closed); until then the session, its widgets' values and with them its uploads stay alive.
        with contextlib.suppress(KeyError):
            storage.delete(session_id)
        runtime.uploaded_file_mgr.remove_session_files(session_id)
        runtime.media_file_mgr.clear_session_refs(session_id)
        runtime.dataframe_source_mgr.clear_all_for_session(session_id)
    if ended:
        runtime.media_file_mgr.remove_orphaned_files()
        logs.log.info("released the uploads and media of %d ended session(s)", len(ended))
    return len(ended)


_hidden: set[str] = set()  # closed tabs whose media were withdrawn (`withdraw_media`), until they return or end
_withdrawn_last = False  # the last call withdrew media: this one finishes deleting its downloads
MEDIA_LOOK_S = 1.0  # how long a closed tab's pictures and downloads stay reachable by their addresses, at most


def withdraw_media() -> int:
    """Withdraw the media (pictures sent, downloads) of the sessions whose tab is closed: their addresses answer
    404 from now on. A session that comes back (its tab reconnects within Streamlit's resume window) runs its page
    again, which sends them anew. Returns how many sessions were withdrawn now.

    Why at once: a picture's address (/media/<id>.jpg) is served to any client that has it, without a cookie; a
    student's photo stayed reachable for Streamlit's resume window and two sweeps (about 150 s) after the tab
    closed. The sweeper calls this every MEDIA_LOOK_S; the files go when no other session shows the same picture
    (a download's at the next call: Streamlit deletes it in two steps)."""
    runtime = _runtime()
    if runtime is None:
        return 0
    manager = runtime._session_mgr
    # The known sessions before the active ones: a tab that opens between the two reads is then active and not
    # yet known (left alone), not known and not yet active (taken for a closed tab, and a second later for one
    # that came back: its page was run again with what its browser had sent then, its first message, which came
    # in the middle of its first runs and left the Model box showing the list's first model; the next click ran
    # that model: the browser tests' heads page opened on the translator switched to smollm2, 1 run in 3).
    known = {info.session.id for info in manager.list_sessions()}
    active = {info.session.id: info.session for info in manager.list_active_sessions()}
    with _lock:
        closed = known - set(active) - _hidden
        back = _hidden & set(active)
        _hidden.difference_update(back | (_hidden - known))
        _hidden.update(closed)
    for session_id in closed:
        runtime.media_file_mgr.clear_session_refs(session_id)
    for session_id in back:  # its page still shows what was withdrawn: draw it again, as its last run did
        logs.log.info("a closed tab came back: its page is run again to send its pictures and downloads anew")
        _rerun_as_last(active[session_id])
    global _withdrawn_last
    if closed or _withdrawn_last:  # Streamlit deletes a download in two calls: this one and the next
        runtime.media_file_mgr.remove_orphaned_files()
        logs.log.debug("withdrew the media of %d closed tab(s)", len(closed))
    _withdrawn_last = bool(closed)
    return len(closed)


def _rerun_as_last(session) -> None:
    """Run `session`'s page again with what its browser sent last (its page, address and widgets), as Streamlit
    does itself when a source file changes (its request_rerun(None) would run the default page instead). A run of
    one fragment is run as the whole page."""
    from streamlit.proto.ClientState_pb2 import ClientState

    state = ClientState()
    state.CopyFrom(session._client_state)
    state.fragment_id, state.is_auto_rerun = "", False
    session.request_rerun(state)


# What a session Streamlit holds costs beyond its files (its script runner and thread, widget states, messages):
# 113 MB for 102 sessions (3 open, 99 closed tabs kept to be resumed) after a class's 160 photos, over the
# process's level after warm-up (benchmarks/memory.py). Counted per session so the results make room for them.
SESSION_BYTES = 2**20


def held_bytes() -> int:
    """Bytes the sessions hold now: their uploads and media, and SESSION_BYTES for each session Streamlit keeps
    (connected, or closed and resumable); 0 outside a running server."""
    runtime = _runtime()
    known = known_sessions()
    if runtime is None or known is None:
        return 0
    total = SESSION_BYTES * len(known)
    for provider in (runtime.uploaded_file_mgr, runtime.media_file_mgr._storage):
        for stats in provider.get_stats().values():
            total += sum(stat.byte_length for stat in stats)
    return total


def start_sweeper(after: Callable[[int, bool], None] | None = None) -> None:
    """Start the sweeper thread once per process: `sweep_once` every look_interval(), a full sweep every
    sweep_interval(); after(n, full) is called after each (the caches free what ended sessions left, and on a
    full sweep fit the results and hand memory back)."""
    global _sweeper
    with _lock:
        if _sweeper is not None:
            return
        _sweeper = threading.Thread(target=_sweep_forever, args=(after,), name="tformer-sessions", daemon=True)
        _sweeper.start()


def sweep_interval() -> float:
    """Seconds between sweeps: SWEEP_S, or a quarter of Streamlit's resume window when that is shorter."""
    from streamlit import config

    return min(SWEEP_S, max(0.25, float(config.get_option("server.disconnectedSessionTTL")) / 4))


def look_interval() -> float:
    """Seconds between looks for sessions that ended: LOOK_S, or sweep_interval() when that is shorter."""
    return min(LOOK_S, sweep_interval())


# Held by the sweeper for each of its ticks (its look for closed tabs, and its sweeps): whoever must see the
# sessions and the process's memory accounting hold still (a test that drives memory.GiveBack's sweeps, or sweeps
# of its own made-up sessions, by hand) holds it too, and the sweeper waits.
SWEEPING = threading.Lock()

MAX_FAILED_SWEEPS = 10  # in a row: Streamlit works differently from what this module reads; stop trying


def sweep_once(after: Callable[[int, bool], None] | None = None, full: bool = True) -> int:
    """Look for the sessions that ended since the last look (released now on a full sweep, or let go of by
    Streamlit itself: `departed`), then after(n, full), n their number. Returns n."""
    ended = (release_ended() if full else 0) + departed()
    if after is not None:
        after(ended, full)
    return ended


def _sweep_forever(after: Callable[[int, bool], None] | None) -> None:
    wake, look, every, failed = threading.Event(), look_interval(), sweep_interval(), 0
    tick = min(MEDIA_LOOK_S, look)
    ticks_per_look, looks_per_sweep, ticked = max(1, round(look / tick)), max(1, round(every / look)), 0
    while not wake.wait(tick):
        ticked += 1
        try:
            with SWEEPING:
                withdraw_media()
                if ticked % ticks_per_look == 0:
                    sweep_once(after, full=(ticked // ticks_per_look) % looks_per_sweep == 0)
            failed = 0
        except Exception as error:  # a list changed while it was read (the next sweep reads it again), or worse
            failed += 1
            if failed == 1 or failed == MAX_FAILED_SWEEPS:
                stops = " (the sweeper stops: closed sessions' uploads are no longer released)"
                logs.bug("releasing ended sessions" + (stops if failed == MAX_FAILED_SWEEPS else ""), error)
            if failed == MAX_FAILED_SWEEPS:
                return
