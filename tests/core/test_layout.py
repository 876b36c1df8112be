"""Code stays readable: no function of the packages or pages runs past 60 lines (split it into named parts)."""

import ast
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


def test_the_readme_layout_names_every_module_and_folder():
    """The README's layout section is the map of the tree: every package module and folder appears in it."""
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
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
