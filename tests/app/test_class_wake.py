"""Waking a student's page (tformer_app.class_wake) runs its poll and nothing else: a click of the student's that
waits to run keeps its values, and the run is for the page the session drew last, not the one its browser's last
request named (a run for that page cleared the page on screen). Streamlit's own request queue (ScriptRequests)
takes the requests here, as the session's script runner does; the session around it holds only what the wake
reads of a real one (its last client state, its pages, its fragments).

The whole path, in a real server and real browsers, is tests/browser/test_class_follow.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.proto.WidgetStates_pb2 import WidgetState, WidgetStates
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData, ScriptRequests

from tformer_app import class_wake


class Runner:
    """A script runner's request side: Streamlit's ScriptRequests (a run is under way: requests wait in it)."""

    def __init__(self) -> None:
        self.requests = ScriptRequests()

    def request_rerun(self, data: RerunData) -> bool:
        return self.requests.request_rerun(data)


@dataclass
class Pages:
    current_page_script_hash: str


@dataclass
class Session:
    _client_state: ClientState
    _pages_manager: Pages
    _scriptrunner: Runner | None
    fragments: set[str] = field(default_factory=set)
    created: list[RerunData] = field(default_factory=list)

    def has_fragment(self, fragment: str) -> bool:
        return fragment in self.fragments

    def _create_scriptrunner(self, data: RerunData) -> None:
        self.created.append(data)


def head_widget(value: int) -> WidgetStates:
    states = WidgetStates()
    states.widgets.append(WidgetState(id="text.head", int_value=value))
    return states


def last_request(page: str) -> ClientState:
    state = ClientState(query_string="layer=2&head=1", page_script_hash=page)
    state.widget_states.CopyFrom(head_widget(1))
    return state


def test_a_wake_runs_the_poll_for_the_page_on_screen_and_keeps_a_waiting_click():
    runner = Runner()
    session = Session(last_request("text-page"), Pages("vision-page"), runner, fragments={"poll"})
    click = RerunData(query_string="layer=2&head=5", widget_states=head_widget(5), page_script_hash="vision-page")
    assert runner.requests.request_rerun(click)  # the student's click, waiting for the run under way

    class_wake._run_fragment(session, "poll")
    queued = runner.requests._rerun_data
    assert [(w.id, w.int_value) for w in queued.widget_states.widgets] == [("text.head", 5)]  # the click's value
    assert queued.page_script_hash == "vision-page"
    assert not session.created


def test_a_wake_with_nothing_waiting_asks_for_the_poll_alone_without_widget_values():
    runner = Runner()
    session = Session(last_request("text-page"), Pages("vision-page"), runner, fragments={"poll"})
    class_wake._run_fragment(session, "poll")
    queued = runner.requests._rerun_data
    assert queued.fragment_id_queue == ["poll"] and queued.widget_states is None  # the session's values stay
    assert queued.page_script_hash == "vision-page" and queued.is_auto_rerun

    idle = Session(last_request("text-page"), Pages("text-page"), None, fragments={"poll"})
    class_wake._run_fragment(idle, "poll")  # no run under way: a runner is made for the poll
    assert [(d.fragment_id, d.widget_states, d.page_script_hash) for d in idle.created] == [("poll", None, "text-page")]

    gone = Session(last_request("text-page"), Pages("text-page"), None, fragments=set())
    class_wake._run_fragment(gone, "poll")  # the page ran without its poll since (the student left the class)
    assert not gone.created


def test_outside_a_server_nothing_is_woken_and_the_bookkeeping_is_bounded():
    assert class_wake.wake("no-such-class") == 0
    assert class_wake.watched("no-such-class") == 0
