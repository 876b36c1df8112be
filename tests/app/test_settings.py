"""The app's own TFORMER_* settings (tformer_app.settings), declared into the core's one registry: read and checked
like the core's (a bad value costs one log line and its default), a name nobody declared is reported as a typo, and
docs/settings.md's table lists every setting of both."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.core.test_settings import CORE_SETTINGS
from tformer_app import settings
from tformer_core.settings import SETTINGS  # the one registry: the core's and, tformer_app.settings imported, the app's

ROOT = Path(__file__).resolve().parents[2]


def warnings_about(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tformer_core" and name in r.getMessage()]


# What only the server reads: its memory and work, class sessions, decks, the admin page, its log, deploy/run.sh.
APP_SETTINGS = {
    "TFORMER_CACHE_MB",
    "TFORMER_MODELS_MB",
    "TFORMER_PASSES",
    "TFORMER_GPU_MB",
    "TFORMER_REQUEST_GFLOP",
    "TFORMER_STUDIES",
    "TFORMER_ADMIN",
    "TFORMER_ADMIN_TOKEN",
    "TFORMER_LOG_LEVEL",
    "TFORMER_REDIS_URL",
    "TFORMER_CLASS_HOURS",
    "TFORMER_DECK_DIR",
    "TFORMER_DECK_DAYS",
    "TFORMER_DECKS",
    "TFORMER_CLASS_PER_ADDRESS",
    "TFORMER_PYTHON",
}


def test_the_app_declares_the_settings_only_the_server_reads():
    assert set(SETTINGS) == CORE_SETTINGS | APP_SETTINGS and not CORE_SETTINGS & APP_SETTINGS
    # The app's code reads no setting that is neither its own nor the core's.
    read = set()
    for folder in ("tformer_app", "app_pages"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"\b(?:value|megabytes)\(\s*\"(TFORMER_[A-Z_]+)\"", path.read_text()))
    assert "TFORMER_ADMIN_TOKEN" in read and read <= set(SETTINGS)


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


def test_no_module_but_settings_reads_a_tformer_variable_and_the_readme_lists_them_all():
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
                assert name in SETTINGS, f"{path.relative_to(ROOT)} names {name}, which is not a setting"
    assert not readers, f"the environment is read outside tformer_core/settings.py: {readers}"
    table = (ROOT / "docs" / "settings.md").read_text().split("Settings (environment variables", 1)[1].split("\n\n")[1]
    assert set(re.findall(r"`(TFORMER_[A-Z_]+)`", table)) == set(SETTINGS)


def test_a_bad_log_level_is_logged_once_with_the_default_in_words(monkeypatch, caplog):
    monkeypatch.setenv("TFORMER_LOG_LEVEL", "LOUD")
    with caplog.at_level("WARNING", logger="tformer_core"):
        assert settings.value("TFORMER_LOG_LEVEL") == settings.value("TFORMER_LOG_LEVEL") == 20  # logging.INFO
    assert warnings_about(caplog, "TFORMER_LOG_LEVEL=") == [
        "TFORMER_LOG_LEVEL='LOUD' is refused (use DEBUG, INFO, WARNING or ERROR); using INFO"
    ]
