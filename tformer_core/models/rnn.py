"""An RNN encoder-decoder with attention: the translation models attention was invented for.

The encoder, a bidirectional GRU, turns source word j into an annotation h_j (both directions
concatenated: d_hidden numbers). The decoder, a GRU, writes the target one word at a time; at output step
m it scores every annotation against its state, softmaxes the scores over the source words into
alpha_m = (alpha_m1, ..., alpha_mJ), and reads the context c_m = sum_j alpha_mj h_j. The score:

- "additive" (Bahdanau, Cho and Bengio, 2015): e_mj = v^T tanh(W s_{m-1} + U h_j), from the state *before*
  the step; the context goes into the GRU with the previous word, s_m = GRU([y_{m-1}; c_m], s_{m-1}), and
  the output reads [s_m; c_m; y_{m-1}].
- "dot" and "bilinear" (Luong, Pham and Manning, 2015): e_mj = s_m . h_j or s_m^T W h_j, from the state
  *after* s_m = GRU(y_{m-1}, s_{m-1}); the output reads tanh(W_c [c_m; s_m]).

The score functions are tformer_core.scores'; the scores become weights by tformer_core.attention's rule
(padding masked, the softmax over the source words).

Hooks (batch first): encoder.states (B, J, H) the annotations, decoder.states (B, M, H), attn.energies
(B, M, J) (padding at -inf), attn.weights (B, M, J) alpha, attn.context (B, M, H), head.logits (B, M, V).
Each is recorded once for all steps (stacked), so one capture holds the whole alignment. So only encoder.states
and head.logits lie on the computation's path: an edit of decoder.states or attn.* changes what the trace holds,
not the steps computed after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import attention_logits, attention_weights
from ..capture import Edit, HookPoint, NameFilter
from ..errors import InputError
from ..scores import additive_scores, bilinear_scores, dot_scores
from ..trace import Trace
from .base import TokenInput
from .kinds import RecurrentSeq2Seq

__all__ = ["SCORES", "Alignment", "RNNConfig", "RNNDecoder", "RNNEncoder", "RNNHead", "RNNSeq2Seq", "Scorer", "Step"]

SCORES = ("additive", "dot", "bilinear")


@dataclass(frozen=True, kw_only=True)
class RNNConfig:
    src_vocab_size: int
    tgt_vocab_size: int
    score: str = "additive"
    d_embed: int = 48
    d_hidden: int = 96  # annotations and decoder states; each encoder direction has half
    d_attn: int = 64  # the additive score's hidden layer
    max_positions: int = 32
    n_heads: int = 1  # one alignment per output step (what the trace format counts as heads)

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {self.score!r}")
        if self.d_hidden % 2:
            raise ValueError(f"d_hidden={self.d_hidden} must be even: each encoder direction has half of it")


class Scorer(nn.Module):
    """e_mj for one decoder state s (B, H) against every annotation h (B, J, H) -> (B, J); its parameters."""

    def __init__(self, c: RNNConfig) -> None:
        super().__init__()
        self.kind = c.score
        if c.score == "additive":
            self.W = nn.Linear(c.d_hidden, c.d_attn, bias=False)
            self.U = nn.Linear(c.d_hidden, c.d_attn)
            self.v = nn.Linear(c.d_attn, 1, bias=False)
        elif c.score == "bilinear":
            self.W = nn.Linear(c.d_hidden, c.d_hidden, bias=False)

    def keys(self, h: torch.Tensor) -> torch.Tensor | None:
        """What the score needs of the annotations, computed once per sentence: U h_j (additive), else None."""
        return self.U(h) if self.kind == "additive" else None

    def forward(self, s: torch.Tensor, h: torch.Tensor, h_keys: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "additive" and h_keys is not None:  # v^T tanh(W s + U h_j)
            return additive_scores(self.W(s), h_keys, self.v.weight[0])
        if self.kind == "bilinear":  # s^T W h_j (nn.Linear holds W transposed)
            return bilinear_scores(s, h, self.W.weight.T)
        return dot_scores(s, h)  # s . h_j


class Alignment(nn.Module):
    """One output step's attention over the source: scores -> alpha (B, J) -> context (B, H). Hooks (every step
    stacked, recorded by the model): energies (B, M, J), weights (B, M, J), context (B, M, H)."""

    def __init__(self, c: RNNConfig) -> None:
        super().__init__()
        self.score = Scorer(c)
        self.hook_energies, self.hook_weights, self.hook_context = HookPoint(), HookPoint(), HookPoint()

    def forward(
        self, s: torch.Tensor, h: torch.Tensor, h_keys: torch.Tensor | None, allowed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        energies = attention_logits(self.score(s, h, h_keys), 1.0, allowed=allowed)  # padding at -inf
        alpha = attention_weights(energies, allowed)
        return energies, alpha, torch.einsum("bj,bjh->bh", alpha, h)  # c_m = sum_j alpha_mj h_j


class RNNEncoder(nn.Module):
    """A bidirectional GRU over the source words. Hook: states (B, J, H), the annotations."""

    def __init__(self, c: RNNConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(c.src_vocab_size, c.d_embed)
        self.rnn = nn.GRU(c.d_embed, c.d_hidden // 2, batch_first=True, bidirectional=True)
        self.hook_states = HookPoint()


class RNNDecoder(nn.Module):
    """A GRU cell writing the target; its first state from the encoder's last ones. Hook: states (B, M, H)."""

    def __init__(self, c: RNNConfig) -> None:
        super().__init__()
        H = c.d_hidden
        self.embed = nn.Embedding(c.tgt_vocab_size, c.d_embed)
        self.init = nn.Linear(H, H)  # s_0 = tanh(W [last forward; last backward])
        self.cell = nn.GRUCell(c.d_embed + (H if c.score == "additive" else 0), H)
        self.hook_states = HookPoint()


class RNNHead(nn.Module):
    """Next-word logits from the step's state and context. Hook: logits (B, M, V)."""

    def __init__(self, c: RNNConfig) -> None:
        super().__init__()
        H = c.d_hidden
        self.combine = nn.Linear(2 * H + (c.d_embed if c.score == "additive" else 0), H)
        self.out = nn.Linear(H, c.tgt_vocab_size)
        self.hook_logits = HookPoint()


Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class RNNSeq2Seq(RecurrentSeq2Seq[RNNConfig]):
    """src (B, J), src_mask (B, J), tgt_in (B, M) starting with <bos> -> logits (B, M, V) (teacher forcing)."""

    def __init__(self, config: RNNConfig) -> None:
        super().__init__(config)
        self.encoder = RNNEncoder(config)
        self.decoder = RNNDecoder(config)
        self.attn = Alignment(config)
        self.head = RNNHead(config)
        self.target_tokenizer = None  # set by the loader, as for the Transformer translator
        self._finish_init()

    @property
    def output_vocab_size(self) -> int:
        return self.config.tgt_vocab_size

    @property
    def max_tokens(self) -> int:
        return self.config.max_positions

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(annotations h (B, J, H), initial decoder state s_0 (B, H)); padding is packed out of the GRU."""
        lengths = src_mask.sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.encoder.embed(src), lengths, batch_first=True, enforce_sorted=False
        )
        out, last = self.encoder.rnn(packed)  # last: (2, B, H/2), each direction's final state
        h, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        s0 = torch.tanh(self.decoder.init(torch.cat([last[0], last[1]], dim=-1)))
        return self.encoder.hook_states(h), s0

    def _step(
        self, y_prev: torch.Tensor, s: torch.Tensor, h: torch.Tensor, h_keys: torch.Tensor | None, allowed: torch.Tensor
    ) -> Step:
        """One output step -> (logits (B, V), new state, scores (B, J), alpha (B, J), context (B, H))."""
        e = self.decoder.embed(y_prev)  # (B, E)
        if self.config.score == "additive":  # attend from s_{m-1}, then update the state with the context
            scores, alpha, context = self.attn(s, h, h_keys, allowed)
            s = self.decoder.cell(torch.cat([e, context], dim=-1), s)
            out = torch.tanh(self.head.combine(torch.cat([s, context, e], dim=-1)))
        else:  # update the state first, then attend from s_m
            s = self.decoder.cell(e, s)
            scores, alpha, context = self.attn(s, h, None, allowed)
            out = torch.tanh(self.head.combine(torch.cat([context, s], dim=-1)))
        return self.head.out(out), s, scores, alpha, context

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        if src_mask is None:
            src_mask = torch.ones_like(src)
        h, s = self.encode(src, src_mask)
        allowed = src_mask.bool()
        h_keys = self.attn.score.keys(h)
        steps: list[Step] = []
        for m in range(tgt_in.shape[1]):
            step = self._step(tgt_in[:, m], s, h, h_keys, allowed)
            s = step[1]
            steps.append(step)
        logits, states, scores, alpha, context = (torch.stack(parts, dim=1) for parts in zip(*steps))
        self.decoder.hook_states(states)
        self.attn.hook_energies(scores)
        self.attn.hook_weights(alpha)
        self.attn.hook_context(context)
        return self.head.hook_logits(logits)  # (B, M, V)

    @torch.inference_mode()
    def greedy_batch(
        self, src: torch.Tensor, src_mask: torch.Tensor, bos: int, eos: int, max_len: int
    ) -> list[list[int]]:
        """Greedy decoding of a batch -> one list of target ids per sentence, without <bos> and <eos>."""
        h, s = self.encode(src, src_mask)
        allowed = src_mask.bool()
        h_keys = self.attn.score.keys(h)
        y = torch.full((src.shape[0],), bos, dtype=torch.long, device=src.device)
        out: list[list[int]] = [[] for _ in range(src.shape[0])]
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            logits, s, *_ = self._step(y, s, h, h_keys, allowed)
            logits[:, bos] = float("-inf")  # <bos> only starts a sentence
            y = logits.argmax(-1)
            for i, token in enumerate(y.tolist()):
                if not done[i] and token != eos:
                    out[i].append(token)
            done |= (y == eos).cpu()
            if bool(done.all()):
                break
        return out

    def trace(
        self,
        source: TokenInput,
        target: TokenInput | None = None,
        keep: NameFilter | None = None,
        *,
        edits: Iterable[Edit] = (),
    ) -> Trace:
        """Trace one translation: the model's own greedy output (target None) or a given target (teacher
        forcing; text or ids starting with <bos>). `target_tokens` are the decoder's inputs, <bos> first:
        row m of attn.weights is the step that reads target_tokens[m] and predicts the next word. edits: applied
        in the greedy decoding and in the traced pass, their names checked before either (`intervene`)."""
        with self.intervene(edits):  # around both passes: the traced one reads the edited model's own output
            tgt_tok = self.target_tokenizer
            src, tokens = self._ids(source, self.config.src_vocab_size, self.config.max_positions, what="sentence")
            if target is None:
                if tgt_tok is None:
                    raise InputError("greedy decoding needs the model's target tokenizer")
                bos, eos = tgt_tok.bos_id, tgt_tok.eos_id
                ids = self.greedy_batch(src, torch.ones_like(src), bos, eos, self.max_tokens - 1)
                target = [bos, *ids[0]]
            tgt, target_tokens = self._ids(target, self.config.tgt_vocab_size, None, tokenizer=tgt_tok, what="target")
            return self._trace(
                lambda: self(src, tgt), keep, tokens=tokens, target_tokens=target_tokens, stack_layers={}
            )
