"""Who may see the "Memory and caches" page: whoever runs the server, never a student.

The page is served only when TFORMER_ADMIN=1 and TFORMER_ADMIN_TOKEN holds a secret of at least 16 characters;
it is left out of the sidebar (reached at /server) and asks for the secret before it shows anything. The
secret typed is compared in constant time (hmac.compare_digest); a wrong one costs a second and a log line.
A session that gave it keeps access until it ends.
"""

from __future__ import annotations

import hmac
import logging
import time

import streamlit as st

from tformer_core import settings

log = logging.getLogger("tformer_app")
GRANTED = "_tformer.admin.granted"  # session state: this session gave the secret
TYPED = "_tformer.admin.token"
WRONG_TOKEN_DELAY_S = 1.0


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
    if matches(typed, settings.value("TFORMER_ADMIN_TOKEN")):
        st.session_state[GRANTED] = True
        return True
    log.warning("a wrong admin token was given")
    time.sleep(WRONG_TOKEN_DELAY_S)  # one guess a second per session, and the log shows them
    st.error("That is not the token.")
    return False
