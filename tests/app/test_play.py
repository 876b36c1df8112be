"""tformer_app.play.PlayTimer: the play button's state machine, driven tick by tick with a clock the test
moves (nothing waits)."""

from tformer_app.play import PlayTimer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def timer(state: dict, n_steps: int = 3) -> tuple[PlayTimer, Clock]:
    clock = Clock()
    return PlayTimer(state, "s2s", "s2s.step", n_steps, seconds=1.0, clock=clock), clock


def test_playing_advances_one_step_per_tick_and_stops_at_the_end():
    state = {"s2s.step": 1}
    t, clock = timer(state)
    assert not t.playing and not t.tick() and state["s2s.step"] == 1  # paused: reruns move nothing
    t.toggle()
    assert t.playing and state["s2s.played_at"] == 100.0
    clock.now += 0.5
    assert not t.tick() and state["s2s.step"] == 1  # another widget's rerun, between ticks
    clock.now += 0.5
    assert not t.tick() and state["s2s.step"] == 2 and state["s2s.played_at"] == 101.0
    clock.now += 0.9  # a timer that fires a little early still counts
    assert not t.tick() and state["s2s.step"] == 3
    clock.now += 1.0
    assert t.tick()  # the last step: it stops, and says so once
    assert not t.playing and state["s2s.step"] == 3
    clock.now += 1.0
    assert not t.tick() and state["s2s.step"] == 3


def test_play_at_the_end_starts_from_the_first_step_and_pause_holds_the_step():
    state = {"s2s.step": 3}
    t, clock = timer(state)
    t.toggle()
    assert t.playing and state["s2s.step"] == 1
    clock.now += 1.0
    t.tick()
    t.toggle()  # pause at step 2
    clock.now += 5.0
    assert not t.playing and not t.tick() and state["s2s.step"] == 2
    t.toggle()  # play again from where it was, the tick clock restarted
    assert state["s2s.step"] == 2 and not t.tick()


def test_a_single_step_has_nothing_to_play():
    state = {"s2s.step": 1, "s2s.playing": True}
    t, _ = timer(state, n_steps=1)
    assert not t.playing
