"""Encoder-only text models: the original Transformer encoder and BERT-style encoders.

Every token attends to every other (bidirectional); a padding mask hides padded keys. An encoder may
carry one head: BERT's masked-word head (a guess for every position) or a sequence classifier (one
label for the whole input, read from the first token, [CLS] or <s>, as BERT, RoBERTa and DistilBERT's
`*ForSequenceClassification` models do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..attention import widened
from ..capture import Edit, HookPoint, NameFilter
from ..errors import InputError
from ..numerics import head_scores
from ..tokenizers import Tokenizer
from ..trace import Trace
from .base import Capabilities, TokenInput, per_token
from .kinds import EncoderModel
from .layers import ACTIVATIONS, BlockConfig, Stack, key_padding_mask, text_embedding

__all__ = [
    "POOL_ACTIVATIONS",
    "PROBLEM_TYPES",
    "Encoder",
    "EncoderConfig",
    "MaskedLMHead",
    "SequenceClassifierHead",
    "class_scores",
    "classifier_scoring",
    "first_token_attention",
]

POOL_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"tanh": torch.tanh, "relu": F.relu}
# transformers' problem_type values; "" when config.json names none.
PROBLEM_TYPES = ("", "single_label_classification", "multi_label_classification", "regression")


def classifier_scoring(problem_type: str, n_labels: int) -> str:
    """How a sequence classifier's logits become the scores shown, as transformers' text-classification
    pipeline decides: "none" for regression (the number itself), "sigmoid" per class for multi-label (or a
    single output), else "softmax" over the classes."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or n_labels == 1:
        return "sigmoid"
    return "softmax"


@dataclass(frozen=True, kw_only=True)
class EncoderConfig(BlockConfig):
    """BERT-style defaults: learned positions, LayerNorm after the embedding sum, post-norm blocks."""

    vocab_size: int = 1000
    max_positions: int = 512
    n_layers: int = 2
    positional: str = "learned"  # or "sinusoidal"
    pe_base: float = 10000.0
    n_token_types: int = 0  # BERT segments A/B: 2
    embed_norm: bool = True  # LayerNorm on token + position (+ segment) embeddings, as BERT
    embed_scale: bool = False  # token embedding * sqrt(d_model), as the original Transformer
    pe_layout: str = "interleaved"
    position_first_row: int = 0  # RoBERTa: position p uses row p + 2
    mlm_head: bool = False  # masked-word prediction head (dense, activation, LayerNorm, tied output)
    # Sequence classification head (n_labels > 0): pooled = act(h_[CLS] W_p + b_p), logits = pooled W_c + b_c.
    n_labels: int = 0
    pool_activation: str = "tanh"  # BERT's pooler and RoBERTa's classifier.dense: tanh; DistilBERT: relu
    labels: tuple[str, ...] = ()  # a name per class (config.json's id2label); default "LABEL_i"
    problem_type: str = ""  # transformers' problem_type: "single_label_classification", "multi_label_..."

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_labels < 0:
            raise ValueError(f"n_labels must be 0 (no classifier) or more, got {self.n_labels}")
        if self.n_labels and self.mlm_head:
            raise ValueError("an encoder has one head: a masked-word head or a classifier, not both")
        if self.pool_activation not in POOL_ACTIVATIONS:
            raise ValueError(f"pool_activation must be one of {sorted(POOL_ACTIVATIONS)}, got {self.pool_activation!r}")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type must be one of {PROBLEM_TYPES}, got {self.problem_type!r}")
        if self.labels and len(self.labels) != self.n_labels:
            raise ValueError(f"{len(self.labels)} labels given for {self.n_labels} classes")

    @property
    def class_labels(self) -> tuple[str, ...]:
        """A name per class of the classifier (empty without one)."""
        return self.labels or tuple(f"LABEL_{i}" for i in range(self.n_labels))

    @property
    def scoring(self) -> str:
        """How the classifier's logits become the scores shown (see `classifier_scoring`)."""
        return classifier_scoring(self.problem_type, self.n_labels)


class Encoder(EncoderModel[EncoderConfig]):
    """ids (B, T) -> final hidden states (B, T, D). Activations under `encoder.*`."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        c = config
        embed = text_embedding(c, c.vocab_size, n_token_types=c.n_token_types, scale=c.embed_scale, norm=c.embed_norm)
        self.encoder = Stack(c, c.n_layers, embed)
        self.head: MaskedLMHead | SequenceClassifierHead | None = None
        if c.mlm_head:
            self.head = MaskedLMHead(c, embed.tok.weight)
        elif c.n_labels:
            self.head = SequenceClassifierHead(c)
            self.output_labels = c.class_labels
        self.mask_token_id: int | None = None  # from a tokenizer that has [MASK] (see attach_tokenizer)
        self._finish_init()

    def attach_tokenizer(self, tokenizer: Tokenizer) -> None:
        super().attach_tokenizer(tokenizer)
        self.mask_token_id = tokenizer.mask_token_id

    @property
    def output_vocab_size(self) -> int:
        return self.config.vocab_size if self.config.mlm_head else 0

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        with_head: bool = False,
    ) -> torch.Tensor:
        """ids (B, T) long; attention_mask (B, T), 1 for real tokens and 0 for padding.

        Returns the final hidden states (B, T, D), or with `with_head` the head's output: masked-LM logits
        (B, T, vocab) or a classifier's logits (B, n_labels).
        """
        x = self.encoder.embed(ids, token_type_ids)
        mask = key_padding_mask(attention_mask) if attention_mask is not None else None
        hidden = self.encoder(x, self_mask=mask)  # (B, T, D)
        return self.head(hidden) if with_head and self.head is not None else hidden

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, D) -> the head's output: masked-word logits (B, T, vocab) or class logits (B, labels);
        the final norm first for a pre-norm encoder. ValueError without a head (MiniLM's sentence encoder)."""
        if self.head is None:
            raise ValueError("this encoder has no head (no masked-word head, no classifier) to read")
        norm = self.encoder.ln_final
        return self.head(norm(hidden) if norm is not None else hidden)

    @property
    def has_head(self) -> bool:
        """True when the encoder has a masked-word head or a classifier."""
        return self.config.mlm_head or self.config.n_labels > 0

    @property
    def capabilities(self) -> Capabilities:
        head = "classification" if self.config.n_labels else "masked-word" if self.config.mlm_head else None
        return Capabilities(head=head)

    def trace(
        self,
        inputs: TokenInput,
        attention_mask: Sequence[int] | None = None,
        token_type_ids: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        pair: str | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids.

        `pair`: a second text segment (BERT's sentence B): the tokenizer joins the two with its
        separator and numbers their segments 0 and 1. edits: applied in this pass, their names checked first
        (`intervene`).
        """
        if pair is not None:
            inputs, token_type_ids = self._encode_pair(inputs, pair)
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        types = per_token(token_type_ids, ids, "token_type_ids")
        masked = [i for i, t in enumerate(ids[0].tolist()) if t == self.mask_token_id]
        meta = {"predict_position": masked[0] if masked else None, "mask_positions": masked, **self._head_meta()}
        return self._trace(
            lambda: self(ids, mask, types, with_head=True),
            keep,
            meta=meta,
            edits=edits,
            tokens=tokens,
            stack_layers={"encoder": self.config.n_layers},
        )

    def _head_meta(self) -> dict:
        """What the trace says about the head: "head" is "masked-word", "classification" or None; a classifier's
        trace also names its problem_type and how its logits become probabilities ("softmax", "sigmoid",
        "none" for a regression score)."""
        c = self.config
        if c.n_labels:
            return {"head": "classification", "problem_type": c.problem_type or None, "probabilities": c.scoring}
        return {"head": "masked-word" if c.mlm_head else None}

    def _encode_pair(self, text: object, pair: str) -> tuple[list[int], list[int] | None]:
        if self.tokenizer is None or not isinstance(text, str):
            raise InputError("a second segment needs text input and a model with a tokenizer")
        if not text.strip() or not pair.strip():
            raise InputError("both segments need at least one word")
        ids, types = self.tokenizer.encode_pair(text, pair)
        return ids, types if self.config.n_token_types > 1 else None


class MaskedLMHead(nn.Module):
    """BERT's masked-word head: LN(act(h W_t + b_t)) E^T + b, with E the tied token embedding. Hook: logits."""

    def __init__(self, c: EncoderConfig, embedding: torch.Tensor) -> None:
        super().__init__()
        self.transform = nn.Linear(c.d_model, c.d_model)
        self.act = ACTIVATIONS[c.activation]
        self.ln = nn.LayerNorm(c.d_model, eps=c.ln_eps)
        self.unembed = nn.Linear(c.d_model, c.vocab_size)
        self.unembed.weight = embedding
        self.hook_logits = HookPoint()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.unembed(self.ln(self.act(self.transform(hidden))))  # (B, T, vocab)
        return self.hook_logits(widened(logits))  # at least float32 (see layers.LMHead)


class SequenceClassifierHead(nn.Module):
    """One label for the whole input, read from the first token ([CLS] / <s>):
    pooled = act(h_0 W_p + b_p), logits = pooled W_c + b_c. Hooks: pooled [D], logits [n_labels].

    BERT's pooler (tanh) and classifier, RoBERTa's classifier.dense (tanh) and out_proj, DistilBERT's
    pre_classifier (ReLU) and classifier are all this shape (their dropout is off at inference).
    """

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.pool = nn.Linear(c.d_model, c.d_model)
        self.act = POOL_ACTIVATIONS[c.pool_activation]
        self.classify = nn.Linear(c.d_model, c.n_labels)
        self.hook_pooled = HookPoint()
        self.hook_logits = HookPoint()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pooled = self.hook_pooled(self.act(self.pool(hidden[:, 0])))  # (B, D): the first token only
        return self.hook_logits(widened(self.classify(pooled)))  # (B, n_labels), at least float32


def class_scores(trace: Trace) -> list[tuple[str, float]]:
    """Every class of a sequence classifier's trace with its score, highest first: the softmax over the
    classes (single-label), each class's own sigmoid (multi-label: the scores need not sum to 1), or the
    raw output of a regression head, as the trace's meta["probabilities"] says."""
    if trace.meta.head != "classification" or "head.logits" not in trace:
        raise ValueError("this trace has no sequence classifier (no *ForSequenceClassification head)")
    logits = np.asarray(trace["head.logits"], dtype=np.float64)  # [n_labels]
    scores = head_scores(logits, trace.meta.probabilities)
    labels = trace.meta.labels or [f"LABEL_{i}" for i in range(len(logits))]
    order = np.argsort(-scores, kind="stable")
    return [(str(labels[i]), float(scores[i])) for i in order]


def first_token_attention(trace: Trace, layer: int = -1) -> np.ndarray:
    """[heads, n] the attention the first token ([CLS] / <s>: what a classifier reads) gives every token in
    `layer` (default the last), each row summing to 1: `trace.attention(layer)[:, 0, :]`."""
    return trace.attention(layer)[:, 0, :]
