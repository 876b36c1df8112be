"""Code stays readable: no function of the packages or pages runs past 60 lines (split it into named parts)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def test_no_function_is_longer_than_60_lines():
    long = []
    for folder in ("tformer_core", "tformer_train", "tformer_views", "tformer_app", "app_pages"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long


def test_the_architecture_layout_names_every_module_and_folder():
    """docs/architecture.md's layout is the map of the tree: every package module and folder appears in it."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    layout = architecture.split("## Layout", 1)[1].split("```")[1]
    missing = []
    for package in ("tformer_core", "tformer_train", "tformer_views", "tformer_app"):
        for path in (ROOT / package).iterdir():
            name = path.stem if path.suffix == ".py" else path.name
            if name.startswith("__") or (path.is_file() and path.suffix != ".py"):
                continue
            if name not in layout:
                missing.append(f"{package}/{path.name}")
    for top in (
        "app.py",
        "app_pages/",
        "tformer_app/",
        "tformer_views/",
        "tformer_core/",
        "tformer_train/",
        "assets/",
        "tests/",
        "benchmarks/",
    ):
        if top not in layout:
            missing.append(top)
    assert not missing


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(markdown: str) -> str:
    """The text outside fenced code blocks (a link in a code block is not a link)."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)


def test_the_readme_is_a_front_door_and_every_link_of_the_docs_leads_somewhere():
    """README.md stays short (the rest is in docs/), and every relative link in it, docs/ and CONTRIBUTING.md names a
    file that exists and, after #, a heading of that file."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken, checked = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):  # http(s), mailto: not ours to check offline
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            checked += 1
            if not linked.is_file():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and anchor not in {
                _anchor(h) for h in re.findall(r"^#+ (.+)$", _prose(linked.read_text()), re.M)
            }:
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken
    assert checked >= 30  # the README's and the docs' links were found at all
