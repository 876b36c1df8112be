"""The four kinds of model, each the contract its families keep: what `trace` takes, whether it generates.

    EncoderModel         text in, every token sees every other (BERT, MiniLM; ELECTRA run by transformers)
    CausalLM             text in, each token sees the ones before it; generate() continues a prompt (GPT-2, Llama)
    EncoderDecoderModel  a source and a target; generate() writes the target (the original Transformer, Marian)
    VisionModel          a preprocessed image in, patches as tokens (ViT, DeiT)

Every family derives from one of them (`Encoder` and `TransformersEncoder` are both `EncoderModel`s), so a
view narrows a model it was handed with `isinstance(model, CausalLM)` and then calls what the kind declares;
the type checker holds each family to its kind's signatures. What differs within a kind (sampling, a
key/value cache, Q/K/V in traces, a chat template) is declared in `model.capabilities`, never probed.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from ..capture import NameFilter
from ..generation import Generation, GenerationSettings, Sampling
from ..inputs.preprocessing import ImagePreprocessing
from ..tokenizers import Tokenizer
from ..trace import Trace
from .base import Capabilities, ConfigT, ModelKind, TokenInput, TracedModel


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
    ) -> Trace:
        """Trace one sequence: text (needs a tokenizer) or token ids; `pair` is a second text segment."""


class CausalLM(TracedModel[ConfigT]):
    """A decoder-only language model: position i sees positions 0..i; head.logits scores the next token."""

    kind: ClassVar[ModelKind] = "decoder"
    main_stack: ClassVar[str] = "decoder"
    generation: GenerationSettings  # start, stop and forbidden tokens, read from the checkpoint

    @abstractmethod
    def trace(
        self, inputs: TokenInput, attention_mask: Sequence[int] | None = None, keep: NameFilter | None = None
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
    ) -> Generation:
        """Continue `prompt`, one traced pass per new token. sampling: None (or a greedy one) decodes greedily;
        a model whose capabilities say no sampling raises ValueError for any other. keep: the steps' filter
        (a step trace keeps its attention weights and logits in any case)."""

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
            raise ValueError("this model's tokenizer has no chat template: give the prompt as plain text")
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
    def trace(self, image: torch.Tensor | np.ndarray, keep: NameFilter | None = None) -> Trace:
        """Trace one preprocessed image (C, H, W) or (1, C, H, W)."""

    @abstractmethod
    def trace_batch(self, images: torch.Tensor | np.ndarray, keep: NameFilter | None = None) -> list[Trace]:
        """Trace a batch (B, C, H, W) in one pass; one Trace per image."""
