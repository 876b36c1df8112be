"""What the encoder-decoder page shows, computed from the core's traces: no Streamlit here.

    t = translate(model, "the big dog chases a small cat")   # greedy, one traced decoder pass per token
    t = teacher_force(model, "the big dog ...", "varo gros ...")   # the user's target instead
    t.output_text, t.produced                # the translation; the token made at each step
    step = at_step(t, 3)                     # what the model computed when making token 3
    step.self_attention(layer=1, head=2)     # [4, 4] masked self-attention, -inf above the diagonal
    step.cross_rows()                        # [layers, heads, source]: the new token's cross-attention
    alignment(t, layer=1, head=None)         # [produced, source], averaged over heads

Decoder positions and produced tokens: the decoder reads s_0 (the start token), s_1, ... and
position t, whose input is s_t, produces s_{t+1}. So row t of a cross-attention matrix is the
query that produced token t+1; the alignment view labels rows by the token produced.

Greedy translations keep the trace of every step (the pass that chose the token). By the causal
mask, row t of one teacher-forced pass over the whole sequence is the same computation; teacher
forcing (no step traces) reads its rows, and the tests check the two agree for greedy output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tformer_core.errors import InputError
from tformer_core.generation import Generation
from tformer_core.models.base import TracedModel
from tformer_core.models.kinds import EncoderDecoderModel
from tformer_core.tokenizers import Tokenizer
from tformer_core.trace import Trace, to_host
from tformer_train import data as td

from .text import HeadMatrix, mask_tensor
from .tokens import display_tokens

__all__ = [
    "DEFAULT_SOURCES",
    "MAX_NEW_TOKENS",
    "Step",
    "Translation",
    "alignment",
    "at_step",
    "output_text",
    "require_seq2seq",
    "target_ids",
    "teacher_agreement",
    "teacher_force",
    "translate",
    "vocabulary",
]

DEFAULT_SOURCES = {
    "translator": "the big dog chases a small cat near the river",
    "Helsinki-NLP/opus-mt-en-de": "The animal didn't cross the street because it was too tired.",
    "t5-small": "translate English to German: The house is wonderful.",
    "facebook/bart-base": "The animal didn't cross the <mask> because it was too tired.",
}
MAX_NEW_TOKENS = 64


@dataclass(frozen=True, eq=False)
class Translation:
    """A source and a decoder sequence with everything the model computed for them.

    mode: "greedy" (the model's own output) or "teacher" (the user's target, teacher forcing).
    decoder_ids / decoder_tokens: the decoder's input sequence s_0 (start token), s_1, ..., s_n.
    trace: one teacher-forced pass over that sequence, encoder included.
    steps: greedy only, steps[t] = the trace of the pass that chose s_{t+1}.
    finished: the sequence ends with the end token (greedy: False when the length limit stopped it).
    output_text: the produced tokens as text (special tokens left out).
    unknown_words: source words the model's vocabulary does not have (shown as <unk>).
    """

    mode: str
    source_tokens: tuple[str, ...]
    decoder_ids: tuple[int, ...]
    decoder_tokens: tuple[str, ...]
    trace: Trace
    steps: tuple[Trace, ...] | None
    finished: bool
    output_text: str
    unknown_words: tuple[str, ...] = ()

    @property
    def produced(self) -> tuple[str, ...]:
        """The token produced at each step: s_1 .. s_n."""
        return self.decoder_tokens[1:]

    @property
    def n_steps(self) -> int:
        return len(self.decoder_tokens) - 1


def require_seq2seq(model: TracedModel) -> EncoderDecoderModel:
    """`model` as an encoder-decoder with a tokenizer (the core's own, or one transformers runs: both are an
    `EncoderDecoderModel`, the same trace / generate interface); ValueError with a message for the page otherwise."""
    if not isinstance(model, EncoderDecoderModel):
        raise InputError("this page shows encoder-decoder models (translation); this one is not")
    if model.tokenizer is None:
        raise InputError("this model has no tokenizer, so it cannot read a sentence")
    return model


def _source_tokenizer(model: EncoderDecoderModel) -> Tokenizer:
    if model.tokenizer is None:
        raise InputError("this model has no tokenizer, so it cannot read a sentence")
    return model.tokenizer


def _target_tokenizer(model: EncoderDecoderModel) -> Tokenizer:
    tokenizer = model.target_tokenizer or model.tokenizer
    assert tokenizer is not None  # require_seq2seq checked
    return tokenizer


def output_text(model: EncoderDecoderModel, ids: tuple[int, ...]) -> str:
    """Produced ids (after the start token) as text, without special tokens (<unk> stays visible)."""
    return _target_tokenizer(model).decode(list(ids))


def translate(model: TracedModel, source: str, max_new_tokens: int | None = None) -> Translation:
    """Greedy translation of `source` with a trace of every step. ValueError for empty or over-long input."""
    model = require_seq2seq(model)
    if max_new_tokens is not None and not 1 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
        raise InputError(f"the number of new tokens must be 1 to {MAX_NEW_TOKENS}, got {max_new_tokens}")
    gen: Generation = model.generate(source, max_new_tokens)
    assert gen.trace is not None  # an encoder-decoder's generate always runs the final pass
    return Translation(
        "greedy",
        gen.trace.tokens,
        gen.ids,
        gen.trace.target_tokens or (),
        gen.trace,
        gen.steps,
        gen.finished,
        output_text(model, gen.generated_ids),
        tuple(_source_tokenizer(model).unknown_words(source)),
    )


def target_ids(model: EncoderDecoderModel, target: str) -> list[int]:
    """The decoder's input for teacher forcing: the start token, the target's tokens, the end token."""
    if not isinstance(target, str) or not target.strip():
        raise InputError("the target is empty: type the translation to check, or leave it empty for the model's own")
    settings = model.generation
    start = settings.start_id if settings.start_id is not None else settings.pad_id
    if start is None:
        raise InputError("this model's generation settings name no decoder start token")
    ids = [start, *_target_tokenizer(model).encode_target(target)]
    if settings.eos_id is not None and ids[-1] != settings.eos_id:
        ids.append(settings.eos_id)
    if len(ids) < 2:
        raise InputError("the target has no words this model can read")
    return ids


def teacher_force(model: TracedModel, source: str, target: str) -> Translation:
    """The model's attention when the decoder is given `target` instead of its own output."""
    model = require_seq2seq(model)
    ids = target_ids(model, target)
    limit = model.token_limit
    if limit is not None and len(ids) > limit:
        raise InputError(
            f"the target has {len(ids)} tokens with its start and end tokens; this model handles at "
            f"most {limit}. Shorten it."
        )
    trace = model.trace(source, ids)
    unknown = _source_tokenizer(model).unknown_words(source) + _target_tokenizer(model).unknown_words(target)
    return Translation(
        "teacher",
        trace.tokens,
        tuple(ids),
        trace.target_tokens or (),
        trace,
        None,
        ids[-1] == model.generation.eos_id,
        output_text(model, tuple(ids[1:])),
        tuple(dict.fromkeys(unknown)),
    )


# ---- one decoding step --------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """What the model computed at step t: decoder positions 0..t, the last one producing token t+1.

    trace: the trace that holds it (greedy: the step's own pass; teacher forcing: the whole pass);
    row: position t in that trace.
    """

    t: int
    trace: Trace
    row: int
    input_tokens: tuple[str, ...]  # s_0 .. s_t, what the decoder has read
    produced: str  # s_{t+1}

    def self_attention(self, layer: int, head: int) -> HeadMatrix:
        """The decoder's masked self-attention over positions 0..t: [t+1, t+1], masked cells in `masked`."""
        n = self.t + 1
        weights = self.trace.block_tensor("weights", layer, head, "decoder")[:n, :n]
        mask = mask_tensor(self.trace, layer, "decoder")
        host = to_host([weights] if mask is None else [weights, mask[:n, :n]])  # one transfer
        w = np.asarray(host[0], dtype=np.float64)
        allowed = np.asarray(host[1], dtype=bool) if mask is not None else None
        labels = tuple(display_tokens(self.input_tokens))
        positions = np.arange(n)
        return HeadMatrix(w, positions, positions, labels, labels, allowed, np.zeros(n))

    def cross_rows(self) -> np.ndarray:
        """[layers, heads, source tokens]: the new token's cross-attention, every layer and head."""
        layers = range(self.trace.layers_in("cross"))
        with torch.inference_mode():  # the row is picked in every layer on the trace's device: one transfer
            rows = torch.stack(
                [self.trace.block_tensor("weights", layer, None, "cross")[:, self.row] for layer in layers]
            )
        return to_host([rows])[0]

    def predictions(self, k: int = 5) -> list[tuple[str, float]]:
        """The model's top-k next tokens at this step (its own choice for greedy output)."""
        return self.trace.predictions(k, position=self.row)


def at_step(translation: Translation, t: int) -> Step:
    """Step t (0-based) of a translation: ValueError outside 0..n_steps - 1."""
    if not 0 <= t < translation.n_steps:
        raise InputError(f"step {t} is out of range: this translation has {translation.n_steps} steps")
    if translation.steps is not None:
        trace, row = translation.steps[t], t
    else:
        trace, row = translation.trace, t
    return Step(t, trace, row, translation.decoder_tokens[: t + 1], translation.produced[t])


def alignment(translation: Translation, layer: int, head: int | None) -> HeadMatrix:
    """Cross-attention [produced tokens, source tokens] of one head, or the mean over heads (head None).

    Rows are labelled by the token each decoder position produced (row t: s_{t+1}).
    """
    cross = translation.trace.block_tensor("weights", layer, None, "cross")[:, : translation.n_steps]  # [h, steps, src]
    w = np.asarray(to_host([cross.float().mean(0) if head is None else cross[head]])[0], dtype=np.float64)
    rows = tuple(display_tokens(translation.produced))
    cols = tuple(display_tokens(translation.source_tokens))
    return HeadMatrix(w, np.arange(w.shape[0]), np.arange(w.shape[1]), rows, cols, None, np.zeros(w.shape[0]))


def teacher_agreement(translation: Translation) -> int:
    """At how many steps the model's own most likely token is the one the decoder was given next."""
    return sum(
        int(step.trace.ranked(1, step.row)[0][0]) == translation.decoder_ids[step.t + 1]
        for step in (at_step(translation, t) for t in range(translation.n_steps))
    )


def vocabulary(model: TracedModel) -> list[tuple[str, list[tuple[str, str]]]] | None:
    """For the bundled translator: its lexicon by word class, [(class, [(source word, target word)])]; else None."""
    if model.source != "translator":
        return None
    classes = [
        ("determiners", td.DETERMINERS),
        ("nouns", td.NOUNS),
        ("adjectives", td.ADJECTIVES),
        ("verbs (with an object)", td.TRANSITIVE_VERBS),
        ("verbs (no object)", td.INTRANSITIVE_VERBS),
        ("adverbs", td.ADVERBS),
        ("prepositions", td.PREPOSITIONS),
    ]
    return [(name, [(source, target) for source, target in words]) for name, words in classes]
