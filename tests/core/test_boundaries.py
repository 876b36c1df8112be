"""The layers stay apart: the core imports no UI, no charts and no drawing; the views import no Streamlit;
Streamlit lives only in tformer_app, app_pages/ and app.py.

Checked twice: by what importing every module actually loads (a fresh interpreter), and by the import
statements written in the files (so a lazy import inside a function is caught too).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_FORBIDDEN = ("streamlit", "altair", "vl_convert", "pandas", "PIL.ImageDraw", "tformer_views", "tformer_app")
VIEWS_FORBIDDEN = ("streamlit", "tformer_app")


def _loaded_after_importing(package: str) -> set[str]:
    """Top modules in sys.modules after importing every module of `package`, in a fresh interpreter."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"import {package} as p\n"
        "for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "    if not m.name.endswith('.__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _file_imports(path: Path) -> list[str]:
    """Every module an import statement of the file names (absolute imports; `from a import b` gives a and a.b)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return found


def _written_imports(folder: Path) -> list[tuple[str, str]]:
    """(file, imported module) for every import statement in the .py files under `folder`."""
    return [(str(path.relative_to(ROOT)), m) for path in folder.rglob("*.py") for m in _file_imports(path)]


def _matches(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize("package, forbidden", [("tformer_core", CORE_FORBIDDEN), ("tformer_views", VIEWS_FORBIDDEN)])
def test_importing_every_module_loads_nothing_forbidden(package, forbidden):
    loaded = _loaded_after_importing(package)
    assert package in loaded
    assert not [m for m in loaded if _matches(m, forbidden)]


@pytest.mark.parametrize("package, forbidden", [("tformer_core", CORE_FORBIDDEN), ("tformer_views", VIEWS_FORBIDDEN)])
def test_no_module_writes_a_forbidden_import(package, forbidden):
    bad = [(f, m) for f, m in _written_imports(ROOT / package) if _matches(m, forbidden)]
    assert not bad


def test_streamlit_is_used_only_by_the_app_layer():
    allowed = {"tformer_app", "app_pages", "tests", "benchmarks", ".venv"}
    offenders = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in allowed or relative == Path("app.py"):
            continue
        offenders += [str(relative) for m in _file_imports(path) if m.split(".")[0] == "streamlit"]
    assert not offenders


def test_one_cache_layer():
    """Everything kept between requests is in tformer_app/caches.py: no st.cache_* anywhere (their budgets
    count entries, not bytes), and no other module builds a cache of results of its own (a font table is fine)."""
    users = sorted(
        str(p.relative_to(ROOT))
        for folder in ("tformer_app", "app_pages", "tformer_views", "tformer_core")
        for p in (ROOT / folder).rglob("*.py")
        if any(s in p.read_text() for s in ("st.cache_", "ByteBudgetCache(", "WeakKeyDictionary", "OrderedDict("))
    )
    users += ["app.py"] if "st.cache_" in (ROOT / "app.py").read_text() else []
    assert users == ["tformer_app/budget.py", "tformer_app/caches.py"]
