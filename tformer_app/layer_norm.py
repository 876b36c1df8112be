"""The "Inside a block" page's "LayerNorm by hand": the lecture's example (small whole numbers whose μ and σ²
come out whole), editable, as LayerNorm or RMSNorm, with every number of one token written out.

    from tformer_app import layer_norm
    layer_norm.draw(url)      # widget values in the page's link: lnorm, eps, lnd, lnrow

The numbers and formulas come from tformer_views.lessons.block; the edited tables do not travel in the link
(a new number of dimensions starts them again from the lecture's numbers).
"""

from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st

from tformer_core.block_steps import LayerNormSteps, RMSNormSteps, layer_norm_steps, rms_norm_steps
from tformer_views.lessons import block as lb
from tformer_views.lessons import tables as lt
from tformer_views.lessons.tables import Inputs

from . import downloads
from .markdown import escape
from .tables import data_editor, matrix_panel
from .url import UrlState, finite_float, int_key

NORMS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm (T5, Llama)"}


def draw(url: UrlState) -> None:
    """The section: the norm, ε and d chosen, the tables edited, then every step."""
    st.header("LayerNorm by hand")
    c = st.columns(3)
    kind = c[0].radio(
        "Norm",
        list(NORMS),
        format_func=NORMS.get,
        horizontal=True,
        key=url.key("lnorm", "layernorm", choices=list(NORMS)),
    )
    eps = c[1].number_input("ε", key=url.key("eps", lb.EXAMPLE_EPS, cast=finite_float), format="%g", step=1e-5)
    dims = c[2].number_input("Dimensions d", 1, 8, key=int_key(url, "lnd", 4, 1, 8))
    st.caption(
        "Small whole numbers whose μ and σ² come out whole, so every step can be checked by hand. Edit any cell, "
        "add or delete tokens, change ε or the number of dimensions; the real model above uses the same formulas."
    )
    inputs = edit_norm_tables(int(dims))
    for message in inputs.errors.values():
        st.error(escape(message))
    X, params = inputs.values.get("X"), inputs.values.get("params")
    bad_eps = lb.eps_problem(eps)
    if bad_eps:
        st.error(bad_eps)
        return
    if X is None or params is None:
        st.info("Fix the tables above to see the steps.")
        return
    gamma, beta = params[0], params[1]
    norm = layer_norm_steps(X, gamma, beta, eps) if kind == "layernorm" else rms_norm_steps(X, gamma, eps)
    show_norm_example(url, norm, inputs.tokens)


def edit_norm_tables(d: int) -> Inputs:
    """X (one row per token) and γ, β, as editable tables started from the lecture's numbers."""
    X, params = lb.example_norm_inputs(d)
    digest = hashlib.sha1(repr(d).encode()).hexdigest()[:8]
    cols = lb.dims_labels(d)
    out = Inputs()
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**x**: one row per token (add or delete rows)")
        frame = pd.DataFrame(X, columns=cols)
        frame.insert(0, "token", list(lb.EXAMPLE_TOKENS))
        edited = data_editor(st, frame, key=f"block.ln.X.{digest}", num_rows="dynamic", hide_index=True)
    with right:
        st.markdown("**γ** (scale) and **β** (shift), one per dimension")
        p = data_editor(
            st,
            pd.DataFrame(params, index=pd.Index(["γ", "β"], name="parameter"), columns=cols),
            key=f"block.ln.p.{digest}",
        )
    out.tokens = lt.tokens_from_column(edited["token"].tolist()) if "token" in edited else []
    out.parse("X", lambda: lt.matrix_from_frame(edited, "x", skip=["token"]))
    out.parse("params", lambda: lt.matrix_from_frame(p, "γ, β"))
    return out


def show_norm_example(url: UrlState, norm: LayerNormSteps | RMSNormSteps, tokens: list[str]) -> None:
    n, d = norm.x.shape
    summary = lb.norm_summary(norm, tokens)
    downloads.table(summary, key="block.table.ln_summary")
    cols = lb.dims_labels(d)
    matrix_panel("x̂", lb.normalized_formula(norm), norm.normalized, tokens, cols, key_prefix="block.ln")
    matrix_panel("y", lb.output_formula(norm), norm.output, tokens, cols, key_prefix="block.ln")
    row = st.selectbox(
        "Token, every number",
        list(range(n)),
        format_func=lambda i: f"{i}: {tokens[i]}",
        key=url.key("lnrow", 0, choices=list(range(n))),
    )
    for formula in lb.written_row(norm, row):
        st.latex(formula)
