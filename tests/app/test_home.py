"""Home starts a lecturer, a student and a notebook user: what its first screen says (before the tabs that hold
every page's description), the sidebar labels it quotes, the page files it links, its pictures and their budget,
and the notebook's snippet, run here as a notebook would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from tformer_app import home, models

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
HOME = ROOT / "app_pages" / "home.py"


@pytest.fixture(scope="module")
def at() -> AppTest:
    models.clear_models()  # a fresh server: Home must not load one
    opened = AppTest.from_file(APP, default_timeout=60).run()
    assert not opened.exception
    return opened


def before_tabs(node: Any) -> Iterator[Any]:
    """Home's elements in the order drawn, up to its tabs: what its first screen shows."""
    for child in getattr(node, "children", {}).values():
        if child.type == "tab_container":
            return
        if hasattr(child, "children"):  # a block: columns, containers
            yield from before_tabs(child)
        else:
            yield child


def first_screen(at: AppTest) -> dict[str, list]:
    """The first screen's elements by type: markdown, caption and code as their text, links as their protos."""
    found: dict[str, list] = {}
    for element in before_tabs(at.main):
        found.setdefault(element.type, []).append(element.proto if element.type == "page_link" else element.value)
    return found


def test_the_first_screen_tells_a_lecturer_a_student_and_a_notebook_how_to_start(at):
    screen = first_screen(at)
    text = screen["markdown"]
    present, deck, session = (
        next(t for t in text if t.startswith(f"**{what}:**")) for what in ("Present", "Build a deck", "Start a class")
    )
    for key in ("Shift+P", "*Presenter mode*", "← → ↑ ↓", "Page Up / Down"):
        assert key in present
    assert "*Slides*" in deck and "*Add this view*" in deck and "*Present from slide 1*" in deck
    assert "*Class session*" in session and "*Start a class session*" in session
    join = next(t for t in text if t.startswith("**Join:**"))
    assert "QR" in join and "code" in join and "*Class session*" in join
    links = {link.label: link for link in screen["page_link"]}
    assert links["Type a sentence: Text attention"].page == "text"
    upload = links["Upload a photo: Vision Transformer"]
    assert upload.page == "vision" and upload.query_string == "from=upload"  # the upload box, open
    assert home.INSTALL in screen["code"] and home.SNIPPET in screen["code"]
    # The three pages to start with, in order, each with its picture: six pictures in all with the lecturer's.
    starts = [link.label for link in screen["page_link"] if link.label.startswith("**")]
    assert starts == [f"**{page.title}**" for page in home.START]
    assert len(screen["image"]) == len(home.PICTURES)


def test_the_labels_home_quotes_are_the_sidebars_own():
    """Home names the sidebar's controls in italics: each is there under that name (a renamed control fails here)."""
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.sidebar.button(key="_tformer.deck.add").click().run()  # a slide: the deck offers to present it
    sidebar = (
        {t.label for t in at.sidebar.toggle}
        | {re.sub(r" \(\d+\)$", "", e.label) for e in at.sidebar.expander}  # "Slides (1)"
        | {b.label for b in at.sidebar.button}
        | {t.label for t in at.sidebar.text_input}
    )
    quoted = set(re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", " ".join(first_screen(at)["markdown"])))  # *italics*
    expected = {"Presenter mode", "Slides", "Add this view", "Present from slide 1", "Class session"}
    assert expected | {"Start a class session"} <= quoted <= sidebar, (quoted, sidebar)


def test_every_link_is_a_page_file_of_the_app(at):
    """Home links pages by file ("app_pages/x.py", as st.page_link takes them whatever section app.py puts them in):
    every file named exists, and every link drawn resolved to a page of the app's navigation."""
    named = set(re.findall(r"\"(app_pages/\w+\.py)\"", HOME.read_text() + Path(home.__file__).read_text()))
    assert {page.path for page in home.START} <= named and len(named) == 13  # every page but Home
    assert [path for path in sorted(named) if not (ROOT / path).is_file()] == []
    links = at.main.get("page_link")
    assert len(links) == 3 + 2 + 13 and all(link.proto.page and link.proto.page_script_hash for link in links)


def test_every_picture_exists_within_its_budget():
    """The pictures tools/home_pictures.py made: PNG, twice their width on Home (sharp on a 2x screen), each and
    all of them within the budget of a page every student's browser opens."""
    sizes = {}
    for name, picture in home.PICTURES.items():
        assert picture.path.is_file(), f"{picture.path} is missing: run tools/home_pictures.py {name}"
        sizes[name] = picture.path.stat().st_size
        with Image.open(picture.path) as image:
            assert image.format == "PNG" and image.width == 2 * picture.width, (name, image.format, image.size)
    over = {name: size for name, size in sizes.items() if size > home.MAX_PICTURE_BYTES}
    assert not over and sum(sizes.values()) <= home.MAX_PICTURES_BYTES, sizes
    lecturer = HOME.read_text()  # its LECTURER names the lecturer's pictures; START the pages'
    assert all(f'"{name}"' in lecturer or name in {p.picture for p in home.START} for name in home.PICTURES)


def test_the_notebook_snippet_runs_and_installs_as_the_readme_says():
    *setup, last = home.SNIPPET.splitlines()
    scope: dict[str, Any] = {}
    exec("\n".join(setup), scope)
    weights = eval(last, scope)  # the last line's value, as a notebook shows it
    n = len(scope["trace"].tokens)
    assert weights.shape == (n, n) and n == 6  # [CLS] it was tired . [SEP]
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = readme.split("<!-- app-command -->", 1)[1].split("```")[1]
    for step in home.INSTALL.split(" && "):
        assert f".venv/bin/{step}" in command, step


def test_home_loads_no_model_and_draws_in_presenter_mode(at):
    assert any(c.value == "Models loaded: none yet" for c in at.sidebar.caption)
    presenting = AppTest.from_file(APP, default_timeout=60)
    presenting.query_params["present"] = "1"
    presenting.run()
    assert not presenting.exception
    links = [link.proto.label for link in presenting.main.get("page_link")]  # after presenter mode's bar
    assert [label for label in links if label.startswith("**")][:3] == [f"**{page.title}**" for page in home.START]
