"""The models this project trains itself and ships in `assets/`, offline.

    from tformer_core import bundled
    translator = bundled.load_bundled("translator")        # or tc.load_model("translator")
    bundled.evaluation.translate(translator, "the big dog chases a small cat")   # ['varo', 'gros', ...]

loading (assets/ -> models), tokenizer (the translator's word tokenizer), data (the generated
languages and shape scenes), train (reproducible training, `python -m tformer_core.bundled.train`),
evaluation (what the model cards report), cards (the model cards, from the recorded figures),
mae_tiny and detr_tiny (training and measuring the masked autoencoder and the DETR), boxes (their box maths).
"""

from . import evaluation
from .loading import (
    ASSETS_DIR,
    BUNDLED_MODELS,
    asset_dir,
    file_sha256,
    load_bundled,
    load_from_dir,
    model_card,
    recorded,
)
from .tokenizer import WordTokenizer

__all__ = [
    "ASSETS_DIR",
    "BUNDLED_MODELS",
    "WordTokenizer",
    "asset_dir",
    "evaluation",
    "file_sha256",
    "load_bundled",
    "load_from_dir",
    "model_card",
    "recorded",
]
