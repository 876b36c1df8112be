"""tformer core: instrumented Transformer and ViT models whose every intermediate can be seen.

    import tformer_core as tc
    model = tc.Encoder(tc.EncoderConfig(vocab_size=100, n_layers=2))
    trace = model.trace([5, 17, 42])
    trace.attention(layer=0, head=1)        # [n, n], rows sum to 1
    trace.q(0, 1), trace["encoder.0.attn.scores"]
    model.weights().block(0).attn.W_Q       # [heads, d_model, d_head], TransformerLens's shapes
    isinstance(model, tc.EncoderModel), model.capabilities   # its kind's contract, what it offers besides
                                            # (kinds: EncoderModel, CausalLM, EncoderDecoderModel, VisionModel,
                                            #  MaskedAutoencoder, DetectionModel, PoolingModel, RecurrentSeq2Seq)

The engine a notebook imports: torch and numpy, no Streamlit, no charts, no page logic (a test
checks). The views (tformer_views) and the app (tformer_app) import the core, never the other way,
and read it through its public API: traces, `model.weights()`, the kinds and their capabilities.
"""

from .block_steps import (
    FFNSteps,
    LayerNormSteps,
    PatchEmbeddingSteps,
    RMSNormSteps,
    ffn_steps,
    layer_norm_steps,
    patch_embedding_steps,
    rms_norm_steps,
)
from .capture import HookPoint, capture
from .checkpoints import CheckpointError, load_model
from .errors import InputError
from .generation import Generation, GenerationSettings, Sampling, next_token_probabilities, next_token_table
from .inputs.image_file import ImageError, LoadedImage, read_image
from .inputs.preprocessing import ImagePreprocessing
from .inputs.text import FittedInput, fit_to_model
from .metrics import mean_attention_distance, mean_token_distance, patch_centre_distances, uniform_attention
from .models.base import Capabilities, TracedModel, default_device, resolve_dtype
from .models.decoder import Decoder, DecoderConfig
from .models.encoder import Encoder, EncoderConfig, class_scores, first_token_attention
from .models.fallback import TransformersModel
from .models.kinds import (
    CausalLM,
    DetectionModel,
    EncoderDecoderModel,
    EncoderModel,
    MaskedAutoencoder,
    PoolingModel,
    RecurrentSeq2Seq,
    VisionModel,
)
from .models.layers import BlockConfig, MultiHeadAttention, causal_mask, patchify
from .models.llama import Llama, LlamaConfig
from .models.positional import (
    Rope,
    rope_attention_factor,
    rope_frequencies,
    rope_pair_dims,
    rope_rotate,
    rope_rotation,
    rope_scores,
    sinusoidal_encoding,
)
from .models.seq2seq import EncoderDecoder, Seq2SeqConfig
from .models.vit import ViT, ViTConfig
from .models.weights import AttentionWeights, BlockWeights, FFNWeights, NormWeights, PatchWeights, StackWeights
from .numerics import softmax
from .projection import QKProjection, project_qk, qk_projection
from .steps import AttentionSteps, attention_from_qkv, attention_steps
from .tokenizers import HFTokenizer, Tokenizer
from .trace import Trace, TraceMeta
from .workload import TooMuchWork, Workload
from .workload import check as check_workload

__all__ = [
    "AttentionSteps",
    "AttentionWeights",
    "BlockConfig",
    "BlockWeights",
    "Capabilities",
    "CausalLM",
    "CheckpointError",
    "Decoder",
    "DecoderConfig",
    "DetectionModel",
    "Encoder",
    "EncoderConfig",
    "EncoderDecoder",
    "EncoderDecoderModel",
    "EncoderModel",
    "FFNSteps",
    "FFNWeights",
    "FittedInput",
    "Generation",
    "GenerationSettings",
    "HFTokenizer",
    "HookPoint",
    "ImageError",
    "ImagePreprocessing",
    "InputError",
    "LayerNormSteps",
    "Llama",
    "LlamaConfig",
    "LoadedImage",
    "MaskedAutoencoder",
    "MultiHeadAttention",
    "NormWeights",
    "PatchEmbeddingSteps",
    "PatchWeights",
    "PoolingModel",
    "QKProjection",
    "RMSNormSteps",
    "RecurrentSeq2Seq",
    "Rope",
    "Sampling",
    "Seq2SeqConfig",
    "StackWeights",
    "Tokenizer",
    "TooMuchWork",
    "Trace",
    "TraceMeta",
    "TracedModel",
    "TransformersModel",
    "ViT",
    "ViTConfig",
    "VisionModel",
    "Workload",
    "attention_from_qkv",
    "attention_steps",
    "capture",
    "causal_mask",
    "check_workload",
    "class_scores",
    "default_device",
    "ffn_steps",
    "first_token_attention",
    "fit_to_model",
    "layer_norm_steps",
    "load_model",
    "mean_attention_distance",
    "mean_token_distance",
    "next_token_probabilities",
    "next_token_table",
    "patch_centre_distances",
    "patch_embedding_steps",
    "patchify",
    "project_qk",
    "qk_projection",
    "read_image",
    "resolve_dtype",
    "rms_norm_steps",
    "rope_attention_factor",
    "rope_frequencies",
    "rope_pair_dims",
    "rope_rotate",
    "rope_rotation",
    "rope_scores",
    "sinusoidal_encoding",
    "softmax",
    "uniform_attention",
]
