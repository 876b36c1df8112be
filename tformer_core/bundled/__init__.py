"""The models this project trains itself and ships in `assets/`, loaded offline.

    from tformer_core import bundled
    translator = bundled.load_bundled("translator")        # or tc.load_model("translator")
    bundled.model_card("translator"); bundled.recorded("translator")["evaluation"]

loading (assets/ -> models), tokenizer (the translator's word tokenizer), sentence_tokenizer (the
sentiment models'). Training them, their data, evaluation and model cards are `tformer_train`'s
(`python -m tformer_train.train <name>`).
"""

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
    "file_sha256",
    "load_bundled",
    "load_from_dir",
    "model_card",
    "recorded",
]
