"""The kinds of model, each the contract its families keep: what `trace` takes, whether it generates.

    EncoderModel         text in, every token sees every other (BERT, MiniLM; ELECTRA run by transformers)
    CausalLM             text in, each token sees the ones before it; generate() continues a prompt (GPT-2, Llama)
    EncoderDecoderModel  a source and a target; generate() writes the target (the original Transformer, Marian)
    VisionModel          a preprocessed image in, patches as tokens (ViT, DeiT)
    MaskedAutoencoder    a preprocessed image in, most patches masked; the decoder rebuilds their pixels (ViT-MAE)
    DetectionModel       a preprocessed picture in, CNN features as tokens; object queries give boxes (DETR)
    and the attention before Transformers, without Transformer blocks:
    PoolingModel         a sentence in, one weight per word, a class out (attention pooling, or the mean)
    RecurrentSeq2Seq     a source and a target; an RNN decoder attends over the source at every step

Every family derives from one of them (`Encoder` and `TransformersEncoder` are both `EncoderModel`s), so a
view narrows a model it was handed with `isinstance(model, CausalLM)` and then calls what the kind declares;
the type checker holds each family to its kind's signatures. What differs within a kind (sampling, a
key/value cache, Q/K/V in traces, a chat template) is declared in `model.capabilities`, never probed.
Every kind's `trace` takes `edits`, interventions applied in its pass (and in a recurrent model's greedy
decoding before it), their names checked against `model.hook_names` before anything runs (`TracedModel.intervene`).

A trace's `kind` is its model's. The structure the views read follows from it (`Trace.attention_stacks`):
an encoder-decoder's and DETR's decoder reads the encoder through cross-attention; MAE's decoder has a
sequence of its own (every patch) and, like any stack, may have its own number of heads (`Trace.heads_in`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import ClassVar, Protocol

import numpy as np
import torch

from ..capture import Edit, NameFilter
from ..errors import InputError
from ..generation import Generation, GenerationSettings, Sampling
from ..inputs.preprocessing import ImagePreprocessing
from ..tokenizers import Tokenizer
from ..trace import Trace
from .base import Capabilities, ConfigT, ModelKind, TokenInput, TracedModel

__all__ = [
    "CausalLM",
    "DetectionModel",
    "EncoderDecoderModel",
    "EncoderModel",
    "MaskedAutoencoder",
    "PoolingModel",
    "RecurrentSeq2Seq",
    "VisionModel",
    "WordTokenizing",
]


class EncoderModel(TracedModel[ConfigT]):
    """A bidirectional text encoder: one trace per sequence, with an optional second segment (`pair`).

    mask_token_id: the tokenizer's [MASK] id when the model guesses masked words, else None.
    """

    kind: ClassVar[ModelKind] = "encoder"
    main_stack: ClassVar[str] = "encoder"
    mask_token_id: int | None

    @abstractmethod
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
        """Trace one sequence: text (needs a tokenizer) or token ids; `pair` is a second text segment."""


class CausalLM(TracedModel[ConfigT]):
    """A decoder-only language model: position i sees positions 0..i; head.logits scores the next token."""

    kind: ClassVar[ModelKind] = "decoder"
    main_stack: ClassVar[str] = "decoder"
    generation: GenerationSettings  # start, stop and forbidden tokens, read from the checkpoint

    @abstractmethod
    def trace(
        self,
        inputs: TokenInput,
        attention_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids."""

    @abstractmethod
    def generate(
        self,
        prompt: TokenInput,
        max_new_tokens: int | None = None,
        *,
        sampling: Sampling | None = None,
        keep: NameFilter | None = None,
        final_trace: bool = True,
    ) -> Generation:
        """Continue `prompt`, one traced pass per new token. sampling: None (or a greedy one) decodes greedily;
        a model whose capabilities say no sampling raises InputError for any other. keep: the steps' filter
        (a step trace keeps its attention weights and logits in any case). final_trace: False skips the
        teacher-forced pass over the final sequence (`Generation.trace` is then None)."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, head="next-token", generates=True, chat_template=bool(self.chat_template))

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's chat template (Jinja), or None when its tokenizer has none."""
        return self.tokenizer.chat_template if self.tokenizer is not None else None

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The text the model is trained to continue for a conversation: messages [{"role": "user",
        "content": "..."}, ...] through the checkpoint's chat template, with the assistant's turn opened."""
        if self.tokenizer is None or self.tokenizer.chat_template is None:
            raise InputError("this model's tokenizer has no chat template: give the prompt as plain text")
        return self.tokenizer.apply_chat_template(messages)


class EncoderDecoderModel(TracedModel[ConfigT]):
    """An encoder reading a source and a decoder writing a target, its cross-attention reading the encoder.

    target_tokenizer: reads the target side when it differs from the source's (None: `tokenizer` reads both).
    """

    kind: ClassVar[ModelKind] = "encoder-decoder"
    main_stack: ClassVar[str] = "encoder"
    target_tokenizer: Tokenizer | None
    generation: GenerationSettings

    @abstractmethod
    def trace(
        self,
        source: TokenInput,
        target: TokenInput,
        source_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one pair with teacher forcing: `target` is the decoder's input (starting with its start token)."""

    @abstractmethod
    def generate(self, source: TokenInput, max_new_tokens: int | None = None) -> Generation:
        """Greedy output for `source`: the encoder runs once, then one traced decoder pass per new token."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, head="next-token", generates=True)


class VisionModel(TracedModel[ConfigT]):
    """A Vision Transformer: a preprocessed image (C, H, W) in, its patches (after the prefix tokens) as tokens.

    preprocessing: how a photo becomes the input tensor (set by loaders), or None.
    """

    kind: ClassVar[ModelKind] = "vit"
    main_stack: ClassVar[str] = "encoder"
    preprocessing: ImagePreprocessing | None

    @abstractmethod
    def trace(
        self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> Trace:
        """Trace one preprocessed image (C, H, W) or (1, C, H, W)."""

    @abstractmethod
    def trace_batch(
        self, images: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> list[Trace]:
        """Trace a batch (B, C, H, W) in one pass; one Trace per image."""


class MaskedAutoencoder(TracedModel[ConfigT]):
    """A ViT encoder that sees the patches left visible by a random mask, and a ViT decoder that predicts the
    pixels of the masked ones (He et al. 2022).

    Its trace has two stacks: "encoder" over [CLS] and the visible patches (`tokens`, in the order they were
    kept), "decoder" over [CLS] and every patch (`target_tokens`); `encoder.embed.mask` [patches] is 1 where a
    patch was masked; head.pixels [patches, P*P*C] the prediction. preprocessing: how a photo becomes the
    input tensor (set by loaders), or None.
    """

    kind: ClassVar[ModelKind] = "mae"
    main_stack: ClassVar[str] = "encoder"
    preprocessing: ImagePreprocessing | None

    @abstractmethod
    def trace(
        self,
        image: torch.Tensor | np.ndarray,
        seed: int = 0,
        noise: torch.Tensor | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one preprocessed image (C, H, W) with the patches masked by `seed` (or by `noise` (1, N):
        the patches with the smallest numbers are kept)."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, head="pixels")


class DetectionModel(TracedModel[ConfigT]):
    """A CNN's feature map read by a Transformer encoder, and a decoder over a fixed set of object queries, each
    of which ends as a box and a class or "no object" (DETR, Carion et al. 2020).

    Its trace: `tokens` name the feature cells ("r{row}c{col}", `grid_hw` the feature grid), `target_tokens` the
    object queries; the decoder's cross-attention is [queries, cells], its self-attention [queries, queries];
    head.logits [queries, classes + 1] (the last: "no object"), head.boxes [queries, 4] (cx, cy, w, h as
    fractions of the picture).
    """

    kind: ClassVar[ModelKind] = "detr"
    main_stack: ClassVar[str] = "encoder"

    @abstractmethod
    def trace(
        self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()
    ) -> Trace:
        """Trace one preprocessed picture (C, H, W); the feature grid follows its size."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, head="detection")


class WordTokenizing(Tokenizer, Protocol):
    """A word-level tokenizer (the bundled models' `WordTokenizer`): one id per word of a fixed vocabulary."""

    vocab: list[str]
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    def words(self, text: str) -> list[str]:
        """The words `encode` reads of `text`, in order (an unknown one is read as <unk>)."""


class PoolingModel(TracedModel[ConfigT]):
    """A sentence classifier without Transformer blocks: each word gets one score, a softmax over the words
    turns the scores into weights, the weighted sum of the word vectors is classified (attention pooling;
    or every weight 1/n: mean pooling). Its trace: pool.word_scores, pool.weights [words], pool.context,
    head.logits [classes]."""

    kind: ClassVar[ModelKind] = "pooling"
    main_stack: ClassVar[str] = "encoder"
    tokenizer: WordTokenizing | None

    @abstractmethod
    def trace(self, inputs: TokenInput, keep: NameFilter | None = None, *, edits: Iterable[Edit] = ()) -> Trace:
        """Trace one sentence: text (needs a tokenizer) or word ids."""

    def words(self, text: str) -> list[str]:
        """The words the model reads of `text`, in order, unknown ones included (ValueError without a tokenizer)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass word ids instead of text")
        return self.tokenizer.words(text)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(qkv=False, weights=False, head="classification")


class RecurrentSeq2Seq(TracedModel[ConfigT]):
    """An RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015): at every output step the
    decoder scores each source annotation, softmaxes the scores into weights and reads their weighted sum.
    Its trace: encoder.states [J, H], decoder.states [M, H], attn.energies and attn.weights [M, J] (one row per
    output step), attn.context [M, H], head.logits [M, vocab]; `target_tokens` are the decoder's inputs.

    target_tokenizer: reads and writes the target side.
    """

    kind: ClassVar[ModelKind] = "rnn-seq2seq"
    main_stack: ClassVar[str] = "encoder"
    tokenizer: WordTokenizing | None
    target_tokenizer: WordTokenizing | None

    @abstractmethod
    def trace(
        self,
        source: TokenInput,
        target: TokenInput | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one translation: the model's own greedy output (target None) or a given target (teacher
        forcing, starting with the start token)."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(qkv=False, weights=False, head="next-token")
