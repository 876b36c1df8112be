"""Long work beside the pages' passes (tformer_app.work, slots.PassGate): a page's pass never waits for a study,
each session has one job of its own, equal requests share one, and a job nobody waits for stops at its next step.
Real forward passes of a tiny model run the jobs: their hook points are where they give way and stop."""

import threading

import pytest
import torch

from tests.core.tiny_models import tiny_decoder
from tformer_app.slots import PassGate
from tformer_app.work import Busy, WorkQueue
from tformer_core.errors import InputError

WAIT_S = 60.0  # a condition that does not come within this long on a loaded machine is a failure


def wait_until(condition, what: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        done.wait(0.01)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def model():
    return tiny_decoder()


class Passes:
    """A job's compute: forward passes of `model` until told to stop (or `most` of them), counting them."""

    def __init__(self, model, most: int = 100_000) -> None:
        self.model, self.most, self.done, self.release = model, most, 0, threading.Event()
        self.started = threading.Event()

    def __call__(self, progress):
        ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
        with torch.inference_mode():
            while self.done < self.most and not self.release.is_set():
                self.model(ids)
                self.done += 1
                self.started.set()
                progress(self.done / self.most, f"pass {self.done}")
        return self.done


def test_a_pages_pass_goes_before_long_work_and_the_work_goes_on_after_it(model):
    gate = PassGate(threading.BoundedSemaphore(1))
    queue = WorkQueue(gate, threads=1)
    work = Passes(model)
    job = queue.submit("study", "student-a", "a study", work)
    work.started.wait(WAIT_S)
    finished_while_running: list[bool] = []

    def page_pass() -> None:
        with gate, torch.inference_mode():  # the slot the study holds: it gives it up at its next hook point
            model(torch.tensor([[1, 2, 3]]))
        finished_while_running.append(job.state == "running")

    for _ in range(3):
        before = work.done
        page = threading.Thread(target=page_pass)
        page.start()
        page.join(WAIT_S)
        assert not page.is_alive()
        wait_until(lambda before=before: work.done > before, "the study to go on after the page's pass")
    assert finished_while_running == [True, True, True]  # never behind the study
    work.release.set()
    assert job.done.wait(WAIT_S) and job.state == "done" and job.value == work.done


def test_long_work_takes_the_slot_only_while_no_pages_pass_waits():
    gate = PassGate(threading.BoundedSemaphore(1))
    order: list[str] = []
    holder_in, holder_out = threading.Event(), threading.Event()

    def page_holds_the_slot() -> None:
        with gate:
            order.append("page in")
            holder_in.set()
            holder_out.wait(WAIT_S)
            order.append("page out")

    def long_work() -> None:
        with gate.behind():
            order.append("work in")

    page = threading.Thread(target=page_holds_the_slot)
    page.start()
    holder_in.wait(WAIT_S)
    work = threading.Thread(target=long_work)
    work.start()
    second = threading.Thread(
        target=lambda: (gate.__enter__(), order.append("second page"), gate.__exit__(None, None, None))
    )
    wait_until(lambda: gate.waiting() == 0, "the page to hold the slot")
    second.start()
    wait_until(lambda: gate.waiting() == 1, "a second page's pass to wait")
    holder_out.set()
    for thread in (page, work, second):
        thread.join(WAIT_S)
    assert order == ["page in", "page out", "second page", "work in"]


def test_a_session_has_one_job_of_its_own_and_equal_requests_share_one(model):
    gate = PassGate(threading.BoundedSemaphore(1))
    queue = WorkQueue(gate, threads=1)
    first = Passes(model)
    job = queue.submit(("heads", "text one"), "student-a", "a study", first)
    first.started.wait(WAIT_S)
    shared = queue.submit(("heads", "text one"), "student-b", "a study", Passes(model))
    assert shared is job and set(job.watchers) == {"student-a", "student-b"}
    # Student a types another text: b still waits for the first study, so it goes on.
    other = Passes(model, most=3)
    second = queue.submit(("heads", "text two"), "student-a", "a study", other)
    assert second is not job and not job.stop.is_set() and queue.position(second) == 1
    # Student b types another text too: nobody waits for the first study any more; it stops at its next step.
    third = queue.submit(("heads", "text three"), "student-b", "a study", Passes(model, most=3))
    assert job.done.wait(WAIT_S) and job.state == "cancelled"
    assert second.done.wait(WAIT_S) and second.value == 3  # the line moves on: first come, first served
    assert third.done.wait(WAIT_S) and third.value == 3
    stopped_at = first.done
    assert stopped_at < first.most
    assert queue.finished == {"done": 2, "failed": 0, "cancelled": 1}


def test_a_job_nobody_asks_about_stops_at_its_next_step_and_the_line_is_bounded(model):
    gate = PassGate(threading.BoundedSemaphore(1))
    queue = WorkQueue(gate, threads=1, stale_s=0.5, max_waiting=2)
    work = Passes(model)
    job = queue.submit("closed page", "student-a", "a study", work)  # its page closes: nobody watches it
    assert job.done.wait(WAIT_S) and job.state == "cancelled"
    assert work.done < work.most
    # A line of two waiting jobs: a third is refused with a message, not queued.
    blocker = Passes(model)
    running = queue.submit("running", "s0", "a study", blocker)
    blocker.started.wait(WAIT_S)
    waiting = [queue.submit(key, f"s{i}", "a study", Passes(model, most=1)) for i, key in ((1, "one"), (2, "two"))]
    with pytest.raises(Busy, match="2 long computations are waiting"):
        queue.submit("three", "s3", "a study", Passes(model, most=1))
    assert isinstance(Busy("x"), InputError)  # the page says it as a message, never as a bug
    for _ in range(int(WAIT_S / 0.1)):
        queue.watch(running, "s0")
        if blocker.done > 3:
            break
        running.done.wait(0.1)
    queue.cancel_session("s0")
    assert running.done.wait(WAIT_S) and running.state == "cancelled"
    # Nobody watches the two waiting ones either: each runs if its turn comes within STALE_S, else leaves the line.
    assert all(job.done.wait(WAIT_S) and job.state in ("done", "cancelled") for job in waiting)


def test_a_failure_is_the_inputs_or_a_bug_logged_once_with_an_id():
    gate = PassGate(threading.BoundedSemaphore(1))
    logged: list[tuple[str, Exception]] = []
    queue = WorkQueue(gate, threads=1, on_bug=lambda what, error: logged.append((what, error)) or "abc12345")

    def bad_input(progress):
        raise InputError("the text is empty")

    def bug(progress):
        raise KeyError("oops")

    a = queue.submit("a", "s1", "a study", bad_input)
    b = queue.submit("b", "s2", "another study", bug)
    assert a.done.wait(WAIT_S) and b.done.wait(WAIT_S)
    assert a.state == "failed" and isinstance(a.error, InputError) and a.bug is None
    assert b.state == "failed" and b.bug == "abc12345" and [w for w, _ in logged] == ["another study"]


def test_a_result_is_stored_before_the_pages_waiting_for_it_wake():
    """The page that waited reads what the job stored at once (the first ablation after a study of every head reads
    the study's clean trace from the results cache): on_done runs before the job is done."""
    seen: list[bool] = []
    submitted = threading.Event()
    jobs = []
    queue = WorkQueue(PassGate(threading.BoundedSemaphore(1)), threads=1)
    queue.on_done = lambda key, value: seen.append(jobs[0].done.is_set())
    jobs.append(queue.submit("study", "s1", "a study", lambda progress: submitted.wait(WAIT_S) and 42))
    submitted.set()
    assert jobs[0].done.wait(WAIT_S) and jobs[0].value == 42 and seen == [False]
