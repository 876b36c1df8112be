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
    """Max |ours - theirs| <= atol, after asserting equal shapes (broadcasting would hide a missing axis)."""
    theirs = np.asarray(theirs.detach().float() if isinstance(theirs, torch.Tensor) else theirs, dtype=np.float64)
    ours = np.asarray(ours.detach().float() if isinstance(ours, torch.Tensor) else ours, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != reference shape {theirs.shape}"
    diff = float(np.max(np.abs(ours - theirs)))
    assert diff <= atol, f"{what}: max |difference| {diff:.2e} > {atol}"
    return diff


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


CORPUS = [
    "The house is wonderful.",
    "The cat sat on the mat.",
    "Das Haus ist wunderbar.",
    "Die Katze sass.",
    "translate English to German: The dog runs.",
    "Attention is all you need.",
] * 4


def save_tiny_t5(folder: Path, seed: int = 0, **size) -> Path:
    """A tiny random T5 with its own small BPE tokenizer (trained here, offline), in the Hugging Face layout.

    The tokenizer ends every text with </s>, as T5's does; <pad> (0) starts the decoder, </s> (1) ends it.
    `size` overrides the T5Config sizes (d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads),
    e.g. for a t5-small-sized model in a benchmark.
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"]))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(seed)
    sizes = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, **size}
    config = transformers.T5Config(
        vocab_size=len(tokenizer),
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        **sizes,
    )
    model = transformers.T5ForConditionalGeneration(config)
    perturbed(model, seed, scale=0.5)  # sharper attention than the init's
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ---- tiny models of architectures the core does not implement (run through transformers) ----------------
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "rug", "big", "small", "red", "blue", "is"]
WORDS += ["was", "and"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
EAGER = dict(attn_implementation="eager")  # the reference hands out its attention weights too


def save_with_words(hf_model, folder: Path, tokenizer: bool = True) -> Path:
    """The model saved in the Hugging Face layout, with a WordPiece tokenizer over VOCAB (unless tokenizer=False)."""
    import transformers as T

    hf_model.save_pretrained(folder)
    if tokenizer:
        (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
        T.BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    return folder


def tiny_opt():
    """A tiny random OPT (2 layers x 4 heads): a decoder-only architecture the core does not implement."""
    import transformers as T

    torch.manual_seed(2)
    config = T.OPTConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=37,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        **EAGER,
    )
    return perturbed(T.OPTForCausalLM(config), scale=0.3)


def tiny_pegasus():
    """A tiny random Pegasus (2 + 2 layers x 4 heads): an encoder-decoder the core does not implement."""
    import transformers as T

    torch.manual_seed(3)
    config = T.PegasusConfig(
        vocab_size=len(VOCAB),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=3,
        decoder_start_token_id=0,
        forced_eos_token_id=3,
        **EAGER,
    )
    return perturbed(T.PegasusForConditionalGeneration(config), scale=0.3)
