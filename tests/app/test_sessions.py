"""What a browser session leaves on a real server (`streamlit run app.py`, driven by benchmarks/stclient.py).

- A closed tab's uploads stayed in memory for the life of the process: Streamlit keeps a closed session for
  server.disconnectedSessionTTL to resume it, then forgets it without shutting it down (its uploads and pictures
  with it). tformer_app.sessions counts them in the results' budget and gives them back when the session ends.
- Then Streamlit kept the expired session object (its widgets' values, its uploads with them) until another tab
  closed: the last students' photos stayed after the class. The sweeper deletes it from Streamlit's storage.
- A crafted data-editor message naming a column the table does not have made every later run raise KeyError.

The server's resume window is 2 s here (120 s by default), so the sweeper looks every half second. Every wait
is for a condition (a script run, a figure on the Server page), with a generous limit only to report a failure.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time

import numpy as np
import pytest
from PIL import Image

from tests.browser.server import streamlit_server

stclient = pytest.importorskip("benchmarks.stclient", reason="benchmarks/stclient.py needs Streamlit's websockets")
from streamlit.proto.WidgetStates_pb2 import WidgetState  # noqa: E402

TOKEN = "a-test-token-of-24-chars"
TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"TFORMER_ADMIN": "1", "TFORMER_ADMIN_TOKEN": TOKEN, "STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": "2"}
    with streamlit_server(tmp_path_factory.mktemp("sessions") / "streamlit.log", **env) as url:
        yield url


def picture_png() -> bytes:
    """A 1-megapixel picture of noise: about 3 MB as PNG, so that what the server holds shows in MB."""
    pixels = np.random.default_rng(0).integers(0, 255, (1000, 1000, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


async def held_mb(admin) -> float:
    run = await admin.rerun()
    line = next(t for t in run.texts() if "sessions' uploads" in t)
    return float(re.search(r"each\): ([\d.,]+) MB", line).group(1).replace(",", ""))


async def _uploads_counted_then_released(url: str) -> None:
    admin = await stclient.Session.open(url, "/server", timeout_s=TIMEOUT_S)
    await admin.set_value("Admin token", TOKEN, "text_input")
    before = await held_mb(admin)
    student = await stclient.Session.open(url, "/vision", timeout_s=TIMEOUT_S)
    await student.set_value("Picture", "Upload", "radio")
    label = next(w.label for w in student.last.widgets() if w.kind == "file_uploader" and w.key == "vit.upload")
    run = await student.upload_files(label, [("noise.png", picture_png(), "image/png")])
    assert not run.errors, run.errors
    assert await held_mb(admin) >= before + 2.5  # the upload (and the pictures drawn from it) counted
    await student.close()
    deadline = time.monotonic() + 60
    while (held := await held_mb(admin)) > before + 0.05:
        assert time.monotonic() < deadline, f"{held:.1f} MB still held a minute after the session ended"
        await asyncio.sleep(0.5)
    # The session itself is gone too: its widgets' values held the upload (Streamlit kept an expired session
    # until the next tab closed, and nothing else closes here).
    line = next(t for t in (await admin.rerun()).texts() if t.startswith("Sessions:"))
    assert re.search(r"\b0 ended and still in memory", line), line
    await admin.close()


@pytest.mark.slow
def test_a_closed_sessions_upload_is_counted_then_given_back(server):
    stclient.run_sync(_uploads_counted_then_released(server))


async def _crafted_edits(url: str) -> None:
    async with await stclient.Session.open(url, "/step-by-step", timeout_s=TIMEOUT_S) as session:
        editor = next(e.dataframe for _, e in session.last.items("dataframe") if "step.edit.X." in e.dataframe.id)
        crafted = {"edited_rows": {"0": {"no such column": 5}}, "added_rows": [], "deleted_rows": []}
        session._states[editor.id] = WidgetState(id=editor.id, string_value=json.dumps(crafted))
        run = await session.rerun()
        assert not run.exceptions, run.exceptions  # was: KeyError('no such column'), on this run and every later one
        assert any("Edits that did not fit this table" in t for t in run.texts())
        session._states.pop(editor.id, None)  # the browser does not send them again
        run = await session.rerun()
        assert not run.exceptions and not run.errors
        assert not any("did not fit" in t for t in run.texts()) and "Q, K, V" in run.headings()


@pytest.mark.slow  # a real server
def test_a_crafted_data_editor_message_is_refused_and_the_page_recovers(server):
    stclient.run_sync(_crafted_edits(server))


@pytest.fixture(scope="module")
def resumable_server(tmp_path_factory):
    """Streamlit's own resume window (2 minutes): a closed tab stays resumable throughout these tests."""
    env = {"TFORMER_ADMIN": "1", "TFORMER_ADMIN_TOKEN": TOKEN}
    with streamlit_server(tmp_path_factory.mktemp("resumable") / "streamlit.log", **env) as url:
        yield url


def _status(url: str) -> int:
    """The HTTP status of a GET without cookies: any client that has the address."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


async def _closed_tabs_media_withdrawn_then_resumed(url: str) -> None:
    student = await stclient.Session.open(url, "/vision", timeout_s=TIMEOUT_S)
    await student.set_value("Picture", "Upload", "radio")
    label = next(w.label for w in student.last.widgets() if w.kind == "file_uploader" and w.key == "vit.upload")
    run = await student.upload_files(label, [("mine.png", picture_png(), "image/png")])
    assert not run.errors, run.errors
    own = sorted({url + m for m in run.images() if m.startswith("/media/")})
    assert own and all(_status(m) == 200 for m in own)  # drawn from the student's photo, served by address
    await student.close()  # the tab closes: Streamlit keeps the session 2 minutes, to resume it
    deadline = time.monotonic() + 60
    while any(_status(m) != 404 for m in own):
        assert time.monotonic() < deadline, "a closed tab's pictures still served a minute after it closed"
        await asyncio.sleep(0.2)
    admin = await stclient.Session.open(url, "/server", timeout_s=TIMEOUT_S)
    await admin.set_value("Admin token", TOKEN, "text_input")
    line = next(t for t in (await admin.rerun()).texts() if t.startswith("Sessions:"))
    assert "1 closed and kept to be resumed" in line, line  # withdrawn while resumable, not released
    # The tab comes back (its connection restored): the server draws its page again by itself, pictures included.
    back = await student.resume(within_s=60)
    assert back is not None, "a resumed tab's page was not drawn again: its pictures stay withdrawn"
    again = sorted({url + m for m in back.images() if m.startswith("/media/")})
    assert set(own) <= set(again) and all(_status(m) == 200 for m in again)  # the same pictures of the same photo
    await student.close()
    await admin.close()


@pytest.mark.slow
def test_a_closed_tabs_pictures_are_withdrawn_at_once_and_drawn_again_when_it_comes_back(resumable_server):
    stclient.run_sync(_closed_tabs_media_withdrawn_then_resumed(resumable_server))
