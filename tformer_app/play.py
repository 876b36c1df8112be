"""A play button that steps through 1..n by itself, one step per tick of a timer (the encoder-decoder page's
decoding steps), and the small state machine behind it.

    timer = PlayTimer(st.session_state, "s2s", step_key="s2s.step", n_steps=5)
    timer.toggle()          # the button: play (from step 1 when at the end) or pause
    stopped = timer.tick()  # a rerun: one step on when a tick is due; True when it just stopped at the end

    play_through(url, step_key, n_steps, draw)   # the button, the slider and draw(step) under a timer

Ticks are told apart from other reruns by the time since the last one (kept in the session), so a rerun
caused by another widget while playing does not move the step; the clock is a parameter, so tests drive
ticks without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from typing import Any, cast

import streamlit as st

from . import presenter
from .url import UrlState

PLAY_SECONDS = 1.2  # one step per this many seconds while playing
DUE = 0.9  # a rerun this far into the interval is the timer's tick (a timer fires a little early or late)


class PlayTimer:
    """Playing or paused, the step (1-based, in `state[step_key]`) and the time of the last tick, in `state`
    (a session's state) under "<page>.playing" and "<page>.played_at"."""

    def __init__(
        self,
        state: MutableMapping[str, Any],
        page: str,
        step_key: str,
        n_steps: int,
        seconds: float = PLAY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state, self.step_key, self.n_steps = state, step_key, n_steps
        self.seconds, self.clock = seconds, clock
        self.playing_key, self.at_key = f"{page}.playing", f"{page}.played_at"

    @property
    def playing(self) -> bool:
        """Playing, with something to play (a single step has nothing to advance to)."""
        return bool(self.state.get(self.playing_key, False)) and self.n_steps > 1

    def toggle(self) -> None:
        """Play or pause; playing from the last step starts again from step 1. The tick clock starts now."""
        playing = not self.state.get(self.playing_key, False)
        self.state[self.playing_key] = playing
        if playing and self.state[self.step_key] >= self.n_steps:
            self.state[self.step_key] = 1  # play from the start
        self.state[self.at_key] = self.clock()

    def tick(self) -> bool:
        """One step on when playing and a tick is due; at the last step, stop instead. Returns True when it
        stopped now (the whole page should then run again, so that its timer stops)."""
        if not self.state.get(self.playing_key):
            return False
        if self.clock() - self.state.get(self.at_key, 0.0) < self.seconds * DUE:
            return False  # another widget's rerun, not a timer tick
        self.state[self.at_key] = self.clock()
        if self.state[self.step_key] < self.n_steps:
            self.state[self.step_key] += 1
            return False
        self.state[self.playing_key] = False
        return True


def play_through(url: UrlState, step_key: str, n_steps: int, draw: Callable[[int], None], help: str = "") -> None:
    """A ▶ Play / ⏸ Pause button, the step slider (`help` under it) and `draw(step)` (1-based).

    Playing, only this section reruns, once per tick (a fragment with a timer); otherwise moving the slider
    reruns the page, so the link and the views that follow the step are updated too.
    """
    timer = PlayTimer(cast(MutableMapping[str, Any], st.session_state), url.page, step_key, n_steps)
    playing = timer.playing
    keys = presenter.keys_place()  # presenter mode: beside the step keys, on the line below the title
    (keys if keys is not None else st).button(
        "⏸ Pause" if playing else "▶ Play",
        key=f"{url.page}.play",
        on_click=url.callback(timer.toggle),
        disabled=n_steps < 2,
        help=f"Advance one decoding step every {timer.seconds:.1f} s",
    )

    def steps() -> None:
        if timer.tick():
            st.rerun()  # the whole page, so the timer stops
        if n_steps > 1:
            st.slider("Step", 1, n_steps, key=step_key, help=help)
        draw(int(st.session_state[step_key]))

    if playing:
        st.fragment(steps, run_every=timer.seconds)()
    else:
        steps()
