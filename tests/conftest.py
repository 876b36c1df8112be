"""Test-wide settings: no test may touch the network."""

import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TFORMER_DEVICE", "cpu")
# smollm2 is converted from its GGUF file once (about half a minute) into this folder, the one
# tests/core/test_smollm2.py keeps in pytest's cache: the app and browser tests (whose servers inherit
# the environment) reuse it rather than converting again into the user's ~/.cache.
os.environ.setdefault(
    "TFORMER_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "d" / "tformer-converted")
)
