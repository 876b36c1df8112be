"""Test-wide settings: no test may touch the network."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TFORMER_DEVICE", "cpu")
