"""The two experiments under "Does this head matter?" for a language model: patching between two inputs (which
layer x position carries the difference of their answers) and induction heads (a repeated random sequence).
Streamlit drawing only; each grid is long work computed once per input for the whole server (tformer_app.long_work),
with a progress bar while it runs.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

import streamlit as st

import tformer_core as tc
from tformer_views import head_matters as hm
from tformer_views import induction as iv
from tformer_views.charts.spec import heatmap

from . import downloads, long_work, presenter
from .markdown import escape
from .page import run_safely
from .url import UrlState

OWN_PAIR = "your own pair"


def sinks_note(source: str, text: str) -> None:
    """A line under a language model's grid: why so many heads change nothing, with a link to where that is shown
    (Text attention's expander on attention sinks, the same model and text)."""
    query = urlencode({"arch": "decoder", "model": source, "text": text}, quote_via=quote)  # ( and ) quoted too
    st.caption(
        "Many heads change nothing when ablated: most of their attention sits on the first token, an *attention "
        "sink* that lets a head do nothing. Why, and what the model does without it: the expander “Attention sinks "
        f"and massive activations” on [Text attention](./text?{query})."
    )


def patching(url: UrlState, source: str, model: tc.TracedModel) -> None:
    """Input A run again with one cell of its residual stream taken from input B, for every layer x position."""
    st.subheader("Patching between two inputs: which layer × position carries the difference")
    st.markdown(
        "Input A runs again with one cell of its residual stream (the input of a layer, at one position) taken "
        "from input B. Each cell shows how far that moves the prediction from A's answer to B's: 0 = as A, "
        "1 = as B (the logit difference of the two answers)."
    )
    options = [*hm.PAIRS, OWN_PAIR]
    pair = st.selectbox("Pair", options, key=url.key("pair", options[0], choices=options))
    a, b = hm.PAIRS.get(pair, hm.PAIRS["France / Italy"])
    if pair == OWN_PAIR:
        a = st.text_input("Input A (patched)", key=url.key("a", a))
        b = st.text_input("Input B (the source of the patches)", key=url.key("b", b))
    grid = run_safely(lambda: long_work.head_patching(source, model, a, b), "Patching")
    if grid is None:
        return
    rows, cols = hm.patching_axes(grid)
    answers = " → ".join(hm.display_token(x) for x in grid.answers)
    spec = heatmap(
        grid.moved,
        rows,
        cols,
        f"Share of the way from A's answer to B's ({answers})",
        row_title="layer input",
        col_title="position",
        diverging=True,
        domain=(-1.0, 1.0),
        annotate=False,
        cell_size=14,
        cell_width=min(80, max(24, 560 // len(cols))),
    )
    downloads.chart(spec, key="heads.chart.patching")
    st.caption(
        f"logit({escape(hm.display_token(grid.answers[1]))}) − logit({escape(hm.display_token(grid.answers[0]))}): "
        f"{grid.clean:+.3f} on A, "
        f"{grid.source:+.3f} on B. {grid.rows} rows in {grid.passes} batched pass(es), {grid.seconds:.2f} s. "
        "Row “out”: the stream after the last layer, where only the last position is read."
    )


def induction(url: UrlState, source: str, model: tc.TracedModel) -> None:
    """Random tokens twice: each head's induction score, the loss of each repeat, the top heads ablated."""
    st.subheader("Induction heads: copying what came next last time")
    st.markdown(
        "Random tokens cannot be predicted, until they repeat: then a head that finds the token's previous "
        "occurrence and attends to the token after it (an *induction head*) can copy it. Its **induction score**: "
        "the mean attention from each token of the second repeat to the token after its previous occurrence."
    )
    c1, c2, c3 = st.columns(3)
    length = c1.slider("Random tokens per repeat", 8, 64, key=url.key("ind_length", 24, lo=8, hi=64))
    seed = c2.number_input("Seed", 0, 99_999, key=url.key("ind_seed", 0, lo=0, hi=99_999))
    k = c3.slider("Top heads ablated (k)", 1, 20, key=url.key("ind_k", 5, lo=1, hi=20))
    found = run_safely(lambda: long_work.induction_study(source, model, int(length), int(seed)), "Induction")
    if found is None:
        return
    first = " ".join(found.tokens[found.seq.prefix : found.seq.prefix + found.seq.length])
    st.caption(f"The sequence: {escape(first)}, twice ({len(found.tokens)} tokens).")
    tested = run_safely(lambda: long_work.induction_tested(source, model, found, int(k)), "Induction")
    if tested is None:
        return
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Loss, first repeat (nats)", f"{found.first:.2f}")
    m2.metric("Loss, second repeat", f"{found.second:.2f}", f"{found.second - found.first:+.2f}", "inverse")
    m3.metric(
        f"Second, top {k} ablated", f"{tested.second[1]:.2f}", f"{tested.second[1] - found.second:+.2f}", "inverse"
    )
    m4.metric(
        f"Second, {k} random ablated",
        f"{tested.random_second:.2f}",
        f"{tested.random_second - found.second:+.2f}",
        "inverse",
    )
    _induction_charts(found, tested, int(k))


def _induction_charts(found: iv.InductionStudy, tested: iv.InductionAblation, k: int) -> None:
    """The scores' grid beside each token's loss; under them, the attention of the head of highest score."""
    left, right = st.columns(2)
    with left:
        layers, heads = found.scores.shape
        rows, cols = [f"L{i}" for i in range(layers)], [f"H{h}" for h in range(heads)]
        spec = heatmap(found.scores, rows, cols, "Induction score", row_title="layer", col_title="head", domain=(0, 1))
        downloads.chart(spec, key="heads.chart.induction")
    with right:
        table = iv.loss_table(found, tested)
        st.markdown("**Each token's loss (nats), by the position of the token predicted**")
        st.line_chart(
            table,
            x="position",
            y=list(table.columns[3:]),
            color=["#555555", "#d62728", "#1f77b4"],  # clean, the top heads ablated, random heads ablated
            x_label="",
            y_label="",
            height=460,
        )
    named = ", ".join(f"L{h.layer} H{h.head} ({found.scores[h.layer, h.head]:.2f})" for h in tested.top)
    spread = f"{tested.second[2:].min():.2f}–{tested.second[2:].max():.2f}"
    st.caption(
        f"Top {k}: {named}; the mean score of all heads: {found.scores.mean():.3f}. Random: {len(tested.draws)} "
        f"draws of {k} heads among the others (second-repeat loss {spread}; the chart shows their mean). A "
        "repeat's first token is left out of its loss: it follows the token before it by chance."
    )
    n = len(found.tokens)
    title = f"{tested.top[0]}: its attention (the stripe: each token looks at what followed it last time)"
    spec = heatmap(found.pattern, found.tokens, found.tokens, title, domain=(0, 1), cell_size=presenter.cell_size(n))
    spec["usermeta"] = {"scale": presenter.scale()}  # sized for the main column and presenter mode already
    downloads.chart(spec, key="heads.chart.induction_pattern")
