"""The models this project trains itself and ships in assets/: loading, tokenizer, data, training."""

from .loading import *  # noqa: F403
from .loading import BUNDLED_MODELS, load_bundled, model_card  # noqa: F401
