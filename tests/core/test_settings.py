"""Every TFORMER_* setting is read and checked in tformer_core.settings: a bad value costs one log line and its
default, never a page (TFORMER_DEVICE=gpu raised on every page; TFORMER_DEVICE=cuda on a CPU-only torch raised
AssertionError; a bad TFORMER_MAX_PARAMS broke every load)."""

from __future__ import annotations

import ast
import re
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


def test_memory_settings_and_unknown_names(monkeypatch, caplog):
    monkeypatch.setenv("TFORMER_CACHE_MB", "-5")
    monkeypatch.setenv("TFORMER_PASSES", "1.5")
    monkeypatch.setenv("TFORMER_HUB_DISK_MB", "1e3")
    monkeypatch.setenv("TFORMER_CACHEMB", "512")  # a typo: it would otherwise be ignored silently
    monkeypatch.setenv("TFORMER_ADMIN_TOKEN", "s3cr3t")
    with caplog.at_level("WARNING", logger="tformer_core"):
        assert settings.megabytes("TFORMER_CACHE_MB") == 768 * 2**20
        assert settings.value("TFORMER_PASSES") == 1
        assert settings.megabytes("TFORMER_HUB_DISK_MB") == 1000 * 10**6  # disk: decimal megabytes
        assert settings.value("TFORMER_ADMIN_TOKEN") is None
        settings.check_environment()
    assert warnings_about(caplog, "TFORMER_CACHE_MB=") == [
        "TFORMER_CACHE_MB='-5' is refused (not a positive number); using 768"
    ]
    assert warnings_about(caplog, "TFORMER_PASSES=") == [
        "TFORMER_PASSES='1.5' is refused (not a whole number); using 1"
    ]
    assert warnings_about(caplog, "TFORMER_CACHEMB") == [
        "TFORMER_CACHEMB is not a tformer setting (a typo?); it is ignored"
    ]
    token = warnings_about(caplog, "TFORMER_ADMIN_TOKEN")
    assert len(token) == 1 and "s3cr3t" not in token[0] and "(hidden)" in token[0]  # a secret never reaches the log


def test_no_module_but_settings_reads_a_tformer_variable_and_the_docs_list_them_all():
    """One module reads the environment's TFORMER_* names; each name the code mentions is one of its settings,
    and docs/settings.md's table lists every setting."""
    readers = []
    for folder in ("tformer_core", "tformer_views", "tformer_app", "app_pages"):
        for path in (ROOT / folder).rglob("*.py"):
            source = path.read_text()
            if path.name == "settings.py" and folder == "tformer_core":
                continue
            for node in ast.walk(ast.parse(source)):  # os.environ.get("TFORMER_..."), os.environ[...], os.getenv(...)
                text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript)) else ""
                if re.match(r"^os\.(environ|getenv)\b.*TFORMER_", text):
                    readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            for name in re.findall(r"TFORMER_[A-Z_]+[A-Z]", source):
                assert name in settings.SETTINGS, f"{path.relative_to(ROOT)} names {name}, which is not a setting"
    assert not readers, f"the environment is read outside tformer_core/settings.py: {readers}"
    table = (ROOT / "docs" / "settings.md").read_text().split("Settings (environment variables", 1)[1].split("\n\n")[1]
    assert set(re.findall(r"`(TFORMER_[A-Z_]+)`", table)) == set(settings.SETTINGS)
