"""Shared by the checkpoint tests: tiny random Hugging Face models saved and loaded back through the core."""

from pathlib import Path

import numpy as np
import torch

import tformer_core as tc

SHARED = Path(__file__).resolve().parents[3] / "shared"
DEIT = SHARED / "models" / "deit-tiny-patch16-224"
IMAGES = SHARED / "images"


def perturbed(hf_model, seed=0, scale=0.05):
    """Add noise to every parameter, so LayerNorms are not the identity and biases not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return hf_model.eval()


def roundtrip(hf_model, tmp_path) -> tc.TracedModel:
    folder = tmp_path / "checkpoint"
    hf_model.save_pretrained(folder)
    return tc.load_model(str(folder), device="cpu", model_dirs=[tmp_path])


def assert_close(ours, theirs, atol=1e-4, what=""):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    diff = float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - theirs)))
    assert diff <= atol, f"{what}: max |difference| {diff:.2e} > {atol}"
    return diff


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)
