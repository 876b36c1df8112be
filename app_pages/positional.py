"""Positional encoding: the sinusoidal table, its formula cell by cell, its waves, how positions compare,
the learned position embeddings of a real model beside it, and rotary position embeddings (RoPE) with a real
model's frequencies (smollm2's, else the default base and a chosen d_head).

Read widgets -> ask the core (tc.sinusoidal_encoding, tc.rope_frequencies, tc.rope_scores) and the views
(tformer_views.lessons.positional, tformer_views.charts.rotary) -> draw. The real model's part and the rotary part
are drawn by tformer_app.real_positions and tformer_app.rope.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import downloads, presenter, real_positions, rope
from tformer_app.page import run_page
from tformer_app.url import UrlState, finite_float, int_key, int_list
from tformer_views.charts.spec import line_chart
from tformer_views.lessons import positional as lp

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
    sentence = real_positions.real_sections(url, base if base > 1 else 10000.0)
    with st.container(key="pe-rotary"):  # one box: the browser tests find (and photograph) the rotary part by it
        st.header("Rotary position embeddings (RoPE)")
        st.markdown(rope.ROPE_INTRO)
        if rope.rope_opened(url):
            rope.rotary_sections(url, sentence)


def main() -> None:
    run_page("Positional encoding", INTRO, "pe", page)


main()
