"""Who may see the "Memory and caches" page: whoever runs the server, never a student.

The page is served only when TFORMER_ADMIN=1 and TFORMER_ADMIN_TOKEN holds a secret of at least 16 characters;
it is left out of the sidebar (reached at /server) and asks for the secret before it shows anything. The
secret typed is compared in constant time (hmac.compare_digest). Guesses are counted per client address and in
all, in the class store (shared by the replicas), before the secret is checked: an address that gave
WRONG_PER_ADDRESS wrong tokens in a minute is not checked again until the minute is over, whatever number of
sessions it opens (one each once WRONG_OVERALL were given from every address together); the log has one line per
address and minute, not one per try. No thread waits: a guesser's sessions and everyone else's go on.
A session that gave it keeps access until it ends.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

import streamlit as st

from . import settings
from .class_session import client_address
from .class_store import MemoryBackend, open_store
from .throttle import Guesses, Locked

log = logging.getLogger("tformer_app")
GRANTED = "_tformer.admin.granted"  # session state: this session gave the secret
TYPED = "_tformer.admin.token"
CHECKED = "_tformer.admin.checked"  # a digest of the wrong token this session gave last (a rerun is no new guess)
WRONG_PER_ADDRESS = 3  # wrong tokens a minute from one address
WRONG_OVERALL = 10  # and from every address together (then one each)
GUESSES = Guesses(
    "wrong admin tokens",
    per_client=WRONG_PER_ADDRESS,
    overall=WRONG_OVERALL,
    window_s=60,
    counters=lambda: open_store().backend,
    fallback=MemoryBackend(),
)


def served() -> bool:
    """Whether the page exists on this server (TFORMER_ADMIN=1 with a token; without one, a log line says why)."""
    if not settings.value("TFORMER_ADMIN"):
        return False
    if settings.value("TFORMER_ADMIN_TOKEN") is None:
        _without_token()
        return False
    return True


_said = False


def _without_token() -> None:
    global _said
    if not _said:
        _said = True
        log.warning("TFORMER_ADMIN=1 without a TFORMER_ADMIN_TOKEN (16 characters or more): the page is not served")


def matches(typed: str, token: str | None) -> bool:
    """Whether `typed` is the token, compared in constant time (no early exit on the first wrong character)."""
    return token is not None and hmac.compare_digest(typed.encode("utf-8"), token.encode("utf-8"))


def granted() -> bool:
    """True when this session may see the page; else draws the secret's box (and says when it was wrong)."""
    if st.session_state.get(GRANTED):
        return True
    typed = st.text_input("Admin token", type="password", key=TYPED, help="TFORMER_ADMIN_TOKEN, as the server has it")
    if not typed:
        st.info("This page is for whoever runs the server: give the token set in TFORMER_ADMIN_TOKEN.")
        return False
    digest = hashlib.sha256(typed.encode("utf-8")).hexdigest()
    if st.session_state.get(CHECKED) == digest:  # the page ran again with the same wrong token: no new guess
        st.error("That is not the token.")
        return False
    try:
        attempt = GUESSES.begin(client_address() or "this machine")
    except Locked as locked:
        st.error(f"Too many wrong tokens from your address: try again in {locked.wait_s:.0f} s.")
        return False
    if matches(typed, settings.value("TFORMER_ADMIN_TOKEN")):
        GUESSES.right(attempt)
        st.session_state[GRANTED] = True
        return True
    GUESSES.wrong(attempt)
    st.session_state[CHECKED] = digest
    st.error("That is not the token.")
    return False
