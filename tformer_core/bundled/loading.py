"""The models this project trains itself and ships in `assets/`: loading, tokenizing, using them.

    from tformer_core.bundled import load_bundled, translate
    model = load_bundled("translator")
    translate(model, "the big dog chases a small cat")   # ['varo', 'gros', 'ta', 'ga', ...]
    vit = load_bundled("vit-tiny")
    vit(prepare_image(vit, pixels))                        # pixels: (32, 32, 3) uint8 or floats in [0, 1]

Each asset folder holds `config.json` (family, core config, special token ids, preprocessing),
`model.safetensors`, the vocabulary or label files and `MODEL_CARD.md`. They are written by
`python -m tformer_core.bundled.train <name>`; nothing here reaches the network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import load_model as load_safetensors_model

from ..capture import capture
from ..generation import GenerationSettings
from ..inputs.preprocessing import ImagePreprocessing
from ..models.base import TracedModel
from ..models.seq2seq import EncoderDecoder, Seq2SeqConfig
from ..models.vit import ViT, ViTConfig
from .data import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
BUNDLED_MODELS: dict[str, str] = {"translator": "translator", "vit-tiny": "vit-tiny"}  # name -> folder in assets/
FAMILIES = {"encoder-decoder": (EncoderDecoder, Seq2SeqConfig), "vit": (ViT, ViTConfig)}

CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = "config.json", "model.safetensors", "MODEL_CARD.md"

# Sentence punctuation is dropped rather than turned into <unk>: the toy languages have none,
# and "The dog sleeps." should read as the sentence the user meant.
_PUNCTUATION = re.compile(r"[.,!?;:\"]")


class WordTokenizer:
    """Word-level tokenizer over a fixed vocabulary: lower-case, drop punctuation, split on spaces.

    Unknown words become `<unk>` (they are shown as `<unk>`, never silently replaced by a known
    word). Special tokens written in the text (`<bos>`, ...) map to themselves. With
    `prepend_bos`, `encode` starts the ids with `<bos>` (the decoder's input always does),
    unless the text already starts with it.
    """

    def __init__(self, vocab: Sequence[str], prepend_bos: bool = False) -> None:
        vocab = list(vocab)
        if list(vocab[: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
            raise ValueError(f"a vocabulary must start with the special tokens {SPECIAL_TOKENS}, got {vocab[:4]}")
        if len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary lists a word twice")
        self.vocab: list[str] = vocab
        self.index: dict[str, int] = {w: i for i, w in enumerate(vocab)}
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.index[t] for t in (PAD, BOS, EOS, UNK))
        self.prepend_bos = prepend_bos

    def __len__(self) -> int:
        return len(self.vocab)

    def words(self, text: str) -> list[str]:
        """The words `encode` sees: lower-cased, punctuation dropped, split on whitespace."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        return _PUNCTUATION.sub(" ", text.lower()).split()

    def unknown_words(self, text: str) -> list[str]:
        """The words of `text` that are not in the vocabulary (each becomes `<unk>`)."""
        return [w for w in self.words(text) if w not in self.index]

    def encode(self, text: str) -> list[int]:
        ids = [self.index.get(w, self.unk_id) for w in self.words(text)]
        if self.prepend_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"token id {i} is outside the vocabulary (0..{len(self.vocab) - 1})")
            out.append(self.vocab[i])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, special tokens other than <unk> left out."""
        skip = {self.pad_id, self.bos_id, self.eos_id}
        return " ".join(self.vocab[int(i)] for i in ids if int(i) not in skip)


# ---- files ---------------------------------------------------------------------------------
def asset_dir(name: str) -> Path:
    """The asset folder of a bundled model; ValueError naming the known models for any other name."""
    if name not in BUNDLED_MODELS:
        raise ValueError(f"unknown bundled model {name!r}: the bundled models are {sorted(BUNDLED_MODELS)}")
    return ASSETS_DIR / BUNDLED_MODELS[name]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def config_to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_from_dir(
    folder: str | Path, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Build a bundled-format model from a folder (what `train` writes) and place it on `device` in `dtype`."""
    folder = Path(folder)
    for needed in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise ValueError(
                f"{folder} has no {needed}: write it with `python -m tformer_core.bundled.train <name> --out {folder}`"
            )
    meta = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    family = meta.get("family")
    if family not in FAMILIES:
        raise ValueError(f"{folder / CONFIG_FILE}: unknown family {family!r}, expected one of {sorted(FAMILIES)}")
    model_cls, config_cls = FAMILIES[family]
    fields = dict(meta["config"])
    if isinstance(fields.get("image_size"), list):
        fields["image_size"] = tuple(fields["image_size"])
    model = model_cls(config_cls(**fields))
    # strict: a renamed or missing tensor must fail here, not produce a half-random model.
    load_safetensors_model(model, str(folder / WEIGHTS_FILE), strict=True, device="cpu")
    model.bundled_meta = meta  # config.json as read: preprocessing, special tokens, training record

    if family == "encoder-decoder":
        model.tokenizer = WordTokenizer(read_lines(folder / meta["source_vocab"]))
        model.target_tokenizer = WordTokenizer(read_lines(folder / meta["target_vocab"]), prepend_bos=True)
        for side, tok in (("source", model.tokenizer), ("target", model.target_tokenizer)):
            expected = meta["special_tokens"]
            got = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id, "unk": tok.unk_id}
            if got != expected:
                raise ValueError(
                    f"{folder}: the {side} vocabulary's special ids {got} differ from config.json {expected}"
                )
        if (
            len(model.tokenizer) != model.config.src_vocab_size
            or len(model.target_tokenizer) != model.config.tgt_vocab_size
        ):
            raise ValueError(f"{folder}: vocabulary files do not match the vocabulary sizes in config.json")
        tgt = model.target_tokenizer
        model.output_labels = list(tgt.vocab)  # predictions name target words, not ids
        # generate() starts from <bos>, stops at <eos>, never emits <pad> or a second <bos>.
        model.generation = GenerationSettings(
            eos_id=tgt.eos_id,
            start_id=tgt.bos_id,
            pad_id=tgt.pad_id,
            suppress_ids=(tgt.pad_id, tgt.bos_id),
            max_new_tokens=int(meta.get("max_target_length", model.config.max_positions - 1)),
        )
    else:
        model.class_names = read_lines(folder / meta["labels"])
        if len(model.class_names) != model.config.n_classes:
            raise ValueError(f"{folder}: {len(model.class_names)} labels for {model.config.n_classes} classes")
        pre = meta["preprocessing"]
        # The same preprocessing object as the hub ViTs, so the app treats every ViT alike. Photos
        # are resized (bilinear, antialiased by PIL when shrinking) to the training size.
        model.preprocessing = ImagePreprocessing(
            resize=("exact", tuple(pre["image_size"])),
            crop=None,
            resample=2,
            rescale=1 / 255,
            mean=tuple(pre["mean"]),
            std=tuple(pre["std"]),
        )
    return model.place(device, dtype)


def load_bundled(
    name: str, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> TracedModel:
    """Load a bundled model by name ("translator", "vit-tiny") from assets/, offline, in eval mode."""
    return load_from_dir(asset_dir(name), device, dtype)


def model_card(name: str) -> str:
    """The markdown model card of a bundled model."""
    return (asset_dir(name) / CARD_FILE).read_text(encoding="utf-8")


# ---- translator ----------------------------------------------------------------------------
def _require_translator(model: TracedModel) -> None:
    if not isinstance(model, EncoderDecoder) or model.tokenizer is None or model.target_tokenizer is None:
        raise ValueError("translate() needs an encoder-decoder model with source and target tokenizers")


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged id lists -> (ids (B, L) long, mask (B, L) long: 1 real, 0 padding)."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every sequence needs at least one token")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


@torch.inference_mode()
def greedy_decode(
    model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, bos_id: int, eos_id: int
) -> list[list[int]]:
    """Batched greedy decoding: src (B, S), src_mask (B, S) -> target ids per row, without BOS / EOS.

    The memory is computed once; the decoder re-reads the whole prefix at each step (no cache:
    sentences are short and this keeps the decoder the plain traced module).
    """
    device = model.device
    src, src_mask = src.to(device), src_mask.to(device)
    memory = model.encode(src, src_mask)  # (B, S, D)
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=device)
    for _ in range(max_len):
        logits = model.decode(out, memory, src_mask)[:, -1]  # (B, V)
        nxt = logits.argmax(dim=-1)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    result = []
    for row in out[:, 1:].tolist():
        result.append(row[: row.index(eos_id)] if eos_id in row else row)
    return result


def translate_batch(model: TracedModel, sentences: Sequence[str], max_len: int | None = None) -> list[list[str]]:
    """Greedy translations of source sentences, as target word lists (without <bos> / <eos>)."""
    _require_translator(model)
    src_tok, tgt_tok = model.tokenizer, model.target_tokenizer
    rows = [src_tok.encode(s) for s in sentences]
    for s, r in zip(sentences, rows):
        if not r:
            raise ValueError(f"the sentence {s!r} has no words to translate")
        if len(r) > model.config.max_positions:
            raise ValueError(
                f"the sentence {s!r} has {len(r)} words; the model reads at most {model.config.max_positions}"
            )
    if max_len is None:
        max_len = (
            model.bundled_meta.get("max_target_length", model.config.max_positions - 1)
            if hasattr(model, "bundled_meta")
            else model.config.max_positions - 1
        )
    if not 1 <= max_len <= model.config.max_positions - 1:
        raise ValueError(f"max_len must be between 1 and {model.config.max_positions - 1}, got {max_len}")
    src, mask = pad_batch(rows, src_tok.pad_id)
    ids = greedy_decode(model, src, mask, max_len, tgt_tok.bos_id, tgt_tok.eos_id)
    return [tgt_tok.convert_ids_to_tokens(r) for r in ids]


def translate(model: TracedModel, sentence: str, max_len: int | None = None) -> list[str]:
    """Greedy translation of one source sentence: the target words (without <bos> / <eos>)."""
    return translate_batch(model, [sentence], max_len)[0]


def translation_accuracy(model: TracedModel, pairs: Sequence[Any], batch_size: int = 256) -> float:
    """Exact-match sentence accuracy of greedy translation over `pairs` (toy_data.Pair)."""
    if not pairs:
        raise ValueError("no pairs to evaluate")
    correct = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        outputs = translate_batch(model, [p.source_text for p in chunk])
        correct += sum(list(out) == list(p.target) for out, p in zip(outputs, chunk))
    return correct / len(pairs)


@torch.inference_mode()
def cross_attention(model: EncoderDecoder, pair: Any) -> np.ndarray:
    """Teacher-forced cross-attention of one pair: [layers, heads, T+1, S].

    Row t is the decoder position whose input is target word t-1 (row 0: <bos>) and which
    predicts target word t (the last row predicts <eos>).
    """
    src = model.tokenizer.encode(pair.source_text)
    tgt = model.target_tokenizer.encode(pair.target_text)  # starts with <bos>
    trace = model.trace(src, tgt, keep=lambda n: n.endswith("cross_attn.weights"))
    return trace.all_attention("cross")


def alignment_accuracy(model: TracedModel, pairs: Sequence[Any]) -> np.ndarray:
    """For each (decoder layer, head): the share of aligned target words whose cross-attention
    argmax (at the position that predicts the word) is the gold source word. -> [layers, heads]."""
    _require_translator(model)
    hits, total = None, 0
    for p in pairs:
        w = cross_attention(model, p)  # (L, H, T+1, S)
        rows = [t for t, a in enumerate(p.alignment) if a is not None]
        gold = np.array([p.alignment[t] for t in rows])
        argmax = w[:, :, rows, :].argmax(-1)  # (L, H, n)
        h = (argmax == gold).sum(-1)
        hits = h if hits is None else hits + h
        total += len(rows)
    return hits / total


# ---- vit-tiny ------------------------------------------------------------------------------
def prepare_image(model: TracedModel, image: Any) -> torch.Tensor:
    """An image as the bundled ViT expects it: (C, H, W) float32, normalised with the stored mean/std.

    `image`: a PIL image, or an array / tensor (H, W, 3) or (3, H, W), uint8 0..255 or floats in
    [0, 1]. Other sizes are resized (bilinear, antialiased) to the model's input size.
    """
    pre = getattr(model, "bundled_meta", {}).get("preprocessing")
    if pre is None:
        raise ValueError("this model has no preprocessing description (load it with load_bundled)")
    if hasattr(image, "convert"):  # PIL
        image = np.asarray(image.convert("RGB"))
    t = torch.as_tensor(np.asarray(image) if not isinstance(image, torch.Tensor) else image)
    if t.dim() != 3 or (t.shape[-1] != 3 and t.shape[0] != 3):
        raise ValueError(f"expected an RGB image (H, W, 3) or (3, H, W), got shape {tuple(t.shape)}")
    if t.shape[0] != 3:
        t = t.permute(2, 0, 1)  # (3, H, W)
    if t.dtype == torch.uint8:
        t = t.float() / 255.0
    elif t.is_floating_point():
        t = t.float()
        if float(t.min()) < 0.0 or float(t.max()) > 1.0:
            raise ValueError("float pixel values must lie in [0, 1] (or pass uint8 0..255)")
    else:
        raise ValueError(f"pixels must be uint8 or float, got {t.dtype}")
    size = tuple(pre["image_size"])
    if tuple(t.shape[1:]) != size:
        t = torch.nn.functional.interpolate(t[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    mean = torch.tensor(pre["mean"]).view(3, 1, 1)
    std = torch.tensor(pre["std"]).view(3, 1, 1)
    return (t - mean) / std


def normalise(model: TracedModel, images: torch.Tensor) -> torch.Tensor:
    """A batch (B, 3, H, W) in [0, 1] at the model's size -> normalised with the stored mean/std."""
    pre = model.preprocessing
    mean = torch.tensor(pre.mean, dtype=images.dtype).view(1, 3, 1, 1)
    std = torch.tensor(pre.std, dtype=images.dtype).view(1, 3, 1, 1)
    return (images - mean) / std


@torch.inference_mode()
def classify(model: TracedModel, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Predicted class per image: images (B, 3, H, W) in [0, 1] -> (B,) long."""
    preds = []
    for start in range(0, images.shape[0], batch_size):
        x = normalise(model, images[start : start + batch_size]).to(model.device, model.dtype)
        preds.append(model(x).argmax(-1).cpu())
    return torch.cat(preds)


@torch.inference_mode()
def class_token_attention(
    model: TracedModel, images: torch.Tensor, layer: int = -1, batch_size: int = 250
) -> torch.Tensor:
    """The class token's attention over the patches in one layer, mean over heads: (B, N).

    Images (B, 3, H, W) in [0, 1]. Row 0 of the attention (the class token as query), keys 1..N
    (the patches, row-major); the mass the class token puts on itself is left out, so a row
    sums to 1 minus that mass.
    """
    n_layers = model.config.n_layers
    layer = layer % n_layers
    name = f"encoder.{layer}.attn.weights"
    out = []
    for start in range(0, images.shape[0], batch_size):
        x = normalise(model, images[start : start + batch_size]).to(model.device, model.dtype)
        with capture(lambda n: n == name) as sink:
            model(x)
        w = sink.tensors[name]  # (b, heads, n, n)
        out.append(w[:, :, 0, model.config.n_prefix_tokens :].mean(1).float().cpu())
    return torch.cat(out)
