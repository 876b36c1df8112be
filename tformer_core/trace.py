"""`Trace`: everything one forward pass computed, for one input, as numpy on the CPU.

One format for every model kind. Activations are keyed by where they come from:

    {stack}.embed.tok | pos | out          token embeddings, positional encodings, layer-0 input
    {stack}.{layer}.resid_pre              residual stream entering the block
    {stack}.{layer}.attn.q | k | v         [heads, tokens, d_head]
    {stack}.{layer}.attn.scores            Q K^T                           [heads, n_q, n_k]
    {stack}.{layer}.attn.scaled            softmax input: scores * scale (+ bias), masked = -inf
    {stack}.{layer}.attn.weights           softmax of each row              [heads, n_q, n_k]
    {stack}.{layer}.attn.mask              True where attending is allowed  [1, n_q, n_k] (masked models)
    {stack}.position_bias                  T5's relative position bias      [heads, n, n]
    {stack}.{layer}.attn.z                 weights V per head               [heads, n_q, d_head]
    {stack}.{layer}.attn.out               concat(z) W^O                    [n_q, d_model]
    decoder.{layer}.cross_attn.*           the same for encoder-decoder cross-attention
    {stack}.{layer}.resid_after_attn | resid_after_cross | resid_post, ln_attn | ln_cross | ln_mlp
    {stack}.{layer}.mlp.hidden | out       FFN hidden layer (after activation), FFN output
    {stack}.out                            final hidden states;  head.logits when there is a head

`trace.names` lists everything a trace offers. The batch dimension is gone; arrays are read-only
because one trace may be cached and shown to several sessions.

Scores and scaled scores are not stored by default: they are recomputed from the stored Q, K,
scale, bias and mask when asked for (the softmax of the result reproduces the stored weights).
That keeps a trace at about a third of the attention memory, which matters for long inputs,
batches and a server that caches traces. Pass a `keep` filter that names them to store them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .numerics import softmax

# Attention stacks a trace may hold, and the activation prefix of each.
ATTENTION_STACKS = {
    "encoder": "encoder.{layer}.attn",
    "decoder": "decoder.{layer}.attn",
    "cross": "decoder.{layer}.cross_attn",
}
DERIVED_PARTS = ("scores", "scaled")


def stored_by_default(name: str) -> bool:
    """The default capture filter: everything except what the trace can recompute from Q and K."""
    return not name.endswith((".scores", ".scaled"))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """CPU numpy view of a tensor; half precision is widened to float32 (numpy has no bfloat16)."""
    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    a = t.cpu().numpy()
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Trace:
    """Captured activations of one input.

    kind: "encoder" | "decoder" | "encoder-decoder" | "vit".
    tokens: labels of the first stack's positions (text tokens; for a ViT "[CLS]", "[DIST]",
        then one "r{row}c{col}" per patch); target_tokens: the decoder's input tokens of an
        encoder-decoder model.
    stack_layers: number of layers per stack, e.g. {"encoder": 6, "decoder": 6}.
    grid_hw, patch_size, n_prefix_tokens: the ViT patch grid (rows, cols), patch side in pixels
        and the number of tokens before the patches (class token, distillation token).
    """

    kind: str
    activations: Mapping[str, np.ndarray]
    tokens: tuple[str, ...]
    n_heads: int
    stack_layers: Mapping[str, int]
    target_tokens: tuple[str, ...] | None = None
    grid_hw: tuple[int, int] | None = None
    patch_size: int | None = None
    n_prefix_tokens: int = 0
    meta: Mapping[str, object] = field(default_factory=dict)

    # ---- generic access -------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.activations:
            return self.activations[name]
        derived = self._derive(name)
        if derived is None:
            raise KeyError(f"{name!r} was not captured; see trace.names")
        return derived

    def __contains__(self, name: object) -> bool:
        return name in self.activations or (isinstance(name, str) and self._derivable(name))

    @property
    def names(self) -> list[str]:
        """Every activation the trace offers: the stored ones, with derivable scores right after their V."""
        names = []
        for name in self.activations:
            names.append(name)
            if name.endswith("attn.v"):
                prefix = name[: -len(".v")]
                names += [f"{prefix}.{p}" for p in DERIVED_PARTS if f"{prefix}.{p}" not in self.activations]
        return names

    def _derivable(self, name: str) -> bool:
        prefix, _, part = name.rpartition(".")
        return part in DERIVED_PARTS and f"{prefix}.q" in self.activations and f"{prefix}.k" in self.activations

    def _derive(self, name: str) -> np.ndarray | None:
        """Scores Q K^T, or the softmax input (scores * scale + T5's bias, masked cells -inf), from stored parts."""
        if not self._derivable(name):
            return None
        prefix, _, part = name.rpartition(".")
        q, k = self.activations[f"{prefix}.q"], self.activations[f"{prefix}.k"]
        scores = q @ k.transpose(0, 2, 1)  # [h, n_q, n_k]
        if part == "scores":
            return _read_only(scores)
        scaled = scores * np.asarray(self.meta.get("attention_scale", 1.0), dtype=scores.dtype)
        stack = prefix.split(".")[0]
        bias = self.activations.get(f"{stack}.position_bias")
        if bias is not None and not prefix.endswith("cross_attn"):  # T5 biases self-attention only
            scaled = scaled + bias
        mask = self.activations.get(f"{prefix}.mask")
        if mask is not None:
            scaled = np.where(mask, scaled, -np.inf).astype(scores.dtype)
        return _read_only(scaled)

    @property
    def main_stack(self) -> str:
        """The stack shown first: the encoder when the trace holds one, else the decoder."""
        return "encoder" if "encoder" in self.stack_layers else "decoder"

    @property
    def n_layers(self) -> int:
        """Layers of the main stack (the encoder, or the decoder of a decoder-only model)."""
        return self.stack_layers[self.main_stack]

    @property
    def attention_stacks(self) -> tuple[str, ...]:
        """The attention stacks this trace holds: ("encoder",), ("decoder",), ("encoder", "decoder", "cross"),
        or ("decoder", "cross") for an encoder-decoder generation step (the encoder ran once, before)."""
        stacks = tuple(s for s in ("encoder", "decoder") if s in self.stack_layers)
        if self.kind == "encoder-decoder" and "decoder" in self.stack_layers:
            stacks += ("cross",)
        return stacks

    def layers_in(self, stack: str) -> int:
        return self.stack_layers["decoder" if stack == "cross" else stack]

    @property
    def output(self) -> np.ndarray:
        """The model's output: head logits when it has a head, else the final hidden states."""
        if "head.logits" in self.activations:
            return self.activations["head.logits"]
        last = "decoder" if "decoder" in self.stack_layers else "encoder"
        return self.activations[f"{last}.out"]

    def predictions(self, k: int = 5, position: int | None = None) -> list[tuple[str, float]]:
        """Top-k (label, probability) from the model's own head.

        ViT: classes of the image. Decoder-only and encoder-decoder: the next token after
        `position` (default: the last). BERT with a masked-LM head: candidates for the [MASK] at
        `position` (default: the first [MASK] of the input).
        """
        if "head.logits" not in self.activations:
            raise ValueError("this model has no prediction head (no classifier, language-model or masked-word head)")
        logits = self.activations["head.logits"]
        if logits.ndim == 2:
            if position is None:
                position = self.meta.get("predict_position")
            if position is None:
                raise ValueError("no [MASK] token in the input: put [MASK] where a word should be guessed")
            logits = logits[position]
        p = softmax(logits)
        top = np.argsort(-p, kind="stable")[: max(int(k), 0)]
        labels = self.meta.get("labels")
        return [(str(labels[i]) if labels is not None else str(i), float(p[i])) for i in top]

    # ---- attention blocks ------------------------------------------------------------------
    def _block(self, stack: str | None, layer: int) -> str:
        stack = stack or self.main_stack
        if stack not in self.attention_stacks:
            raise ValueError(f"this {self.kind} trace has no {stack!r} attention; it has {self.attention_stacks}")
        n = self.layers_in(stack)
        if not -n <= layer < n:
            raise ValueError(f"layer {layer} is out of range: the {stack} stack has {n} layers (0..{n - 1})")
        return ATTENTION_STACKS[stack].format(layer=layer % n)

    def _head(self, array: np.ndarray, head: int | None) -> np.ndarray:
        if head is None:
            return array
        if not -self.n_heads <= head < self.n_heads:
            raise ValueError(f"head {head} is out of range: the model has {self.n_heads} heads (0..{self.n_heads - 1})")
        return array[head]

    def block(self, part: str, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """One captured part (q, k, v, scores, scaled, weights, z) of an attention block.

        With `head` None the head axis is kept. `stack` defaults to the main stack.
        """
        return self._head(self[f"{self._block(stack, layer)}.{part}"], head)

    def attention(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Attention weights [n_q, n_k] (rows sum to 1), or [heads, n_q, n_k] when head is None."""
        return self.block("weights", layer, head, stack)

    def q(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Queries [n_q, d_head] of one head."""
        return self.block("q", layer, head, stack)

    def k(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Keys [n_k, d_head] of one head."""
        return self.block("k", layer, head, stack)

    def v(self, layer: int, head: int | None = None, stack: str | None = None) -> np.ndarray:
        """Values [n_k, d_head] of one head."""
        return self.block("v", layer, head, stack)

    def all_attention(self, stack: str | None = None) -> np.ndarray:
        """Every layer's weights stacked: [layers, heads, n_q, n_k]."""
        stack = stack or self.main_stack
        return np.stack([self.attention(layer, None, stack) for layer in range(self.layers_in(stack))])

    def tokens_for(self, stack: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query labels, key labels) of an attention stack: cross-attention is target x source."""
        stack = stack or self.main_stack
        if self.kind != "encoder-decoder":
            return self.tokens, self.tokens
        target = self.target_tokens or ()
        if stack == "encoder":
            return self.tokens, self.tokens
        if stack == "decoder":
            return target, target
        return target, self.tokens
