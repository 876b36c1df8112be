"""Every TFORMER_* setting is read and checked in tformer_core.settings: a bad value costs one log line and its
default, never a page (TFORMER_DEVICE=gpu raised on every page; TFORMER_DEVICE=cuda on a CPU-only torch raised
AssertionError; a bad TFORMER_MAX_PARAMS broke every load). The core declares the settings it reads; a notebook
that imports only the core has those and needs nothing of the app (whose own are tested in tests/app)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tformer_core as tc
from tformer_core import settings

ROOT = Path(__file__).resolve().parents[2]


def warnings_about(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tformer_core" and name in r.getMessage()]


@pytest.mark.parametrize(
    "value, why",
    [("gpu", "use cpu, cuda, cuda:N or mps"), ("cuda", "no CUDA"), ("cpu:3", "the CPU has no index")],
    ids=["gpu", "cuda-without-one", "cpu-index"],
)
def test_a_device_the_machine_cannot_use_is_logged_once_and_the_default_used(monkeypatch, caplog, value, why):
    if value == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU: TFORMER_DEVICE=cuda is valid here")
    monkeypatch.setenv("TFORMER_DEVICE", value)
    with caplog.at_level("WARNING", logger="tformer_core"):
        for _ in range(3):
            assert tc.default_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = tc.load_model("vit-tiny")  # the loader places models on the default device: it works
    assert model.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    lines = warnings_about(caplog, f"TFORMER_DEVICE='{value}'")
    assert len(lines) == 1 and why in lines[0] and "a GPU if there is one, else the CPU" in lines[0], lines


# What the core reads itself: the models' device, the loaders' folders, limits and disk caches, the sample pictures.
CORE_SETTINGS = {
    "TFORMER_MODEL_DIRS",
    "TFORMER_IMAGE_DIRS",
    "TFORMER_DEVICE",
    "TFORMER_MAX_PARAMS",
    "TFORMER_PASS_MB",
    "TFORMER_HUB_MAX_MB",
    "TFORMER_HUB_DISK_MB",
    "TFORMER_CACHE_DIR",
}


def test_a_notebook_that_imports_only_the_core_has_every_setting_the_core_and_the_views_read():
    """In a fresh interpreter (as a notebook): `import tformer_core` declares exactly the core's settings, loads
    nothing of the app, and reading an app setting there says where it is declared."""
    code = (
        "import json, sys\n"
        "import tformer_core\n"
        "from tformer_core import settings\n"
        "try:\n"
        "    settings.value('TFORMER_CACHE_MB')\n"
        "    missing = ''\n"
        "except KeyError as e:\n"
        "    missing = e.args[0]\n"
        "print(json.dumps([sorted(settings.SETTINGS), 'tformer_app' in sys.modules, missing]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    declared, app_loaded, missing = json.loads(out.stdout.splitlines()[-1])
    assert set(declared) == CORE_SETTINGS and not app_loaded
    assert missing == (
        "TFORMER_CACHE_MB is not a declared setting (the app's are declared by importing tformer_app.settings)"
    )
    # Every name the core's and the views' code reads is one of those (the views cannot import the app).
    read = set()
    for folder in ("tformer_core", "tformer_views"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"\b(?:value|megabytes)\(\s*\"(TFORMER_[A-Z_]+)\"", path.read_text()))
    assert "TFORMER_MAX_PARAMS" in read and "TFORMER_HUB_DISK_MB" in read  # the pattern finds the readers
    assert read <= CORE_SETTINGS, f"read by the core or the views but declared by the app: {read - CORE_SETTINGS}"


def test_a_setting_declared_twice_differently_is_refused(monkeypatch):
    monkeypatch.setattr(settings, "SETTINGS", dict(settings.SETTINGS))  # the registry as it was, after the test
    once = settings.Setting("TFORMER_EXAMPLE", 2, settings.whole, "an example")
    settings.declare(once)
    settings.declare(settings.Setting("TFORMER_EXAMPLE", 2, settings.whole, "an example"))  # the same: kept
    monkeypatch.setenv("TFORMER_EXAMPLE", "3")
    assert settings.value("TFORMER_EXAMPLE") == 3
    with pytest.raises(ValueError, match=r"^TFORMER_EXAMPLE is declared twice, differently: "):
        settings.declare(settings.Setting("TFORMER_EXAMPLE", 5, settings.whole, "another meaning"))
    assert settings.SETTINGS["TFORMER_EXAMPLE"] is once
