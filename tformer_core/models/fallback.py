"""Models the core does not implement, run by transformers' own code and traced from what it hands out.

transformers runs the model with its eager attention (the attention matrix is built, not fused) and
returns, per layer, the attention weights softmax(Q K^T / sqrt(d_k)) of every head and the hidden states
between layers. That is enough for every view that reads only the weights (heatmaps, head view, overview,
attention distance, search) and for the residual stream; it is not enough for Q, K and V, which its
attention modules compute and never hand out. The trace says so (`meta["absent"]`, a sentence a page
can show) and holds, in the core's names:

    {stack}.{l}.attn.weights        [heads, n_q, n_k], rows summing to 1 (always stored: nothing recomputes them)
    {stack}.{l}.attn.mask           [1, n_q, n_k], True where attending is allowed (causal or padded models)
    decoder.{l}.cross_attn.weights  [heads, n_target, n_source] (encoder-decoder models)
    {stack}.{l}.resid_pre           [n, d_model], the hidden state entering layer l
    {stack}.out                     [n, d_model], the stack's final hidden states (after its last norm)
    head.logits                     [n, vocab] (masked-word, next-token) or [n_labels] (sequence classifier)

`meta["path"]` is "transformers" (the core's own models say "tformer"). The wrapped model is
`model.hf`, a transformers `PreTrainedModel` in eval mode; nothing of the checkpoint's own code runs
(see `tformer_core.checkpoints.fallback`, which builds these models).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn

from ..attention import widened
from ..capture import Edit, NameFilter, any_of, matching
from ..errors import InputError
from ..generation import Generation, GenerationSettings, Sampling, traced_steps
from ..tokenizers import Tokenizer
from ..trace import Trace, TraceMeta
from .base import Capabilities, TokenInput, TracedModel, per_token
from .kinds import CausalLM, EncoderDecoderModel, EncoderModel
from .layers import BlockConfig
from .weights import StackWeights

_WEIGHTS = matching("**.weights")
_KEPT_ALWAYS = matching("**.weights", "**.mask")  # with no Q and K, nothing recomputes them
# What a transformers-run trace cannot hold, by activation part; `absent_reason` says why.
ABSENT = ("attn.q", "attn.k", "attn.v", "attn.scores", "attn.scaled", "attn.z", "attn.out", "mlp", "ln")


@dataclass(frozen=True, kw_only=True)
class TransformersConfig(BlockConfig):
    """What the core knows of a model transformers runs: sizes read from one probing forward pass and
    config.json. head: "masked-word", "next-token", "classification" or None; scoring: how a classifier's
    logits become scores ("softmax", "sigmoid", "none"); causal: self-attention sees only earlier tokens
    (then the model is a decoder); dropped_head: an architecture whose head was left out (e.g. a question
    answering head), "" when the checkpoint's own head is there."""

    model_type: str
    architecture: str
    vocab_size: int
    max_positions: int | None = None
    n_layers: int = 0
    n_decoder_layers: int = 0
    head: str | None = None
    n_outputs: int = 0  # the head's outputs: a vocabulary, or classes
    labels: tuple[str, ...] = ()
    problem_type: str = ""
    scoring: str = "softmax"
    causal: bool = False
    dropped_head: str = ""


def absent_reason(config: TransformersConfig) -> str:
    """The sentence a page shows where Q, K, V (and the parts built from them) would be."""
    return (
        f"{config.architecture} is not one of the architectures tformer implements, so transformers' own code "
        "runs it. Its attention layers hand out the attention weights softmax(QKᵀ/√d) of every head and the "
        "hidden states between layers, but not the queries, keys and values the weights came from: Q, K, V, "
        "the scores before the softmax, each head's output and the feed-forward layers cannot be shown."
    )


class TransformersModel(TracedModel[TransformersConfig]):
    """A transformers model behind the core's interface (kind, tokenizer, trace). Subclasses per kind."""

    path: ClassVar[str] = "transformers"

    def __init__(self, hf: nn.Module, config: TransformersConfig) -> None:
        super().__init__(config)
        self.hf: Any = hf  # transformers' PreTrainedModel: its outputs and methods are typed by transformers alone
        self.generation = GenerationSettings()
        self.mask_token_id: int | None = None
        self._takes_types = "token_type_ids" in inspect.signature(hf.forward).parameters
        if config.head == "classification":
            self.output_labels = config.labels
        self._finish_init()

    def attach_tokenizer(self, tokenizer: Tokenizer) -> None:
        super().attach_tokenizer(tokenizer)
        self.mask_token_id = tokenizer.mask_token_id if self.config.head == "masked-word" else None

    @property
    def capabilities(self) -> Capabilities:
        """No Q, K, V and no weight matrices (transformers' modules hand out neither); the checkpoint's head."""
        return replace(super().capabilities, qkv=False, weights=False, head=self.config.head)

    @property
    def output_vocab_size(self) -> int:
        return self.config.n_outputs if self.config.head in ("masked-word", "next-token") else 0

    @property
    def max_tokens(self) -> int | None:
        return self.config.max_positions

    @property
    def absent(self) -> str:
        """Why the views that need Q, K or V have nothing to show for this model (one sentence)."""
        return absent_reason(self.config)

    def weights(self, stack: str | None = None) -> StackWeights:
        """Not offered: transformers' modules are not the core's (`capabilities.weights` is False)."""
        raise ValueError(
            f"{self.config.architecture} runs through transformers' own code: its weight matrices are "
            "not read by tformer (only the core's own architectures offer them)"
        )

    def _run(self, edits: Iterable[Edit] = (), **inputs: Any) -> Any:
        """One forward pass of the wrapped model with every attention matrix and hidden state returned. edits:
        as for the core's models, checked first; transformers' modules have no hook points, so any edit is refused
        (HookNameError) before the pass runs."""
        with self.intervene(edits), torch.inference_mode():
            return self.hf(**inputs, output_attentions=True, output_hidden_states=True, use_cache=False)

    def _trace_meta(self) -> dict:
        c = self.config
        meta = {
            "labels": self.output_labels,
            "path": "transformers",
            "architecture": c.architecture,
            "absent": self.absent,
            "absent_parts": ABSENT,
            "head": c.head,
        }
        if c.head == "classification":
            meta.update(problem_type=c.problem_type or None, probabilities=c.scoring)
        if c.dropped_head:
            meta["dropped_head"] = c.dropped_head
        return meta

    def _make_trace(self, activations: dict, keep: NameFilter | None, **fields: Any) -> Trace:
        """A Trace of `activations` (batch dimension already gone). `keep` drops what the caller does not read,
        except the attention weights and masks: with no Q and K they cannot be recomputed."""
        kept = {name: array for name, array in activations.items() if keep is None or keep(name) or _KEPT_ALWAYS(name)}
        meta = TraceMeta.of({**self._trace_meta(), **fields.pop("meta", {})})
        n_heads = next(a.shape[0] for n, a in activations.items() if _WEIGHTS(n))
        return Trace(kind=self.kind, activations=kept, n_heads=n_heads, meta=meta, **fields)

    def _predict_meta(self, ids: list[int]) -> dict:
        if self.config.head == "masked-word":
            masked = [i for i, t in enumerate(ids) if t == self.mask_token_id]
            return {"predict_position": masked[0] if masked else None, "mask_positions": masked}
        return {"predict_position": -1 if self.config.head == "next-token" else None}


def stack_arrays(
    stack: str,
    attentions: Sequence[torch.Tensor],
    hidden: Sequence[torch.Tensor] | None,
    last: torch.Tensor | None,
    allowed: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """One stack's tensors from transformers' outputs (batch element 0, where the model ran): weights per layer,
    the mask when there is one, the hidden state entering each layer (when transformers gives one per layer
    plus the final one) and the final hidden states."""
    arrays: dict[str, torch.Tensor] = {}
    for layer, weights in enumerate(attentions):
        arrays[f"{stack}.{layer}.attn.weights"] = weights[0].detach()  # [h, n, n]
        if allowed is not None:
            arrays[f"{stack}.{layer}.attn.mask"] = allowed
    if hidden is not None and len(hidden) == len(attentions) + 1:
        for layer in range(len(attentions)):
            arrays[f"{stack}.{layer}.resid_pre"] = hidden[layer][0].detach()  # [n, D]
    if last is not None:
        arrays[f"{stack}.out"] = last[0].detach()
    return arrays


def allowed_cells(
    n_q: int, causal: bool, key_mask: torch.Tensor | None, device: torch.device | None = None
) -> torch.Tensor | None:
    """[1, n_q, n_q] True where a query may attend (causal and/or padding), or None when every cell may; on
    `key_mask`'s device (else `device`)."""
    if not causal and (key_mask is None or bool(key_mask.all())):
        return None
    where = key_mask.device if key_mask is not None else device
    allowed = torch.ones(n_q, n_q, dtype=torch.bool, device=where)
    if causal:
        allowed = allowed.tril()
    if key_mask is not None:
        allowed = allowed & key_mask[0].bool()[None, :]
    return allowed[None]


def head_logits(out: Any, config: TransformersConfig) -> dict[str, torch.Tensor]:
    """{"head.logits": ...} when the model's head is one the core shows, else {}."""
    if config.head is None or getattr(out, "logits", None) is None:
        return {}
    return {"head.logits": widened(out.logits[0].detach())}  # at least float32, as ours


class TransformersEncoder(TransformersModel, EncoderModel[TransformersConfig]):
    """A bidirectional text encoder run by transformers (ELECTRA, ALBERT, XLM-R, DeBERTa, ...)."""

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
        """Trace one sequence (text or token ids); `pair` is a second segment joined by the tokenizer. edits: none
        can apply (see `_run`)."""
        if pair is not None:
            if self.tokenizer is None or not isinstance(inputs, str) or not inputs.strip() or not pair.strip():
                raise InputError("a second segment needs text in both segments and a model with a tokenizer")
            inputs, token_type_ids = self.tokenizer.encode_pair(inputs, pair)
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        extra = {}
        types = per_token(token_type_ids, ids, "token_type_ids")
        if types is not None and self._takes_types:
            extra["token_type_ids"] = types
        out = self._run(edits, input_ids=ids, attention_mask=mask, **extra)
        allowed = allowed_cells(ids.shape[1], self.config.causal, mask, ids.device)
        arrays = stack_arrays("encoder", out.attentions, out.hidden_states, _last_hidden(out), allowed)
        arrays.update(head_logits(out, self.config))
        return self._make_trace(
            arrays,
            keep,
            tokens=tokens,
            stack_layers={"encoder": len(out.attentions)},
            meta=self._predict_meta(ids[0].tolist()),
        )


def _last_hidden(out: Any) -> torch.Tensor | None:
    """The final hidden states: last_hidden_state for a base model, else the last of hidden_states
    (transformers applies the stack's final norm before handing it out)."""
    last = getattr(out, "last_hidden_state", None)
    if last is None and getattr(out, "hidden_states", None):
        last = out.hidden_states[-1]
    return last


class TransformersDecoder(TransformersModel, CausalLM[TransformersConfig]):
    """A decoder-only (causal) language model run by transformers (Qwen, Phi, GPT-NeoX, OPT, ...). It decodes
    greedily only (`capabilities.sampling` is False)."""

    def trace(
        self,
        inputs: TokenInput,
        attention_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one sequence (text or token ids); head.logits' last row scores the next token. edits: none can
        apply (see `_run`)."""
        ids, tokens = self._ids(inputs, self.config.vocab_size, self.config.max_positions)
        mask = per_token(attention_mask, ids, "attention_mask")
        out = self._run(edits, input_ids=ids, attention_mask=mask)
        allowed = allowed_cells(ids.shape[1], self.config.causal, mask, ids.device)
        arrays = stack_arrays("decoder", out.attentions, out.hidden_states, _last_hidden(out), allowed)
        arrays.update(head_logits(out, self.config))
        return self._make_trace(
            arrays,
            keep,
            tokens=tokens,
            stack_layers={"decoder": len(out.attentions)},
            meta=self._predict_meta(ids[0].tolist()),
        )

    def generate(
        self,
        prompt: TokenInput,
        max_new_tokens: int | None = None,
        *,
        sampling: Sampling | None = None,
        keep: NameFilter | None = None,
        final_trace: bool = True,
    ) -> Generation:
        """Greedy continuation of `prompt`, one traced pass per new token, until EOS or the limit. Steps keep the
        attention weights and masks, head.logits, and what `keep` names; final_trace=False skips the final pass."""
        if sampling is not None and not sampling.greedy:
            raise InputError("this model runs through transformers' own code, which tformer decodes greedily only")
        if self.config.head != "next-token":
            raise InputError(f"{self.config.architecture} has no language-model head: it cannot generate")
        settings = self.generation
        budget = max_new_tokens if max_new_tokens is not None else settings.max_new_tokens
        ids, _ = self._ids(prompt, self.config.vocab_size, self.config.max_positions, what="prompt")
        sequence = ids[0].tolist()
        if self.config.max_positions is not None:
            budget = min(budget, self.config.max_positions - len(sequence))
        step_keep = matching("head.*") if keep is None else any_of(matching("head.*"), keep)
        sequence, steps, finished = traced_steps(lambda s: self.trace(s, keep=step_keep), sequence, settings, budget)
        final = self.trace(sequence) if final_trace else None
        tokens = final.tokens if final is not None else self._ids(sequence, self.config.vocab_size, None)[1]
        return Generation(tuple(sequence), tuple(tokens), ids.shape[1], steps, final, finished)


class TransformersSeq2Seq(TransformersModel, EncoderDecoderModel[TransformersConfig]):
    """An encoder-decoder model run by transformers (Pegasus, mBART, M2M100, LED, ...): the encoder reads the
    source, the decoder its own prefix (causal) and the source (cross-attention)."""

    def __init__(self, hf: nn.Module, config: TransformersConfig) -> None:
        super().__init__(hf, config)
        self.target_tokenizer: Tokenizer | None = None  # one tokenizer reads both sides

    def trace(
        self,
        source: TokenInput,
        target: TokenInput,
        source_mask: Sequence[int] | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one pair with teacher forcing: `target` is the decoder's input (starting with its start token).
        edits: none can apply (see `_run`)."""
        c = self.config
        src, src_tokens = self._ids(source, c.vocab_size, c.max_positions, what="source")
        tgt, tgt_tokens = self._ids(target, c.vocab_size, c.max_positions, self.target_tokenizer, "target")
        mask = per_token(source_mask, src, "source_mask")
        out = self._run(edits, input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
        arrays = stack_arrays(
            "encoder",
            out.encoder_attentions,
            out.encoder_hidden_states,
            out.encoder_last_hidden_state,
            allowed_cells(src.shape[1], False, mask),
        )
        arrays.update(self._decoder_arrays(out, tgt.shape[1], mask))
        return self._make_trace(
            arrays,
            keep,
            tokens=src_tokens,
            target_tokens=tgt_tokens,
            stack_layers={"encoder": len(out.encoder_attentions), "decoder": len(out.decoder_attentions)},
            meta={"predict_position": -1},
        )

    def _decoder_arrays(self, out: Any, n_target: int, source_mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The decoder's self-attention (causal), cross-attention, hidden states and logits."""
        hidden = out.decoder_hidden_states
        arrays = stack_arrays(
            "decoder",
            out.decoder_attentions,
            hidden,
            hidden[-1],
            allowed_cells(n_target, True, None, hidden[-1].device),
        )
        cross_allowed = None
        if source_mask is not None and not bool(source_mask.all()):
            cross_allowed = source_mask[0].bool().expand(1, n_target, source_mask.shape[1])
        for layer, weights in enumerate(out.cross_attentions):
            arrays[f"decoder.{layer}.cross_attn.weights"] = weights[0].detach()  # [h, n_target, n_source]
            if cross_allowed is not None:
                arrays[f"decoder.{layer}.cross_attn.mask"] = cross_allowed
        arrays.update(head_logits(out, self.config))
        return arrays

    def generate(self, source: TokenInput, max_new_tokens: int | None = None) -> Generation:
        """Greedy output for `source`: the encoder runs once, then one traced decoder pass per new token.

        Step traces hold the decoder (its cross-attention included) and head.logits; `Generation.trace` is
        a teacher-forced pass over the result, encoder included.
        """
        c, settings = self.config, self.generation
        if c.head != "next-token":
            raise InputError(f"{c.architecture} has no language-model head: it cannot generate")
        src, src_tokens = self._ids(source, c.vocab_size, c.max_positions, what="source")
        budget = max_new_tokens if max_new_tokens is not None else settings.max_new_tokens
        if c.max_positions is not None:
            budget = min(budget, c.max_positions - 1)
        with torch.inference_mode():
            encoded = self.hf.get_encoder()(input_ids=src, output_attentions=True, output_hidden_states=True)
        tokenizer = self.target_tokenizer or self.tokenizer

        def trace_step(sequence: list[int]) -> Trace:
            tgt, tgt_tokens = self._ids(sequence, c.vocab_size, None, tokenizer, "target")
            out = self._run(encoder_outputs=encoded, decoder_input_ids=tgt)
            return self._make_trace(
                self._decoder_arrays(out, tgt.shape[1], None),
                matching("head.*"),
                tokens=src_tokens,
                target_tokens=tgt_tokens,
                stack_layers={"decoder": len(out.decoder_attentions)},
                meta={"predict_position": -1},
            )

        start = settings.start_id if settings.start_id is not None else settings.pad_id
        if start is None:
            raise InputError("this model's generation settings name no decoder start token")
        sequence, steps, finished = traced_steps(trace_step, [int(start)], settings, budget)
        final = self.trace(src[0].tolist(), sequence)
        return Generation(tuple(sequence), final.target_tokens or (), 1, steps, final, finished)
