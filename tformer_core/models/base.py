"""What every model family shares: device and dtype placement, input checks, and tracing.

`TracedModel` declares everything a loaded model offers the rest of the project (its kind, config,
tokenizer, output labels, where it came from, its stacks, its `capabilities`); code that receives a model
reads these attributes and never probes for others. What each kind adds (`trace`'s arguments, `generate`)
is declared by the kinds in `kinds.py`, which every family derives from: a view narrows a model with
`isinstance(model, CausalLM)` and the type checker holds it to that contract.

Interventions go through the model too: `model.trace(x, edits=[...])` for one trace, `with model.intervene([...])`
for every pass in a block (several traces, a generation). Both check every edit's name against `hook_names`
before anything runs (`interventions.check_names`).
"""

from __future__ import annotations

import contextlib
from abc import ABCMeta
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, Protocol, Self

import numpy as np
import torch
from torch import nn
from typing_extensions import TypeVar

from .. import settings
from ..capture import Edit, NameFilter, capture, name_hook_points
from ..capture import intervene as unchecked_intervene
from ..errors import InputError
from ..interventions import check_names
from ..tokenizers import Tokenizer, require_readable
from ..trace import BatchRow, Trace, TraceMeta, stored_by_default
from .layers import BlockConfig, Stack
from .weights import StackWeights, stack_weights

__all__ = [
    "DTYPES",
    "Capabilities",
    "LinearReadout",
    "ModelConfig",
    "ModelKind",
    "TokenInput",
    "TracedModel",
    "default_device",
    "per_token",
    "resolve_dtype",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


ModelKind = Literal["encoder", "decoder", "encoder-decoder", "vit", "pooling", "rnn-seq2seq", "mae", "detr"]


class ModelConfig(Protocol):
    """What the base reads of every family's config: how many heads a trace counts (1 for a model that weighs
    its inputs once, as attention pooling and an RNN's alignment do). A Transformer family's config is a
    `BlockConfig`, and the base reads its head width and activation too."""

    @property
    def n_heads(self) -> int: ...


# A family's config: TracedModel[EncoderConfig] reads EncoderConfig's fields; a bare TracedModel only BlockConfig's
# (the Transformer kinds'): code handed a model of the kinds without Transformer blocks narrows it to its kind first.
ConfigT = TypeVar("ConfigT", bound=ModelConfig, default=BlockConfig, covariant=True)


@dataclass(frozen=True)
class Capabilities:
    """What a model offers beyond tracing, declared by its family (nothing is found out by probing).

    qkv: traces hold each attention block's Q, K and V (the core's own modules); False for a model that
    transformers runs, whose traces hold the attention weights only. weights: `model.weights()` gives its
    weight matrices (the core's own modules). head: the head the model ran with, "masked-word",
    "next-token", "classification", "pixels" (a masked autoencoder's), "detection" (boxes and classes) or
    None. generates: it has `generate`. sampling: `generate` draws with
    a temperature and a top-k (else greedy only). kv_cache: `generate` keeps keys and values between steps.
    chat_template: its tokenizer has a chat template (`chat_prompt` applies it).
    """

    qkv: bool = True
    weights: bool = True
    head: str | None = None
    generates: bool = False
    sampling: bool = False
    kv_cache: bool = False
    chat_template: bool = False


@dataclass(frozen=True, eq=False)
class LinearReadout:
    """One output of a head that is linear in the final residual stream (after the final norm):
    output = sum over `terms` (position p, direction d [D]) of d . normed(x_p), + bias.

    A language model's logit of token c: one term (the predicted position, row c of W_U). DeiT's class score:
    (class token . W_cls[c] + distillation token . W_dist[c]) / 2, two terms. Read by `lens.direct_attribution`.
    """

    terms: tuple[tuple[int, torch.Tensor], ...]
    bias: float


def default_device() -> torch.device:
    """CUDA when available, else CPU; the environment variable TFORMER_DEVICE overrides (checked in
    tformer_core.settings: a device this machine does not have is logged and ignored)."""
    return settings.device()


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(DTYPES)}") from None


def per_token(values: Sequence[int] | None, ids: torch.Tensor, what: str) -> torch.Tensor | None:
    """A per-token sequence (mask, segment ids) as a (1, T) tensor matching `ids`."""
    if values is None:
        return None
    t = torch.as_tensor(np.asarray(values), dtype=torch.long, device=ids.device).reshape(1, -1)
    if t.shape != ids.shape:
        raise ValueError(f"{what} has {t.shape[1]} entries but the input has {ids.shape[1]} tokens")
    return t


TokenInput = str | Sequence[int] | np.ndarray | torch.Tensor  # text, or the token ids of one sequence


class TracedModel(nn.Module, Generic[ConfigT], metaclass=ABCMeta):
    """Base of the model families. Subclasses build their modules, then call `_finish_init()`.

    kind: "encoder" | "decoder" | "encoder-decoder" | "vit" | "pooling" | "rnn-seq2seq" | "mae" | "detr" (each
    kind's contract: `kinds.py`).
    main_stack: the stack a trace shows first ("encoder", or "decoder" for decoder-only models).
    tokenizer: reads text (None for a ViT, or a model built without one: it then takes token ids).
    output_labels: a display label per output of the model's head (vocabulary tokens as the tokenizer
    writes them, or class names).
    source: where the weights came from ("minilm", a hub id, a folder), for display. weights_note: a line
    about the weights for display (e.g. that they were 4-bit quantised), or "".
    pass_tokens: the most tokens one pass reads, when fewer than the model's positions: `load_model` sets it
    from the estimate of a pass's working memory (tformer_core.pass_memory, TFORMER_PASS_MB); None: no such limit.
    """

    kind: ClassVar[ModelKind]
    main_stack: ClassVar[str] = "encoder"
    path: ClassVar[str] = "tformer"  # who runs it: "tformer" (the core's own modules) or "transformers" (fallback)

    def __init__(self, config: ConfigT) -> None:
        super().__init__()
        self.config: ConfigT = config
        self.tokenizer: Tokenizer | None = None
        self.output_labels: Sequence[str] | None = None
        self.source: str = ""
        self.weights_note: str = ""
        self.pass_tokens: int | None = None

    @property
    def capabilities(self) -> Capabilities:
        """What this model offers beyond `trace` (see `Capabilities`)."""
        return Capabilities()

    def attach_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Read text with `tokenizer`; the head's outputs are then labelled with its tokens."""
        self.tokenizer = tokenizer
        if self.output_vocab_size:
            self.output_labels = tokenizer.labels(self.output_vocab_size)

    @property
    def output_vocab_size(self) -> int:
        """Vocabulary size of the head's outputs (0 when the outputs are not tokens)."""
        return 0

    @property
    def max_tokens(self) -> int | None:
        """The longest input the model reads, in tokens (None for a model that does not read text)."""
        return None

    @property
    def token_limit(self) -> int | None:
        """The most tokens one pass reads: `max_tokens`, or `pass_tokens` when that is fewer."""
        most = self.max_tokens
        if self.pass_tokens is None:
            return most
        return self.pass_tokens if most is None else min(most, self.pass_tokens)

    def stack(self, name: str) -> Stack:
        """The "encoder" or "decoder" stack module (embedding, blocks, final norm)."""
        module = getattr(self, name, None) if name in ("encoder", "decoder") else None
        if not isinstance(module, Stack):
            raise ValueError(f"this {self.kind} model has no {name!r} stack")
        return module

    def weights(self, stack: str | None = None) -> StackWeights:
        """The weights of `stack` (default: the main stack) by meaning, in TransformerLens's shapes: W_Q, W_K,
        W_V, W_O per head, biases, the FFN, the norms, the embeddings (see `tformer_core.models.weights`)."""
        name = stack or self.main_stack
        module = self.stack(name)
        if not isinstance(self.config, BlockConfig):  # a stack is built from a BlockConfig (its activation)
            raise ValueError(f"this {self.kind} model has no Transformer stacks")
        return stack_weights(name, module, self.config.activation)

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the model's head makes of a residual stream as a block of its output stack leaves it: the stack's
        final norm (pre-norm models) then the head. hidden (B, T, D) -> the head's output ((B, T, vocab) logits,
        (B, classes)). The logit lens reads every layer through it; ValueError for a model without a head."""
        raise ValueError(f"this {self.kind} model has no head to read its residual stream with")

    def linear_readout(self, output: int, position: int) -> LinearReadout:
        """The head's `output` (a token id, a class) at `position` (ignored by a class head) as a `LinearReadout`;
        ValueError for a head that is not linear after the final norm (BERT's masked-word head, a pooler)."""
        raise ValueError(f"this {self.kind} model's head is not a linear read-out of its residual stream")

    def _finish_init(self) -> None:
        self.hook_names: tuple[str, ...] = tuple(name_hook_points(self))
        self.eval()  # the core is for looking, not training: no dropout anywhere anyway

    @contextlib.contextmanager
    def intervene(self, edits: Iterable[Edit]) -> Iterator[None]:
        """Apply `edits` in every forward pass of this thread (or task) inside the `with` block: several traces,
        a generation, a probe's passes. Every edit's name is checked against `hook_names` first: HookNameError,
        naming the closest names, before anything runs. Several edits of one name apply in the order given;
        blocks nest, an enclosing block's edits applying first. `trace(..., edits=...)` is this for one trace.
        """
        chosen = tuple(edits)  # read once: the check and the passes see the same edits
        check_names(self.hook_names, chosen)
        with unchecked_intervene(chosen):
            yield

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def place(self, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> Self:
        """Move to `device` (default: CUDA when available) in `dtype` (default float32); returns self."""
        return self.to(
            device=torch.device(device) if device is not None else default_device(), dtype=resolve_dtype(dtype)
        )

    # ---- inputs ----------------------------------------------------------------------------
    def _ids(
        self,
        inputs: str | Sequence[int] | np.ndarray | torch.Tensor,
        vocab_size: int,
        max_positions: int | None,
        tokenizer: Tokenizer | None = None,
        what: str = "input",
    ) -> tuple[torch.Tensor, tuple[str, ...]]:
        """One sequence (text or token ids) -> ((1, T) long tensor on the model's device, token labels)."""
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if isinstance(inputs, str):
            if tokenizer is None:
                raise InputError("this model has no tokenizer: pass token ids instead of text")
            require_readable(inputs, what)
            ids = list(tokenizer.encode(inputs))
        elif isinstance(inputs, torch.Tensor):
            if inputs.dim() > 1 and inputs.shape[0] != 1:
                raise ValueError(f"trace() takes one sequence; got a batch of shape {tuple(inputs.shape)}")
            ids = inputs.detach().cpu().reshape(-1).tolist()
        else:
            array = np.asarray(inputs)
            if array.ndim > 1 and array.shape[0] != 1:
                raise ValueError(f"trace() takes one sequence; got a batch of shape {array.shape}")
            ids = array.reshape(-1).tolist()
        if len(ids) == 0:
            raise InputError(f"the {what} is empty: give at least one token")
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
            raise InputError(f"token ids must be whole numbers; got {ids[:5]}...")
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
        if max_positions is not None and len(ids) > max_positions:
            raise InputError(
                f"the {what} has {len(ids)} tokens; this model handles at most {max_positions}. Shorten it."
            )
        if max_positions is not None and self.pass_tokens is not None and len(ids) > self.pass_tokens:
            raise InputError(
                f"the {what} has {len(ids)} tokens; one pass of this model reads at most {self.pass_tokens} on this "
                "server (the working memory a pass may take, TFORMER_PASS_MB). Shorten it."
            )
        labels = tokenizer.convert_ids_to_tokens(ids) if tokenizer is not None else [str(i) for i in ids]
        return torch.tensor([ids], dtype=torch.long, device=self.device), tuple(labels)

    # ---- tracing ---------------------------------------------------------------------------
    def _trace(
        self,
        run: Callable[[], torch.Tensor],
        keep: NameFilter | None,
        meta: dict[str, Any] | None = None,
        edits: Iterable[Edit] = (),
        **trace_fields: Any,
    ) -> Trace:
        """Run `run` once under capture, and under `edits` (checked first, see `intervene`); the first batch
        element becomes a Trace.

        The trace holds the captured tensors themselves (views of batch element 0, on the model's device, in its
        dtype): nothing is copied to the host until a view reads it. By default, attention scores are not stored:
        the trace recomputes them from Q and K.
        """
        with self.intervene(edits), torch.inference_mode(), capture(keep or stored_by_default) as sink:
            run()
            activations = {name: t[0] for name, t in sink.tensors.items()}
        full = TraceMeta.of({**self._trace_meta(), **(meta or {})})
        return Trace(kind=self.kind, activations=activations, n_heads=self.config.n_heads, meta=full, **trace_fields)

    def _trace_meta(self) -> dict[str, Any]:
        config = self.config
        scale = 1.0 / config.head_dim**0.5 if isinstance(config, BlockConfig) and config.scale_attention else 1.0
        return {"labels": self.output_labels, "attention_scale": scale, "path": self.path}

    def _trace_batch(
        self,
        run: Callable[[], torch.Tensor],
        keep: NameFilter | None,
        batch_size: int,
        edits: Iterable[Edit] = (),
        **trace_fields: Any,
    ) -> list[Trace]:
        """Run one batched pass under capture and `edits` (checked first); every batch element becomes its own
        Trace (views of the batch's tensors on the model's device, each taken when first read: no copies)."""
        with self.intervene(edits), torch.inference_mode(), capture(keep or stored_by_default) as sink:
            run()
            arrays = sink.tensors
        meta = TraceMeta.of(self._trace_meta())
        return [
            Trace(
                kind=self.kind,
                activations=BatchRow(arrays, i),  # sliced when read: see BatchRow
                n_heads=self.config.n_heads,
                meta=meta,
                **trace_fields,
            )
            for i in range(batch_size)
        ]
