"""The import graph of the project's own modules, read from their source (imports inside functions included).

Nodes are modules: `tformer_core.models.vit`, a package's `__init__` as the package (`tformer_core.bundled`),
`app_pages.train`, `app`. `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`
(its `__init__`); relative imports are resolved. On that graph:

- no cycles: a module is never, through any chain of imports, its own dependency;
- the layers: tformer_core <- tformer_train <- tformer_views <- tformer_app <- app_pages / app.py, a lower layer
  never imports an upper one, and no layer below tformer_app imports Streamlit;
- nothing reaches a `_private` name or module of another module (imported, or read as an attribute of an
  imported module), except the few listed here with their reason;
- every name an upper layer takes from a lower one is in that module's `__all__`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: each imports only its own layer and those before it.
LAYERS = ("tformer_core", "tformer_train", "tformer_views", "tformer_app", "app_pages")
RANK = {**{package: rank for rank, package in enumerate(LAYERS)}, "app": len(LAYERS) - 1}
# Streamlit belongs to tformer_app, the pages and app.py.
NO_STREAMLIT = ("tformer_core", "tformer_train", "tformer_views")
# The layers whose modules declare what the layers above may take (`__all__`); tformer_app's are read by the
# pages alone.
DECLARE_ALL = ("tformer_core", "tformer_train", "tformer_views")
# (importer, module, name) -> why a private name is read from another module of the same package.
PRIVATE_ALLOWED: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Use:
    """`importer` (line `line`) loads the project module `module`, or, with `name`, takes `name` from it."""

    importer: str
    module: str
    name: str | None
    line: int
    by_import: bool = True  # False: read as an attribute of a module the file imported (no import of its own)


def project_modules(root: Path, packages: Iterable[str] = LAYERS) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `packages` under `root`, and `app.py`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    if (root / "app.py").is_file():
        modules["app"] = root / "app.py"
    return modules


def _top(module: str) -> str:
    return module.split(".")[0]


def _absolute(node: ast.ImportFrom, importer: str, path: Path) -> str:
    """The module a `from ... import` names, relative levels resolved against the importer's package."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Reader(ast.NodeVisitor):
    """What one file imports: project uses, external modules, and the names its import statements bind; then,
    visiting the file, every name read through a module it imported (`td.make_scenes`)."""

    def __init__(self, importer: str, path: Path, modules: dict[str, Path]) -> None:
        self.importer, self.path, self.modules = importer, path, modules
        self.projects = {_top(m) for m in modules}
        self.uses: list[Use] = []
        self.external: list[tuple[str, int]] = []
        self.unresolved: list[str] = []
        self.bound: dict[str, str] = {}  # a name an import statement binds -> the project module it names
        self.scopes: list[set[str]] = []  # the names each enclosing function binds itself (they hide a module)

    def read_import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _top(alias.name) not in self.projects:
                self.external.append((alias.name, node.lineno))
            elif alias.name not in self.modules:
                self.unresolved.append(f"{self.importer}:{node.lineno} import {alias.name}")
            else:
                self.uses.append(Use(self.importer, alias.name, None, node.lineno))
                # `import a.b.c` binds a; `import a.b.c as x` binds x to a.b.c
                local, target = (alias.asname, alias.name) if alias.asname else (_top(alias.name),) * 2
                self.bound[local] = target

    def read_from(self, node: ast.ImportFrom) -> None:
        module = _absolute(node, self.importer, self.path)
        if _top(module) not in self.projects:
            self.external += [(module, node.lineno)] + [(f"{module}.{a.name}", node.lineno) for a in node.names]
        elif module not in self.modules:
            self.unresolved.append(f"{self.importer}:{node.lineno} from {module} import ...")
        else:
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                if submodule in self.modules:
                    self.uses.append(Use(self.importer, submodule, None, node.lineno))
                    self.bound[alias.asname or alias.name] = submodule
                else:
                    self.uses.append(Use(self.importer, module, alias.name, node.lineno))

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        args = node.args
        own = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
        own |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.scopes.append(own)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """`td.make_scenes`, `tc.models.vit.ViT`: a name read through an imported module is a use of it."""
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            self.visit(base)
            return
        if base.id not in self.bound or any(base.id in scope for scope in self.scopes):
            return
        module = self.bound[base.id]
        for attr in chain:
            if f"{module}.{attr}" not in self.modules:
                self.uses.append(Use(self.importer, module, attr, node.lineno, by_import=False))
                return
            module = f"{module}.{attr}"


@dataclass
class Graph:
    modules: dict[str, Path]
    readers: dict[str, _Reader]

    @property
    def uses(self) -> Iterator[Use]:
        for reader in self.readers.values():
            yield from reader.uses

    def edges(self) -> dict[str, set[str]]:
        """importer -> the project modules its import statements load (attribute reads are not imports)."""
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for use in self.uses:
            if use.by_import and use.module != use.importer:
                out[use.importer].add(use.module)
        return out


def build_graph(root: Path = ROOT, packages: Iterable[str] = LAYERS) -> Graph:
    """The graph of the project's modules under `root`, every file read (imports inside functions included)."""
    modules = project_modules(root, packages)
    readers = {}
    for name, path in modules.items():
        reader = _Reader(name, path, modules)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every import first: a module imported late still names what it binds
            if isinstance(node, ast.Import):
                reader.read_import(node)
            elif isinstance(node, ast.ImportFrom):
                reader.read_from(node)
        reader.visit(tree)
        readers[name] = reader
    return Graph(modules, readers)


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) through each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_cycle_in(group, edges) for group in groups]


def _cycle_in(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group (breadth first)."""
    start, members = group[0], set(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in the strongly connected group {group}")


def declared_all(path: Path) -> list[str] | None:
    """The module's `__all__` as written (a list or tuple of strings, `+=` included); None when it has none."""
    names: list[str] | None = None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
            value = ast.literal_eval(node.value)
            names = [*(names or []), *value] if isinstance(node, ast.AugAssign) else list(value)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches_private(use: Use) -> bool:
    """Whether `use` takes a `_private` name, or goes through a `_private` module or package that is not one of
    the importer's own (a private package's modules may read each other)."""
    importer, path = use.importer.split("."), use.module.split(".")
    shared = 0
    while shared < min(len(importer), len(path)) and importer[shared] == path[shared]:
        shared += 1
    return any(_is_private(part) for part in path[shared:]) or _is_private(use.name or "")


def private_reaches(graph: Graph) -> list[str]:
    """Every use of a `_private` name or module from another module, except those PRIVATE_ALLOWED gives a reason."""
    found = []
    for use in graph.uses:
        if use.module == use.importer or not _reaches_private(use):
            continue
        if _top(use.importer) == _top(use.module) and (use.importer, use.module, use.name or "") in PRIVATE_ALLOWED:
            continue
        found.append(f"{use.importer}:{use.line} uses {use.module}" + (f".{use.name}" if use.name else ""))
    return sorted(set(found))


def layer_breaks(graph: Graph) -> list[str]:
    """Every import of an upper layer's module, and every Streamlit import below tformer_app."""
    found = []
    for use in graph.uses:
        if RANK[_top(use.importer)] < RANK[_top(use.module)]:
            found.append(f"{use.importer}:{use.line} imports {use.module} (an upper layer)")
    for name, reader in graph.readers.items():
        if _top(name) in NO_STREAMLIT:
            found += [f"{name}:{line} imports {m}" for m, line in reader.external if _top(m) == "streamlit"]
    return sorted(set(found))


def names_outside_all(graph: Graph) -> list[str]:
    """Names an upper layer takes from a lower layer's module that the module's `__all__` does not list, one line
    per module and name with its first user."""
    alls = {m: declared_all(path) for m, path in graph.modules.items()}
    found: dict[str, str] = {}
    for use in sorted(graph.uses, key=lambda u: (u.importer, u.line)):
        if use.name is None or _top(use.importer) == _top(use.module) or _top(use.module) not in DECLARE_ALL:
            continue
        public = alls[use.module]
        if public is None or use.name not in public:
            missing = "has no __all__" if public is None else "is not in its __all__"
            found.setdefault(f"{use.module}.{use.name} {missing}", f"(used by {use.importer}:{use.line})")
    return sorted(f"{what} {where}" for what, where in found.items())


# ---- the project ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph()


def test_every_project_import_resolves_to_a_module(graph):
    """An import of the project's own packages that names no module of it is a typo (or a module moved away)."""
    unresolved = [u for reader in graph.readers.values() for u in reader.unresolved]
    assert not unresolved
    assert graph.edges()["tformer_core.models.vit"] >= {"tformer_core.models.base", "tformer_core.capture"}


def test_no_import_cycles(graph):
    cycles = [" -> ".join(cycle) for cycle in find_cycles(graph.edges())]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_each_layer_imports_only_those_below_it(graph):
    breaks = layer_breaks(graph)
    assert not breaks, "\n".join(breaks)


def test_no_module_reaches_a_private_name_of_another(graph):
    reaches = private_reaches(graph)
    assert not reaches, "\n".join(reaches)


def test_every_name_an_upper_layer_imports_is_in_its_modules_all(graph):
    missing = names_outside_all(graph)
    assert not missing, "\n".join(missing)


# ---- the checks themselves, on a small tree of their own -----------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Graph:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return build_graph(root)


def test_the_checks_find_what_they_are_for(tmp_path):
    graph = _tree(
        tmp_path,
        {
            "tformer_core/__init__.py": "from . import a\n",
            "tformer_core/a.py": "__all__ = ['f']\ndef f():\n    from .b import g\n",  # a cycle, inside a function
            "tformer_core/b.py": "from tformer_core import a, _hidden\nfrom .a import _secret\n"
            "from ._hidden import st\n",
            "tformer_core/_hidden.py": "import streamlit as st\n",
            "tformer_views/__init__.py": "",
            # `a` as a parameter is not the module: `a._q` there is an attribute of whatever is passed
            "tformer_views/v.py": "from tformer_core import a\nfrom tformer_core.a import f\nx = a.f, a.g, a._p\n"
            "def h(a):\n    return a._q\n",
            "tformer_train/__init__.py": "import tformer_views.v as v\n",
        },
    )
    assert graph.edges()["tformer_core.b"] == {"tformer_core.a", "tformer_core._hidden"}
    assert find_cycles(graph.edges()) == [["tformer_core.a", "tformer_core.b", "tformer_core.a"]]
    assert layer_breaks(graph) == [
        "tformer_core._hidden:1 imports streamlit",
        "tformer_train:1 imports tformer_views.v (an upper layer)",
    ]
    assert private_reaches(graph) == [
        "tformer_core.b:1 uses tformer_core._hidden",
        "tformer_core.b:2 uses tformer_core.a._secret",
        "tformer_core.b:3 uses tformer_core._hidden.st",
        "tformer_views.v:3 uses tformer_core.a._p",
    ]
    assert names_outside_all(graph) == [
        "tformer_core.a._p is not in its __all__ (used by tformer_views.v:3)",
        "tformer_core.a.g is not in its __all__ (used by tformer_views.v:3)",
    ]
