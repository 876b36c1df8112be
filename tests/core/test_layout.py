"""Code stays readable: no function of the packages or pages runs past 60 lines (split it into named parts)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def test_no_function_is_longer_than_60_lines():
    long = []
    for folder in ("tformer_core", "tformer_views", "tformer_app", "app_pages"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long
