"""The app shell runs and the Home page shows the core's real numbers."""

from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

import tformer_core as tc

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_home_page_renders_without_exception():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value.startswith("tformer")
    assert any("Device:" in c.value for c in at.sidebar.caption)
    # One numbering convention for the whole app, said once here (the pages follow it: "head 0", "z1").
    assert any("layers and heads count from 0" in c.value and "count from 1" in c.value for c in at.caption)
    weights = at.dataframe[1].value.to_numpy(dtype=float)
    steps = tc.attention_steps([[1, 0], [0, 1], [1, 1]], np.eye(2), np.eye(2), [[1, 2], [3, 4]])
    np.testing.assert_allclose(weights, steps.weights)
    np.testing.assert_allclose(weights.sum(1), 1.0)


def test_the_sidebar_lists_the_model_the_page_just_loaded():
    """Drawn after the page ran: the first visit to a page that loads MiniLM already lists it."""
    from tformer_app import models

    models.clear_models()  # a fresh server: no model held yet
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert any(c.value == "Models loaded: none yet" for c in at.sidebar.caption)
    at.switch_page("app_pages/text_attention.py").run()
    assert not at.exception
    assert any(c.value.startswith("Models loaded:") and "minilm" in c.value for c in at.sidebar.caption)


def test_home_describes_each_page_in_the_words_of_the_docs():
    """docs/pages.md's table of pages and the Home page's guide (the tab below its first screen) say the same thing
    about every page."""
    import re

    pages = (Path(APP).parent / "docs" / "pages.md").read_text(encoding="utf-8")
    block = next(part for part in pages.split("\n\n") if part.startswith("| page | what it shows |"))
    table = dict(re.findall(r"^\| ([A-Z][^|]+?) \| (.+) \|$", block, re.M))
    at = AppTest.from_file(APP, default_timeout=60).run()  # Home, in the app's shell
    assert not at.exception
    guide = [p.proto.label.strip("*") for p in at.main.get("page_link")][-13:]  # after the first screen's links
    captions = [c.value for c in at.main.caption]
    numbering = next(i for i, c in enumerate(captions) if "layers and heads count from 0" in c)
    assert guide == [name for name in table if name != "page"]  # every page but Home
    assert dict(zip(guide, captions[numbering + 1 :])) == {name: table[name] for name in guide}
