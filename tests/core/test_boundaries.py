"""The core stays UI-free."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_core_does_not_import_streamlit():
    code = "import sys, tformer_core; print('streamlit' in sys.modules, 'tformer_core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_no_core_module_mentions_streamlit_imports():
    for path in (ROOT / "tformer_core").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            assert not stripped.startswith(("import streamlit", "from streamlit")), f"{path.name}: {stripped}"
