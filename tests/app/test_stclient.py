"""benchmarks/stclient.py against a real server: a session on the Text attention page, as a browser drives it.

The server is `streamlit run app.py` (offline, CPU; tests/browser/server.py). Every wait is for a
script run to finish (the client's own condition), never for a fixed time.
"""

from __future__ import annotations

import pytest

from tests.browser.server import streamlit_server

stclient = pytest.importorskip("benchmarks.stclient", reason="benchmarks/stclient.py needs Streamlit's websockets")

TIMEOUT_S = 240.0  # per action: generous for a busy 2-core machine loading MiniLM on the first run


@pytest.mark.slow
def test_a_session_opens_the_text_page_changes_the_head_and_gets_that_heatmap(tmp_path):
    with streamlit_server(tmp_path / "streamlit.log") as url:
        stclient.run_sync(_open_and_change_head(url))


async def _open_and_change_head(url: str) -> None:
    page = "/text?layer=0&head=0"
    async with await stclient.Session.open(url, page, timeout_s=TIMEOUT_S) as session:
        first = session.last
        assert first.finished and not first.errors, first.errors
        assert "Heatmap · layer 0, head 0" in first.headings()
        head = first.widget("Head", "selectbox")
        assert head.key == "text.head" and head.options[:6] == ["0", "1", "2", "3", "4", "5"]
        assert session.session_id and "text" in session.pages

        run = await session.set_value("Head", "5")
        assert run.finished and not run.errors, run.errors
        assert "Heatmap · layer 0, head 5" in run.headings()
        titles = [c.get("title") for c in run.charts()]
        assert "layer 0, head 5: weights (softmax)" in titles, titles
        assert "head=5" in session.query_string.split("&")  # the app wrote the new head into the address
        assert run.elapsed_s > 0 and run.n_messages > 0
