"""The layers stay apart: the core imports no UI, no charts, no drawing and no training; training
(tformer_train) no UI, charts or drawing either; the views import no Streamlit; Streamlit lives only in
tformer_app, app_pages/ and app.py.

Checked twice: by what importing every module actually loads (a fresh interpreter), and by the import
statements written in the files (so a lazy import inside a function is caught too).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN_FORBIDDEN = ("streamlit", "altair", "vl_convert", "pandas", "PIL.ImageDraw", "tformer_views", "tformer_app")
CORE_FORBIDDEN = (*TRAIN_FORBIDDEN, "tformer_train")
VIEWS_FORBIDDEN = ("streamlit", "tformer_app")
LAYERS_BELOW_THE_APP = [
    ("tformer_core", CORE_FORBIDDEN),
    ("tformer_train", TRAIN_FORBIDDEN),
    ("tformer_views", VIEWS_FORBIDDEN),
]


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


@pytest.mark.slow
@pytest.mark.parametrize("package, forbidden", LAYERS_BELOW_THE_APP)
def test_importing_every_module_loads_nothing_forbidden(package, forbidden):
    loaded = _loaded_after_importing(package)
    assert package in loaded
    assert not [m for m in loaded if _matches(m, forbidden)]


@pytest.mark.parametrize("package, forbidden", LAYERS_BELOW_THE_APP)
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
    """Everything kept between requests is in the model and results caches (tformer_app/models.py, results.py; derived
    views and long work keep theirs in the results'): no st.cache_* anywhere (their budgets count entries, not
    bytes), and no other module builds a cache of results of its own (a font table is fine)."""
    users = sorted(
        str(p.relative_to(ROOT))
        for folder in ("tformer_app", "app_pages", "tformer_views", "tformer_train", "tformer_core")
        for p in (ROOT / folder).rglob("*.py")
        if any(s in p.read_text() for s in ("st.cache_", "ByteBudgetCache(", "WeakKeyDictionary", "OrderedDict("))
    )
    users += ["app.py"] if "st.cache_" in (ROOT / "app.py").read_text() else []
    assert users == ["tformer_app/budget.py", "tformer_app/models.py", "tformer_app/results.py"]


# The caches split by concern, each module above those it may import: the process's memory at the bottom, the model
# cache, the results cache, then what is derived from results and long work (side by side), the server's upkeep on top.
CACHE_MODULES_BELOW = {
    "memory": set(),
    "models": {"memory"},
    "results": {"memory", "models"},
    "derived_views": {"memory", "models", "results"},
    "long_work": {"memory", "models", "results"},
    "upkeep": {"memory", "models", "results", "derived_views", "long_work"},
}


def _app_modules_imported(path: Path) -> set[str]:
    """The tformer_app modules a file of tformer_app imports, relatively or not, anywhere in its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "tformer_app":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tformer_app."):
            found.add(node.module.split(".")[1])
    return found


def test_the_cache_modules_import_only_those_below_them():
    wrong = {
        name: sorted(_app_modules_imported(ROOT / "tformer_app" / f"{name}.py") & set(CACHE_MODULES_BELOW) - below)
        for name, below in CACHE_MODULES_BELOW.items()
    }
    assert not {name: above for name, above in wrong.items() if above}


def test_pages_ask_the_cache_through_its_typed_requests():
    """Pages build a typed request (results.text_trace(...), results.picture(...)) and read it with results.result
    or a typed derived view (derived_views.overview_picture(...)), so the type checker knows what each returns: no
    cache module keeps a table of computations looked up by a string or casts what the cache gives back, and the
    generic helpers under the typed views (derived_views.derived / from_model) are that module's own."""
    untyped = [
        name
        for name in CACHE_MODULES_BELOW
        if "cast(" in (source := (ROOT / "tformer_app" / f"{name}.py").read_text()) or "dict[str, Callable" in source
    ]
    assert not untyped
    callers = sorted(
        str(p.relative_to(ROOT))
        for folder in ("app_pages", "tformer_app")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "derived_views.py"
        and any(f"derived_views.{name}(" in p.read_text() for name in ("derived", "from_model"))
    )
    assert not callers


# ---- the views and the app read the core's public API, never its modules ------------------------------
# Attribute names of the core's nn.Modules that nothing outside the core may reach for: the weights are read
# through `model.weights()` (TransformerLens's shapes), what a model offers through its kind and capabilities.
MODULE_INTERNALS = {"blocks", "block_list", "embed", "project", "unembed", "rel_pos", "hf", "get_submodule"}
# Names that are module internals only on their owner (an attention module's W_q; an Example's W_q is the
# lesson's own matrix).
OWNED = {name: {"attn", "cross_attn"} for name in ("W_q", "W_k", "W_v", "W_o")}
# A parameter read off a submodule (`mlp.W_in.weight`, `ln_attn.bias`): what the accessors replace.
PARAMETER_OWNERS = {
    *("W_q", "W_k", "W_v", "W_o", "W_in", "W_out", "W_gate", "project", "linear", "tok", "pos", "segment"),
    *("ln_attn", "ln_cross", "ln_mlp", "ln_final", "ln", "q_norm", "k_norm"),
    *("classifier", "dist_classifier", "pool", "classify", "transform"),
}


def _name(node: ast.expr) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


OUTSIDE_THE_CORE = ["tformer_views", "tformer_app", "app_pages"]


def _reach_ins(path: Path) -> list[str]:
    """ "line: what" for every reach into the core's modules in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute):
            owner = _name(node.value)
            if (
                node.attr in MODULE_INTERNALS
                or owner in OWNED.get(node.attr, ())
                or (node.attr in ("weight", "bias") and owner in PARAMETER_OWNERS)
            ):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stack":
            base = node.func.value
            if not (isinstance(base, ast.Name) and base.id in ("np", "torch", "pd")):
                found.append(f"{node.lineno}: .stack()")  # TracedModel.stack hands out a module
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and _name(node.args[0]) == "model"
        ):
            found.append(f"{node.lineno}: {node.func.id}(model, ...)")  # probing what a model offers
    return found


@pytest.mark.parametrize("folder", OUTSIDE_THE_CORE)
def test_views_and_pages_never_reach_into_the_cores_modules(folder):
    """A rename inside the core's modules must not silently break a page: outside the core, weights come from
    `model.weights()`, capabilities from `model.capabilities`, nothing from module attributes or probing."""
    offenders = [
        f"{path.relative_to(ROOT)}:{hit}" for path in sorted((ROOT / folder).rglob("*.py")) for hit in _reach_ins(path)
    ]
    assert not offenders


def test_the_reach_in_check_catches_what_it_is_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "w = model.stack('encoder').blocks[0].attn.W_q.weight.T\n"
        "g = block.mlp.W_in.weight\n"
        "note = getattr(model, 'weights_note', '')\n"
        "fine = np.stack([steps.weight, model.weights().block(0).mlp.W_in, trace['encoder.0.attn.q']])\n"
    )
    assert sorted(_reach_ins(sample)) == [
        "1: .W_q",
        "1: .blocks",
        "1: .stack()",
        "1: .weight",
        "2: .weight",
        "3: getattr(model, ...)",
    ]


# ---- one definition of each shared helper --------------------------------------------------------------
HOMES = {
    "softmax": ["tformer_core/numerics.py"],
    "head_scores": ["tformer_core/numerics.py"],
    "tex": ["tformer_views/lessons/attention.py"],
    "as_factor": ["tformer_views/lessons/attention.py"],
    "finite_float": ["tformer_app/url.py"],
    "text_embedding": ["tformer_core/models/layers.py"],
}
COPIES = {"_softmax", "latex_number", "lt_finite"}  # names the copies had


def test_each_shared_helper_is_written_once():
    defined: dict[str, list[str]] = {}
    built: list[str] = []  # where a TextEmbedding is constructed
    for folder in ("tformer_core", "tformer_train", "tformer_views", "tformer_app", "app_pages"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef):
                    defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
                elif isinstance(node, ast.Call) and _name(node.func) == "TextEmbedding":
                    built.append(str(path.relative_to(ROOT)))
    assert {name: defined.get(name) for name in HOMES} == HOMES
    assert not COPIES & defined.keys()
    assert built == ["tformer_core/models/layers.py"]
