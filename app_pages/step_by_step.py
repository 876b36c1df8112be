"""Attention, step by step: the lecture's worked example, editable.

Read widgets (a preset, the edited tables, masks, heads) -> ask tformer_views.lessons.attention (which
runs tc.attention_steps) -> draw every intermediate as a formula, a table, a heatmap and a CSV.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from tformer_app import models, presenter, results, steps_view
from tformer_app import step_inputs as si
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.url import UrlState, int_key, int_list
from tformer_views.lessons import attention as ls
from tformer_views.lessons import worked_example as we

MODEL = DEFAULT_TEXT_MODEL
PRESETS = {
    "example": "Lecture example (3 tokens)",
    "tayo": "tayo ay masaya (the lecture's embeddings)",
    "sdpa": "Q, K, V given: PyTorch's scaled_dot_product_attention demo",
    "random": "Random numbers (seeded)",
    "real": f"From a real model ({MODEL})",
}
MODES = {"tables": "Tables", "text": "Text (paste numbers)"}
MAX_HEADS = 4
DEFAULT_SENTENCE = "The cat sat."

INTRO = (
    "The lecture's worked example, with every number: X → Q, K, V → QKᵀ → ÷√d_k → softmax → Z. "
    "Edit any table, pick a preset, add masks or heads; the link keeps the view."
)


# ---- presets ---------------------------------------------------------------------------------------
def preset_controls(url: UrlState, preset: str, n_heads: int) -> tuple[ls.Example | None, tuple]:
    """The preset's own settings; returns its example (None when it cannot be built) and a signature of them."""
    if preset == "example":
        return ls.default_example(n_heads), (preset, n_heads)
    if preset == "tayo":
        return ls.tayo_example(n_heads), (preset, n_heads)
    if preset == "sdpa":
        return ls.sdpa_example(n_heads), (preset, n_heads)
    if preset == "random":
        c = st.columns(4)
        seed = c[0].number_input("Seed", 0, 10**6, key=int_key(url, "seed", 0, 0, 10**6))
        n = c[1].number_input("Tokens", 1, ls.MAX_TOKENS, key=int_key(url, "n", 4, 1, ls.MAX_TOKENS))
        d = c[2].number_input("d_model", 1, 16, key=int_key(url, "d", 4, 1, 16))
        k = c[3].number_input("d_k = d_v (per head)", 1, 16, key=int_key(url, "dk", 3, 1, 16))
        return ls.random_example(seed, n, d, k, n_heads), (preset, seed, n, d, k, n_heads)

    return real_controls(url, n_heads)


def real_controls(url: UrlState, n_heads: int) -> tuple[ls.Example | None, tuple]:
    """The real-model preset: a sentence, then which layer, head and how many dimensions of them."""
    sentence = st.text_input(
        "Sentence",
        key=url.key("text", DEFAULT_SENTENCE),
        help=f"Tokenised by {MODEL}, with its [CLS] and [SEP]; at most {ls.MAX_TOKENS} tokens.",
    )
    model = models.load_model(MODEL)
    if model is None:
        return None, ("real",)
    size = we.model_sizes(model)
    c = st.columns(4)
    layers, heads = list(range(size.n_layers)), list(range(size.n_heads))
    layer = int(c[0].selectbox("Layer", layers, key=url.key("layer", 0, choices=layers)))
    head = int(c[1].selectbox("Head" if n_heads == 1 else "First head", heads, key=url.key("head", 0, choices=heads)))
    d_model, d_head = size.d_model, size.d_head
    dims = int(
        c[2].number_input(f"Dims of d_model (of {d_model})", 1, d_model, key=int_key(url, "dims", 4, 1, d_model))
    )
    hdims = int(c[3].number_input(f"Dims per head (of {d_head})", 1, d_head, key=int_key(url, "hdims", 3, 1, d_head)))
    sig = ("real", sentence, layer, head, dims, hdims, n_heads)
    if not sentence.strip():
        st.error("Type a sentence to take X from.")
        return None, sig
    trace = run_safely(lambda: results.result(results.text_trace(MODEL, sentence)), "Sentence")
    if trace is None:
        return None, sig
    too_long = we.too_many_tokens(len(trace.tokens))
    if too_long:
        st.error(too_long)
        return None, sig
    return run_safely(lambda: ls.real_model_example(model, trace, layer, head, dims, hdims, n_heads), "Model"), sig


def settings(url: UrlState) -> tuple[str, int, str]:
    """(preset, number of heads, edit mode) from the first row of widgets (presenter mode: in its settings)."""
    box = presenter.settings_box("Numbers, heads and how to edit them")
    c = (box if box is not None else st).columns([2, 1, 2])
    presets, modes = list(PRESETS), list(MODES)
    preset = c[0].selectbox(
        "Numbers", presets, format_func=lambda p: PRESETS[p], key=url.key("preset", "example", choices=presets)
    )
    n_heads = c[1].number_input(
        "Heads",
        1,
        MAX_HEADS,
        key=int_key(url, "heads", 1, 1, MAX_HEADS),
        help="With h heads, the columns of each W split into h blocks: one head each.",
    )
    mode = c[2].radio(
        "Edit as", modes, format_func=lambda m: MODES[m], horizontal=True, key=url.key("mode", "tables", choices=modes)
    )
    return str(preset), int(n_heads), str(mode)


def masks(url: UrlState, tokens: list[str]) -> np.ndarray | None:
    """The causal and padding masks chosen, as one [n, n] boolean mask (None: nothing masked)."""
    st.subheader("Masks", anchor="masks")
    n = len(tokens)
    left, right = st.columns(2)
    causal = left.checkbox("Causal mask (a token sees only itself and earlier tokens)", key=url.key("causal", False))
    pad_key = url.key("pad", [], cast=int_list, choices=range(n))
    padding = right.multiselect(
        "Padding tokens (hidden as keys)", list(range(n)), format_func=lambda i: f"{i}: {tokens[i]}", key=pad_key
    )
    steps_view.draw_mask_conventions(tokens, padding)
    return ls.build_mask(n, causal, padding)


JUMPS = (
    "Jump to: [Q, K, V](#qkv) · [**Scores, scaling, softmax, Z**](#softmax) · [One query row, every number](#row) · "
    "[Masks](#masks)"
)


def page(url: UrlState) -> None:
    preset, n_heads, mode = settings(url)
    preset_example, sig = preset_controls(url, preset, n_heads)
    if preset_example is None:
        return
    st.caption(preset_example.note)
    presenter.idea("Z = softmax(QKᵀ/√d_k)·V, every intermediate number on screen: edit any cell and follow it.")
    # The lesson's point is one click away on the first screen: the softmax and Z are below the inputs.
    st.markdown(JUMPS)
    example, sig = si.link_edits(url, preset_example, sig)

    st.subheader("Inputs")
    inputs = si.edit_tables(example, sig, n_heads, mode)
    si.record_edits(url, preset_example, inputs)
    we.validate(inputs, n_heads, example.given_qkv)
    for message in inputs.errors.values():
        st.error(escape(message))
    stop = we.not_runnable(example, inputs)
    if stop is not None:
        if stop:
            st.info(stop)
        return
    tokens = inputs.tokens
    mask = masks(url, tokens)
    steps, available = we.run_inputs(example, inputs, mask, n_heads)
    if steps is None:
        st.info(we.NO_W)
        return
    available, overflowed = ls.non_finite(steps, available, tokens)
    for message in overflowed:
        st.error(escape(message))
    f = we.example_formulas(example, inputs, mask is not None)
    steps_view.draw_qkv(steps, available, tokens, f)
    steps_view.draw_heads(steps, available, tokens, f)
    if n_heads > 1 and "Z" in available:
        steps_view.draw_combined(steps, available, tokens, f)
        if preset == "real":
            st.caption("The model also adds a bias b^O here; it is left out of this slice.")
    steps_view.draw_row(url, steps, available, tokens)
    steps_view.draw_pytorch_check(steps, available, tokens, expanded=preset == "sdpa")


def main() -> None:
    run_page("Attention, step by step", INTRO, "step", page)


main()
