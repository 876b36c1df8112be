"""Attention, step by step: the lecture's worked example, editable.

Read widgets (a preset, the edited tables, masks, heads) -> ask tformer_views.lessons.attention (which
runs tc.attention_steps) -> draw every intermediate as a formula, a table, a heatmap and a CSV.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from tformer_app import caches, downloads, presenter
from tformer_app import step_inputs as si
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.tables import matrix_panel
from tformer_app.url import UrlState, int_key, int_list
from tformer_core.steps import AttentionSteps
from tformer_views.lessons import attention as ls
from tformer_views.lessons import worked_example as we
from tformer_views.lessons.worked_example import col_labels, missing

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


# A formula, the numbers as a table (its corner says the name) and a heatmap; files "attention_<name>.csv".
show_matrix = partial(matrix_panel, key_prefix="step", file_prefix="attention")
show_square = partial(show_matrix, col_title="key", row_title="query")  # queries by keys


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
    model = caches.load_model(MODEL)
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
    trace = run_safely(lambda: caches.result(caches.text_trace(MODEL, sentence)), "Sentence")
    if trace is None:
        return None, sig
    too_long = we.too_many_tokens(len(trace.tokens))
    if too_long:
        st.error(too_long)
        return None, sig
    return run_safely(lambda: ls.real_model_example(model, trace, layer, head, dims, hdims, n_heads), "Model"), sig


def draw_head_blocks(view: dict[str, np.ndarray], available: set[str], tokens: list[str], head: int) -> None:
    """Head j's Q, K, V: the j-th block of columns of the full Q, K, V."""
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            width = view[letter].shape[1]
            columns = [f"{letter}{c + 1}" for c in range(width)]
            latex = we.block_formula(part, head, width)
            show_matrix(f"{part} · head {head}", latex, view[letter], tokens, columns, col_title=letter)


def draw_head(steps: AttentionSteps, available: set[str], tokens: list[str], head: int, f: dict[str, str]) -> None:
    """One head's scores, scaled scores, weights and Z (and its Q, K, V blocks when there are several heads)."""
    h = steps.n_heads
    view, f = ls.head_matrices(steps, head), we.head_formulas(f, head, h)
    tag = f" · head {head}" if h > 1 else ""
    if h > 1:
        draw_head_blocks(view, available, tokens, head)
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed for the scores: fix the inputs above."))
        return
    show_square(f"QKᵀ{tag}", f["scores"], view["scores"], tokens, tokens)
    masked = " Masked cells are −∞ (grey)." if steps.mask is not None else ""
    scaled = f"d_k = {steps.d_k}, so every score is multiplied by 1/√{steps.d_k} = {steps.scale:.4g}.{masked}"
    show_square(f"scaled{tag}", f["scaled"], view["scaled"], tokens, tokens, caption=scaled)
    weights = "Each row sums to 1; a masked cell gets e^−∞ = 0."
    show_square(f"weights{tag}", f["weights"], view["weights"], tokens, tokens, domain=(0.0, 1.0), caption=weights)
    if "Z" in available:
        columns = [f"z{c + 1}" for c in range(view["z"].shape[1])]
        show_matrix(f"Z{tag}", f["z"], view["z"], tokens, columns, col_title="z")
    else:
        st.info(missing("Z", available, "V is needed for Z: fix W^V above."))


def draw_row(url: UrlState, steps: AttentionSteps, available: set[str], tokens: list[str]) -> None:
    """One query row with every number written out."""
    st.subheader("One query row, every number", anchor="row")
    if "scores" not in available:
        st.info(missing("scores", available, "Q and K are needed: fix the inputs above."))
        return
    rows, heads = list(range(len(tokens))), list(range(steps.n_heads))
    left, right = st.columns(2)
    query = left.selectbox(
        "Query token", rows, format_func=lambda i: f"{i}: {tokens[i]}", key=url.key("query", 0, choices=rows)
    )
    head = 0
    if steps.n_heads > 1:
        head = right.selectbox("Head", heads, format_func=lambda j: f"head {j}", key=url.key("qhead", 0, choices=heads))
    walk = ls.row_walkthrough(steps, tokens, query, head)
    q = ls.head_matrices(steps, head)["q"][query]
    name = tokens[query]
    st.markdown(
        f"q({escape(name)}) = [{', '.join(ls.fmt(x) for x in q)}]. For each key j: the dot product q·k_j, "
        f"divided by √d_k = √{walk.d_k}, then exp, then divided by the sum of the exps."
    )
    keys, numeric, contributions = we.row_tables(walk)
    st.caption(f"Keys for q({escape(name)}):")  # a table's corner is too narrow for this
    presenter.table(keys.style.format("{:.4g}", subset=numeric))
    if walk.shift:
        st.caption(
            f"The scores are large, so exp is taken of a − max = a − {ls.fmt(walk.shift)} to avoid overflow; "
            "the weights are unchanged (the factor e^−max cancels in the division)."
        )
    softmax, z = we.row_formulas(walk)
    st.latex(softmax)
    if "Z" not in available:
        st.info(missing("Z", available, "V is needed for z: fix W^V above."))
        return
    st.markdown(f"z({escape(name)}) is the weighted sum of the rows of V:")
    st.latex(z)
    presenter.table(contributions.style.format("{:.4g}"))
    raw = walk.contributions
    downloads.matrix_download(
        raw.to_numpy(), list(raw.index), list(raw.columns), f"attention_row_{query}.csv", key="step.csv.row"
    )


def settings(url: UrlState) -> tuple[str, int, str]:
    """(preset, number of heads, edit mode) from the first row of widgets."""
    c = st.columns([2, 1, 2])
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
    draw_mask_conventions(tokens, padding)
    return ls.build_mask(n, causal, padding)


def draw_mask_conventions(tokens: list[str], padding: list[int]) -> None:
    """The same padding in the conventions students meet: two of them use True for opposite things."""
    with st.expander("The padding mask in PyTorch's conventions (True means opposite things)", expanded=bool(padding)):
        presenter.table(we.mask_conventions_frame(tokens, padding))
        st.caption(
            "nn.MultiheadAttention's key_padding_mask marks the padding with True; F.scaled_dot_product_attention's "
            "boolean attn_mask marks what may be attended to with True. Passing one where the other is expected "
            "hides exactly the wrong keys: convert with attn_mask = ~key_padding_mask. The additive form turns "
            "either into 0 / −∞ before the softmax, where e^−∞ = 0."
        )


def draw_qkv(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    st.subheader("Q, K, V", anchor="qkv")
    n_heads = steps.n_heads
    for part, letter in (("Q", "q"), ("K", "k"), ("V", "v")):
        if part in available:
            matrix = getattr(steps, part)
            show_matrix(part, f[part], matrix, tokens, col_labels(letter, matrix.shape[1], n_heads), col_title=letter)
    if n_heads > 1:
        st.latex(we.heads_formula(f, steps.d_k))


def draw_heads(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    st.subheader("Scores, scaling, softmax, Z", anchor="softmax")
    if steps.n_heads == 1:
        draw_head(steps, available, tokens, 0, f)
        return
    for j, tab in enumerate(st.tabs([f"Head {j}" for j in range(steps.n_heads)])):
        with tab:
            draw_head(steps, available, tokens, j, f)


def draw_combined(steps: AttentionSteps, available: set[str], tokens: list[str], f: dict[str, str]) -> None:
    """Several heads: their outputs concatenated, then mixed by W^O."""
    n_heads, width = steps.n_heads, steps.concat.shape[1]
    st.subheader("Heads together: concat, then W^O")
    caption = f"{n_heads} heads × d_v = {width // n_heads} → {width} columns."
    columns = col_labels("z", width, n_heads)
    show_matrix("concat", f["concat"], steps.concat, tokens, columns, col_title="z", caption=caption)
    if "output" not in available:
        st.info(missing("output", available, "W^O is needed for the output: fix it above."))
        return
    columns = [f"o{c + 1}" for c in range(steps.output.shape[1])]
    show_matrix("output", f["output"], steps.output, tokens, columns, col_title="output")


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
    draw_qkv(steps, available, tokens, f)
    draw_heads(steps, available, tokens, f)
    if n_heads > 1 and "Z" in available:
        draw_combined(steps, available, tokens, f)
        if preset == "real":
            st.caption("The model also adds a bias b^O here; it is left out of this slice.")
    draw_row(url, steps, available, tokens)
    draw_pytorch_check(steps, available, tokens, expanded=preset == "sdpa")


def draw_pytorch_check(steps: AttentionSteps, available: set[str], tokens: list[str], expanded: bool) -> None:
    """The same Z from PyTorch's F.scaled_dot_product_attention, on the same q, k, v and mask."""
    if "Z" not in available:
        return
    with st.expander("The same with PyTorch: F.scaled_dot_product_attention", expanded=expanded):
        z, diff = ls.torch_sdpa(steps)
        if expanded:
            st.code(ls.SDPA_CODE, language="python")
        st.caption(
            "PyTorch takes q, k, v per head ([h, n, d] tensors) and scales by 1/√d_k itself; a boolean attn_mask "
            "means True = may attend."
        )
        for frame in we.sdpa_frames(z, steps.n_heads, tokens):
            presenter.table(frame.style.format("{:.4f}"))
        st.caption(f"Largest difference from Z above: {diff:.1e} (float64 rounding).")


def main() -> None:
    run_page("Attention, step by step", INTRO, "step", page)


main()
