"""Shared by the AppTest tests: run a page with URL parameters, find widgets, read what the charts were sent."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

PAGES = Path(__file__).resolve().parents[2] / "app_pages"


def run(page: str, timeout: float = 90, **params: str) -> AppTest:
    """app_pages/<page>.py run once with these URL query parameters."""
    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=timeout)
    for name, value in params.items():
        at.query_params[name] = value
    return at.run()


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def widget(at: AppTest, key: str):
    """The widget in the main area with this key (or "<key>@<digest>": a box keyed by the input's tokens)."""
    return next(
        w for w in at.main if getattr(w, "key", None) == key or str(getattr(w, "key", "")).startswith(key + "@")
    )


def charts(at: AppTest) -> dict[str, list[pd.DataFrame]]:
    """Every chart on the page: its title -> the data frames it was sent (Arrow, as the browser gets them)."""
    out = {}
    for element in at.get("vega_lite_chart"):
        title = json.loads(element.proto.spec).get("title", "")
        title = title.get("text", "") if isinstance(title, dict) else title
        title = " ".join(title) if isinstance(title, list) else title  # a title broken onto several lines
        out[title] = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in element.proto.datasets]
    return out


def table(at: AppTest, name: str) -> pd.DataFrame:
    """The one table whose corner label (index name) is `name`."""
    found = [d.value for d in at.dataframe if d.value.index.name == name]
    assert len(found) == 1, f"expected one table {name!r}, found {[d.value.index.name for d in at.dataframe]}"
    return found[0]


def shown(markdown: str) -> str:
    """Markdown as a reader sees its text: the backslash escapes of tformer_app.markdown.escape removed."""
    return re.sub(r"\\(.)", r"\1", markdown)


def messages(at: AppTest, kind: str) -> list[str]:
    """The text of every element of one kind ("error", "warning", "info", "caption", "markdown"), as shown."""
    return [shown(e.value) for e in at.get(kind)]


@contextlib.contextmanager
def models_from(root: Path) -> Iterator[Path]:
    """TFORMER_MODEL_DIRS set to `root` inside the block, as it was after it (for a module's fixture: pytest's
    monkeypatch lasts one test)."""
    before = os.environ.get("TFORMER_MODEL_DIRS")
    os.environ["TFORMER_MODEL_DIRS"] = str(root)
    try:
        yield root
    finally:
        if before is None:
            os.environ.pop("TFORMER_MODEL_DIRS", None)
        else:
            os.environ["TFORMER_MODEL_DIRS"] = before


def app(**params: str) -> AppTest:
    """The whole app (app.py: its sidebar, class session and presenter around the page) run once with these URL
    query parameters."""
    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=180)
    for name, value in params.items():
        at.query_params[name] = value
    return at.run()


def ok(at: AppTest) -> AppTest:
    """`at`, after checking that its last run raised nothing."""
    no_exception(at)
    return at
