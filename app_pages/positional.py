"""Positional encoding: the sinusoidal table, its formula cell by cell, its waves, how positions compare,
the learned position embeddings of a real model beside it, and rotary position embeddings (RoPE) with a real
model's frequencies (smollm2's, else the default base and a chosen d_head).

Read widgets -> ask the core (tc.sinusoidal_encoding, tc.rope_frequencies, tc.rope_scores) and the views
(tformer_views.lessons.positional, tformer_views.charts.rotary) -> draw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import downloads, models, presenter, results, rope
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.url import UrlState, finite_float, int_key, int_list
from tformer_views.charts.spec import line_chart, unique_labels
from tformer_views.lessons import positional as lp

MODEL = DEFAULT_TEXT_MODEL
DEFAULT_SENTENCE = "The cat sat on the mat."
SIMILARITIES = {"dot": "Dot product", "cosine": "Cosine"}


INTRO = (
    "Attention alone does not know word order: shuffle the tokens and every output is shuffled the same way. "
    "A position vector added to each token's embedding tells the model where the token is."
)


# ---- the sinusoidal table -------------------------------------------------------------------------
def sinusoidal_sections(url: UrlState, n: int, d: int, base: float) -> None:
    pe = tc.sinusoidal_encoding(n, d, base)  # [n, d]
    show_table(pe, base)
    show_formula(n, d, base)
    show_waves(url, pe, base)
    show_similarity(url, pe, base)
    show_offsets(pe, base)


def show_table(pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.subheader("The table")
    st.latex(
        rf"PE_{{(pos,\,2i)}} = \sin\!\left(\frac{{pos}}{{{base:g}^{{2i/d}}}}\right),\qquad "
        rf"PE_{{(pos,\,2i+1)}} = \cos\!\left(\frac{{pos}}{{{base:g}^{{2i/d}}}}\right),\qquad d = {d}"
    )
    st.caption(
        f"Rows: positions 0..{n - 1}. Columns: dimensions 0..{d - 1}; dimension pair i turns at "
        f"ω_i = 1/{base:g}^(2i/d) radians per position: fast on the left, slow on the right."
    )
    downloads.big_heatmap(
        pe, f"Sinusoidal PE, {n} positions × d = {d}, base {base:g}", "position", "dimension", "sinusoidal_pe"
    )
    downloads.corner("PE", pe, [str(p) for p in range(n)], [str(j) for j in range(d)])


def show_formula(n: int, d: int, base: float) -> None:
    st.subheader("Cell by cell")
    st.caption(
        "The first positions and dimensions with the numbers put into the formula (2i counts the pair: "
        "dimensions 2i and 2i+1 share one frequency)."
    )
    table = lp.formula_table(min(6, n), min(6, d), base, d)
    st.dataframe(table)
    st.download_button(
        "Download CSV", table.to_csv().encode("utf-8"), "pe_formulas.csv", "text/csv", key="pe.csv.formulas"
    )


def show_waves(url: UrlState, pe: np.ndarray, base: float) -> None:
    d = pe.shape[1]
    st.subheader("Each dimension is a wave")
    dims_key = url.key("dims", [j for j in (0, 1, 20, 60) if j < d], cast=int_list, choices=range(d))  # fast, slow
    chosen = st.multiselect("Dimensions", list(range(d)), key=dims_key)
    if not chosen:
        return
    curves = line_chart(
        lp.curves_frame(pe, chosen), "position", "value", "dimension", title="PE[pos, dim] over positions", y_title="PE"
    )
    downloads.chart(curves, key="pe.chart.curves")
    omega = lp.frequencies(d, base)[[j // 2 for j in chosen]]
    st.caption(
        "Wavelength (positions per turn): " + ", ".join(f"dim {j}: {2 * np.pi / w:,.1f}" for j, w in zip(chosen, omega))
    )


def show_similarity(url: UrlState, pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.subheader("How similar are two positions?")
    kind = st.radio(
        "Similarity",
        list(SIMILARITIES),
        format_func=SIMILARITIES.get,
        horizontal=True,
        key=url.key("sim", "dot", choices=list(SIMILARITIES)),
    )
    sim = lp.similarity(pe, kind)
    if kind == "dot":
        st.latex(rf"PE(p)\cdot PE(q) = \sum_i \cos(\omega_i (q - p)),\qquad PE(p)\cdot PE(p) = d/2 = {d // 2}")
    else:
        st.latex(
            r"\cos\angle(PE(p), PE(q)) = \frac{PE(p)\cdot PE(q)}{\lVert PE(p)\rVert\,\lVert PE(q)\rVert}"
            r" = \frac{2}{d}\sum_i \cos(\omega_i (q-p))"
        )
    downloads.big_heatmap(
        sim, f"{SIMILARITIES[kind]} between positions", "position p", "position q", f"pe_{kind}", square=True
    )
    downloads.corner("similarity", sim, [str(p) for p in range(n)], [str(p) for p in range(n)])


def show_offsets(pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.markdown(
        "**It depends only on the offset.** Since sin a sin b + cos a cos b = cos(a − b), each "
        "frequency contributes cos(ω_i k) for positions k apart, wherever they start:"
    )
    starts = sorted({0, n // 4, n // 2} - {n - 1}) if n > 1 else [0]
    max_offset = max(1, min(n - 1 - max(starts), 100))
    curves = lp.offset_products(pe, starts, max_offset)
    ks = np.arange(max_offset + 1)
    formula = pd.DataFrame({"offset k": ks, "dot": lp.offset_formula(d, base, ks)})
    chart = line_chart(
        curves,
        "offset k",
        "dot",
        "start",
        title="PE(p)·PE(p+k): one curve, whatever p",
        y_title="PE(p)·PE(p+k)",
        reference=formula,
    )
    downloads.chart(chart, key="pe.chart.offset")
    st.caption(
        "The coloured curves (one per start p) lie exactly on top of each other and on the dashed "
        "Σ cos(ω_i k). The first offsets, in numbers:"
    )
    wide = curves.pivot(index="offset k", columns="start", values="dot")
    wide["Σ cos(ω_i k)"] = lp.offset_formula(d, base, wide.index.to_numpy())
    wide.index = pd.Index([str(k) for k in wide.index], name="PE(p)·PE(p+k)")
    st.dataframe(wide.head(downloads.CORNER).style.format("{:.4f}"))
    downloads.matrix_download(
        wide.to_numpy(), list(wide.index), list(wide.columns), "pe_offsets.csv", key="pe.csv.offsets"
    )


# ---- a real model -----------------------------------------------------------------------------------
def real_sections(url: UrlState, base: float) -> str:
    """The real sentence's parts and the learned positions; returns the sentence (the rotary part uses it)."""
    st.subheader(f"x + PE on a real sentence ({MODEL})")
    st.caption(
        f"{MODEL} is BERT-like: its positions are **learned** vectors (one trained row per position), added to the "
        "token embeddings together with a segment embedding; LayerNorm then gives layer 0's input. The "
        "original Transformer instead adds the fixed **sinusoidal** table (scaling the token embedding by √d first)."
    )
    left, right = st.columns([3, 1])
    sentence = left.text_input("Sentence", key=url.key("text", DEFAULT_SENTENCE))
    n_dims = right.number_input("Dims shown", 1, 32, key=int_key(url, "xdims", 5, 1, 32))
    model = models.load_model(MODEL)
    if model is None:
        return sentence
    if not sentence.strip():
        st.error("Type a sentence.")
    else:
        trace = run_safely(lambda: results.result(results.text_trace(MODEL, sentence)), "Sentence")
        parts = run_safely(lambda: lp.embedding_sum(trace, base), "Embeddings") if trace is not None else None
        if parts is not None:
            show_embedding_parts(parts, int(n_dims), base)
    show_learned_vs_sinusoidal(url, model, base)
    return sentence


def show_embedding_parts(parts: lp.EmbeddingSum, n_dims: int, base: float) -> None:
    tokens = unique_labels(parts.tokens)  # a sentence may repeat a word
    dims = [str(j) for j in range(n_dims)]
    d_model = parts.tok.shape[1]
    st.caption(f"First {n_dims} of {d_model} dimensions.")
    views = [
        ("token embedding", parts.tok, "E[token]: the word's own vector, the same at every position."),
        ("learned position", parts.pos, "P[pos]: the model's trained row for each position."),
        ("segment", parts.segment, "The segment (sentence A) embedding: the same row for every token here."),
        ("sum (before LayerNorm)", parts.total, "E + P + segment: what LayerNorm turns into layer 0's input."),
        (
            f"sinusoidal PE (base {base:g})",
            parts.sinusoidal,
            f"What the original Transformer would add at d = {d_model} (not used by this model).",
        ),
        ("token + sinusoidal", parts.tok_plus_sinusoidal, "E + PE: the sum with the sinusoidal table instead."),
    ]
    for row in range(0, len(views), 2):
        for column, (name, matrix, what) in zip(st.columns(2), views[row : row + 2]):
            with column:
                st.markdown(f"**{name}**")
                st.caption(what)
                frame = pd.DataFrame(matrix[:, :n_dims], index=pd.Index(tokens, name=name), columns=dims)
                st.dataframe(frame.style.format("{:.4f}"))
                downloads.matrix_download(
                    matrix,
                    tokens,
                    [str(j) for j in range(d_model)],
                    f"{name.split(' (')[0].replace(' ', '_')}.csv",
                    key=f"pe.csv.x.{row}.{name}",
                )
    st.markdown("**Lengths of the vectors** (all dimensions): how strongly each part pulls on the sum.")
    norms = parts.norms()
    norms.index = pd.Index(tokens, name="length")
    st.dataframe(norms.style.format("{:.3f}"))
    st.caption(
        f"Every sinusoidal row has length √(d/2) = {np.sqrt(d_model / 2):.2f}, far longer than these "
        "token embeddings: added as is, it would drown them. The original Transformer multiplies the "
        f"token embedding by √d = {np.sqrt(d_model):.1f} first; a learned table is simply trained at "
        "the right scale."
    )


def show_learned_vs_sinusoidal(url: UrlState, model: tc.TracedModel, base: float) -> None:
    st.subheader("Learned vs sinusoidal positions")
    max_pos = min(model.max_tokens or lp.MAX_PE_POSITIONS, lp.MAX_PE_POSITIONS)
    n = st.slider("Positions", 2, max_pos, key=int_key(url, "learned", 64, 2, max_pos))
    learned = run_safely(lambda: lp.learned_positions(model, n), "Learned positions")
    if learned is None:
        return
    d_model = learned.shape[1]
    sinus = tc.sinusoidal_encoding(n, d_model, base)
    halves = (
        ("Learned", f"{MODEL}, d = {d_model}", learned, "Learned position embeddings", "learned", "learned_pe"),
        (
            "Sinusoidal",
            f"base {base:g}, d = {d_model}",
            sinus,
            "Sinusoidal PE",
            "sinusoidal",
            "sinusoidal_pe_model_size",
        ),
    )
    for column, (name, about, table, title, kind, file_key) in zip(st.columns(2), halves):
        with column:
            st.markdown(f"**{name}** ({about})")
            downloads.big_heatmap(table, title, "position", "dimension", file_key, width=340)
            downloads.big_heatmap(
                lp.similarity(table, "cosine"),
                f"Cosine similarity, {kind}",
                "position p",
                "position q",
                f"{kind}_cosine",
                square=True,
                width=340,
            )
    st.caption(
        "Both give nearby positions similar vectors (the dark band along the diagonal). The sinusoidal band has "
        "the same shape on every row (it depends only on the offset); the learned one need not, and it only "
        f"exists for the {model.max_tokens} positions the model was trained with."
    )


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Positions, d_model and base")
    presenter.idea(
        "Each position gets its own pattern: sin and cos at wavelengths from 2π to base·2π, one pair per two "
        "dimensions."
    )
    c = (settings if settings is not None else st).columns(3)
    n = c[0].number_input(
        "Positions",
        1,
        lp.MAX_PE_POSITIONS,
        key=int_key(url, "n", 50, 1, lp.MAX_PE_POSITIONS),
        help=f"1 to {lp.MAX_PE_POSITIONS}.",
    )
    d = c[1].number_input(
        "d_model",
        2,
        lp.MAX_PE_D_MODEL,
        step=2,
        key=int_key(url, "d", 128, 2, lp.MAX_PE_D_MODEL),
        help=f"Even, 2 to {lp.MAX_PE_D_MODEL}: dimensions come in sin/cos pairs.",
    )
    base = float(
        c[2].number_input(
            "Base",
            key=url.key("base", 10000.0, cast=finite_float),
            format="%g",
            help="10000 in Attention Is All You Need; the lecture's small example uses 100. Must be greater than 1.",
        )
    )
    problems = lp.pe_problems(int(n), int(d), base)
    for problem in problems:
        st.error(problem)
    if problems:
        st.info("Fix the settings above to see the encoding.")
    else:
        sinusoidal_sections(url, int(n), int(d), base)
    # The real-model part still works when only the table settings are wrong; it needs a usable base.
    sentence = real_sections(url, base if base > 1 else 10000.0)
    with st.container(key="pe-rotary"):  # one box: the browser tests find (and photograph) the rotary part by it
        st.header("Rotary position embeddings (RoPE)")
        st.markdown(rope.ROPE_INTRO)
        if rope.rope_opened(url):
            rope.rotary_sections(url, sentence)


def main() -> None:
    run_page("Positional encoding", INTRO, "pe", page)


main()
