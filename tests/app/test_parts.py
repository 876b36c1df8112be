"""A part of a page that runs alone (tformer_app.page.part, a Streamlit fragment), on a real server and as a
browser sends its widgets' changes (benchmarks/stclient.py: the fragment's run, not the page's): the Vision page's
"How information flows to the class token". Its settings must still reach the page's link and, in a class
session, the students following the lecturer; a setting the part no longer draws leaves the link; a following
student's own change in it makes them explore on their own (the lecturer's next move does not undo it).

AppTest cannot show this: it runs the whole script for every change, fragments included.
"""

from __future__ import annotations

import re
import time
import urllib.parse

import pytest

from tests.browser.server import streamlit_server

stclient = pytest.importorskip("benchmarks.stclient", reason="benchmarks/stclient.py needs Streamlit's websockets")
FINISHED = pytest.importorskip("streamlit.proto.ForwardMsg_pb2").ForwardMsg.ScriptFinishedStatus

TIMEOUT_S = 240.0  # per action: a busy 2-core machine loading the model on the first run
FOLLOW_S = 60.0  # a student's page follows a lecturer's change within this (woken by the server, else its poll)
PAGE = "/vision?" + urllib.parse.urlencode({"model": "vit-tiny", "sample": "shapes: ring"})
TOGGLE = "Follow the routes to the class token (one more pass)"
BARS = "Where the class token's information sits, layer by layer"


def link(session) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(session.query_string))


def bars(run) -> bool:
    return any(c.get("title") == BARS for c in run.charts())


@pytest.mark.slow
def test_the_vision_flow_runs_alone_and_still_writes_the_link_and_reaches_the_class(tmp_path):
    with streamlit_server(tmp_path / "streamlit.log") as url:
        stclient.run_sync(_lecture(url))


async def _lecture(url: str) -> None:
    async with await stclient.Session.open(url, PAGE, timeout_s=TIMEOUT_S) as lecturer:
        assert not lecturer.last.errors and lecturer.last.widget(TOGGLE, "toggle"), lecturer.last.errors
        assert not bars(lecturer.last)  # the section is folded and its toggle off: nothing computed for it
        started = await lecturer.click("Start a class session")
        assert not started.errors, started.errors
        code = next(c for t in started.texts() for c in _codes(t))
        async with await stclient.Session.open(url, f"/?class={code}", timeout_s=TIMEOUT_S) as student:
            assert await _until(
                student,
                lambda: "Vision Transformer" in student.last.headings() and link(student).get("cls_flow") == "0",
            )

            # The toggle: the part's run alone (the page's picture and attention are not sent again), its own
            # view drawn, the link written and the class told.
            run = await lecturer.set_value(TOGGLE, True, kind="toggle", in_fragment=True)
            assert run.status == FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and not run.errors, run.errors
            assert bars(run) and not any("Attention over the picture" in h for h in run.headings())
            assert link(lecturer)["cls_flow"] == "1" and link(lecturer)["model"] == "vit-tiny"
            assert await _until(student, lambda: link(student).get("cls_flow") == "1" and bars(student.last))

            # A setting the part draws only while toggled: in the link while it is drawn, out of it once it is not.
            run = await lecturer.set_value("Before layer", "1", key="vit.cls_flow_before", in_fragment=True)
            assert run.status == FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and not run.errors, run.errors
            assert link(lecturer)["cls_flow_before"] == "1"
            assert await _until(student, lambda: link(student).get("cls_flow_before") == "1")
            run = await lecturer.set_value(TOGGLE, False, kind="toggle", in_fragment=True)
            assert run.status == FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and not bars(run)
            assert link(lecturer)["cls_flow"] == "0" and "cls_flow_before" not in link(lecturer)
            assert link(lecturer)["sample"] == "shapes: ring"  # the rest of the link stays
            assert await _until(student, lambda: link(student).get("cls_flow") == "0" and not bars(student.last))

            # A following student's own change in the part: they explore on their own from now on (the lecturer's
            # next move must not undo it), as after a change anywhere else on the page.
            assert "**Following the lecturer**" in _sidebar(student.last)
            run = await student.set_value(TOGGLE, True, kind="toggle", in_fragment=True)
            assert run.status == FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY and bars(run)
            layer = link(lecturer)["layer"]
            moved = await lecturer.set_value("Layer", "0" if layer != "0" else "1", key="vit.layer")
            assert not moved.errors and link(lecturer)["layer"] != layer, moved.errors
            page = await student.rerun()  # the student's page runs next (the lecturer's move woke it)
            assert link(student)["cls_flow"] == "1" and link(student)["layer"] == layer  # kept, not followed
            assert "**Exploring on your own**" in _sidebar(page) and page.widget(key="_tformer.class.follow")


def _sidebar(run) -> list[str]:
    return [e.markdown.body for _, e in run.items("markdown", area=1)]


def _codes(text: str) -> list[str]:
    return re.findall(r"code \**([A-Z0-9]{6})\*\*", text)


async def _until(student, condition) -> bool:
    """The student's page as a browser keeps it: the runs the server starts (a lecturer's move wakes it), and the
    class's poll on its timer; True once `condition` holds after a whole run, False after FOLLOW_S."""
    interval, fragment = min((v, k) for k, v in student.auto_reruns.items())
    deadline = time.perf_counter() + FOLLOW_S
    next_poll = time.perf_counter() + interval
    while not (student.last is not None and condition()):
        left = deadline - time.perf_counter()
        if left <= 0:
            return False
        _, next_poll = await student.follow(fragment, interval, next_poll, most_s=left)
    return True
