"""Does this head matter? Every head ablated, each head's direct share of the prediction, a head ablated by a click
(the prediction and the attention after it), the logit lens, and patching between two inputs: what attention
weights alone cannot tell.

Read widgets -> one study per input (caches.head_study: long work in its own queue, tformer_views.head_matters,
with a progress bar) -> draw.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import caches, class_session, downloads, presenter, vision_inputs
from tformer_app.events import clicked_cell
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_views import class_questions
from tformer_views import head_matters as hm
from tformer_views import induction as iv
from tformer_views.charts.spec import cell_px, heatmap
from tformer_views.seq2seq import DEFAULT_SOURCES

DEFAULT = "smollm2"
SUGGESTIONS = ("smollm2", "translator", "vit-tiny", "minilm")
TEXT = "The capital of France is"
PAIR = ("The cat sat on the mat.", "A kitten was sitting on the rug.")
OWN_PAIR = "your own pair"
INTRO = (
    "Attention weights show where a head looks, not whether the answer needs it. Here each head is switched off "
    "(its output set to zero) and the prediction measured again; each head's direct share of the winning logit is "
    "read from the residual stream; and the prediction is read after every layer (the logit lens)."
)
# The ablation grid's colours span at least ± a hundredth of the number measured (a probability or a cosine): the
# translator's first word is so sure (p = 0.99999) that no head moves it by 1e-4, and on a range of its own that
# grid would glow dark red and blue over nothing.
LEAST_SPAN = 0.01
# The two grids stand side by side while their cells keep this many pixels (SmolLM2's 30 layers get 18, its numbers
# still legible); a grid of many heads (DeiT-Tiny's 12 on a 1280-px projector) gets the column's width instead.
SIDE_BY_SIDE_PX = 18


def main() -> None:
    run_page("Does this head matter?", INTRO, "heads", page)


def page(url: UrlState) -> None:
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. smollm2, translator, vit-tiny, minilm",
        help="A language model, a translator, a Vision Transformer or a sentence encoder run by tformer's own modules.",
    )
    model = caches.load_model(source)
    if model is None:
        return
    if model.path != "tformer" or model.kind not in ("decoder", "encoder-decoder", "vit", "encoder"):
        st.warning(f"**{escape(source)}** cannot be intervened on here: choose one of {', '.join(SUGGESTIONS)}.")
        return
    asked = _inputs(url, model)
    if asked is None:
        return
    kind, inputs = asked
    study = run_safely(lambda: caches.head_study(source, model, kind, inputs), "Input")
    if study is not None:
        show(url, source, study)
    if model.kind == "decoder":
        patching(url, source, model)
        induction(url, source, model)


def _inputs(url: UrlState, model) -> tuple[str, tuple] | None:
    """(study kind, its inputs) from this kind's widgets; None while no picture is chosen."""
    if model.kind == "decoder":
        return "text", (st.text_input("Text (the model predicts the next token)", key=url.key("text", TEXT)),)
    if model.kind == "encoder-decoder":
        label = "Source (the model writes its first target word)"
        return "translation", (st.text_input(label, key=url.key("source", DEFAULT_SOURCES.get(model.source, ""))),)
    if model.kind == "vit":
        picked = vision_inputs.choose_image(url, model)
        return None if picked is None else ("image", (picked[1], picked[0]))
    first = st.text_input("First sentence", key=url.key("first", PAIR[0]))
    second = st.text_input("Second sentence", key=url.key("second", PAIR[1]))
    return "similarity", (first, second)


def show(url: UrlState, source: str, study: hm.HeadStudy) -> None:
    imp = study.importance
    st.subheader("The prediction")
    _prediction(study)
    st.caption(
        f"Measured: **{escape(study.what)}** = {imp.clean:.4f}. Every head ablated in {imp.passes} batched "
        f"pass(es), {imp.rows} rows, {imp.seconds:.2f} s."
    )
    stacks = list(imp.effects)
    top = imp.ranked()[0][0]  # the page opens on the head that matters most, in its stack
    stack = st.radio("Attention", stacks, horizontal=True, key=url.key("stack", top.stack, choices=stacks))
    effects = hm.grid(study, stack, "ablation")
    layers, heads = effects.shape
    layer_key = url.key("layer", top.layer if top.stack == stack else 0, choices=list(range(layers)))
    head_key = url.key("head", top.head if top.stack == stack else 0, choices=list(range(heads)))
    side = study.attribution is not None and presenter.cell_size(heads, share=0.5) >= SIDE_BY_SIDE_PX
    left, right = st.columns(2) if side else (st.container(), st.container())
    share = 0.5 if side else 1.0
    span = max(float(np.nanmax(np.abs(effects))), LEAST_SPAN)
    with left:
        # Two lines: on one, a class's name ("Egyptian cat") made the chart wider than half a 1280-px column.
        title = [f"Drop in {study.what}", "when the head is ablated (click one)"]
        _grid(url, effects, title, f"ablation-{stack}", share, domain=(-span, span), clickable=True)
    with right:
        if study.attribution is None:
            st.info(f"Direct attribution: {escape(study.note)}")
        else:
            label = hm.display_token(study.attribution.label)
            attribution = hm.grid(study, stack, "attribution")
            _grid(url, attribution, ["Direct share of the logit", f"of {label}"], f"attr-{stack}", share)
    chosen = _ablate_one(url, source, study, stack, (layer_key, head_key), effects.shape)
    # The class's questions about this study (a lecturer in a session only); a reveal ablates the class's head
    # through the same cached request as the page's own ablation: one intervention for the whole class.
    intervention = class_session.Intervention(
        lambda layer, head: caches.result(caches.head_ablation(source, study, stack, layer, head)),
        study.importance.clean,
        effects,
    )
    class_session.offer(lambda: class_questions.head_questions(study, stack, chosen), intervention)
    if study.lens is not None:
        st.subheader("The logit lens: the prediction after every layer")
        table = hm.lens_table(study)
        formats = {c: st.column_config.NumberColumn(c, format="%.3g") for c in table.columns if c.startswith("p(")}
        st.dataframe(table, hide_index=True, column_config=formats)
        ranks = pd.DataFrame({"after layer (-1 = the embedding)": range(-1, len(table) - 1), "rank": table.iloc[:, 3]})
        st.line_chart(ranks, x=ranks.columns[0], y="rank")  # numbers, not labels: "10" would sort before "2"


def _prediction(study: hm.HeadStudy, prediction: list[tuple[str, float]] | None = None) -> None:
    """The top outputs as a table (a similarity: its value, not a probability), beside an image study's picture."""
    value = "value" if study.kind == "similarity" else "probability"
    frame = pd.DataFrame(study.prediction if prediction is None else prediction, columns=["output", value])
    if prediction is not None or study.picture is None:
        st.dataframe(frame, hide_index=True)
        return
    picture, table = st.columns([1, 3])
    picture.image(study.picture, caption=escape(study.inputs[1]))
    table.dataframe(frame, hide_index=True)


def _grid(
    url: UrlState,
    values: np.ndarray,
    title: list[str],
    key: str,
    share: float,
    clickable: bool = False,
    domain: tuple[float, float] | None = None,
) -> None:
    """A layers x heads grid in `share` of the main column: its cells as on their own (40 px, fewer for many
    layers), narrower where its heads would not fit."""
    layers, heads = values.shape
    spec = heatmap(
        values,
        [f"L{i}" for i in range(layers)],
        [f"H{h}" for h in range(heads)],
        title,
        row_title="layer",
        col_title="head",
        diverging=True,
        domain=domain,
        clickable=clickable,
        cell_size=min(cell_px(max(layers, heads)), presenter.cell_size(heads, share=share)),
    )
    chart_key = f"heads.chart.{key}"

    def pick() -> None:
        cell = clicked_cell(st.session_state.get(chart_key), "pair", ("row", "col"))
        if cell is not None:
            url.set("layer", cell[0])
            url.set("head", cell[1])

    selection = {"on_select": pick, "selection_mode": "pair"} if clickable else {}
    downloads.chart(spec, key=chart_key, **selection)


def _ablate_one(url: UrlState, source: str, study: hm.HeadStudy, stack: str, keys, shape) -> hm.Ablation | None:
    """The chosen head ablated, drawn; returns its ablation (None when it could not run)."""
    st.subheader("Ablate a head yourself")
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", list(range(shape[0])), key=keys[0])
    head = c2.selectbox("Head", list(range(shape[1])), key=keys[1])
    request = caches.head_ablation(source, study, stack, int(layer), int(head))
    result = run_safely(lambda: caches.result(request), "Ablation")
    if result is None:
        return None
    change = result.value - study.importance.clean
    digits = _decimals(change)
    st.metric(f"{study.what} with {result.head} ablated", f"{result.value:.{digits}f}", f"{change:+.{digits}f}")
    left, right = st.columns(2)
    with left:
        st.markdown(f"**The prediction with {escape(str(result.head))} ablated**")
        _prediction(study, result.prediction)
    with right:
        _attention(result.own, result.head, result, f"{result.head}: its own attention", "own")
        st.caption(
            "Its weights come before its output, so its ablation leaves them as they are; "
            "the heads after it see a changed stream."
        )
    if result.downstream is None:
        st.caption("No later head's attention changes: the ablated head is in the last layer, or nothing reads it.")
        return result
    st.markdown(
        f"**The head whose attention changes most: {escape(str(result.downstream))}** (by {result.changed:.3f}, "
        "half the L1 distance summed over its rows)"
    )
    before, after = st.columns(2)
    most = float(max(result.before.max(), result.after.max()))  # one colour scale for the two
    with before:
        _attention(result.before, result.downstream, result, f"{result.downstream}, before", "before", most)
    with after:
        title = f"{result.downstream}, with {result.head} ablated"
        _attention(result.after, result.downstream, result, title, "after", most)
    return result


def _decimals(change: float) -> int:
    """Decimals that show a change's first two digits: 4, up to 8 for the tiny changes of a saturated prediction
    (p('varo') = 0.99999 moved by 4e-5 would read 1.0000 both ways)."""
    if change == 0 or abs(change) >= 1e-3:
        return 4
    return min(8, 1 - math.floor(math.log10(abs(change))))


def _attention(weights, head, result: hm.Ablation, title: str, key: str, most: float | None = None) -> None:
    """A head's weights: queries x keys (colours 0 to 1, a row's sum), or for a ViT the class token's row over the
    patch grid (colours 0 to `most`, default its largest weight: DeiT-Tiny's 196 patches share a row, at most a few
    hundredths each, all one dark colour on 0 to 1); sized to its half of the main column (numbers in the cells
    while they fit)."""
    rows, cols = result.labels.get(head.stack, ([], []))
    titles = ("query", "key") if rows else ("patch row", "patch column")
    domain = (0.0, 1.0) if rows else (0.0, float(weights.max()) if most is None else most)
    if not rows:
        rows, cols = [str(i) for i in range(weights.shape[0])], [str(j) for j in range(weights.shape[1])]
    cell = presenter.cell_size(max(len(rows), len(cols)), share=0.5)
    spec = heatmap(
        weights,
        list(rows),
        list(cols),
        title,
        row_title=titles[0],
        col_title=titles[1],
        domain=domain,
        cell_size=cell,
        annotate=None if cell >= SIDE_BY_SIDE_PX else False,
    )
    downloads.chart(spec, key=f"heads.chart.attention.{key}")


def patching(url: UrlState, source: str, model) -> None:
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
    grid = run_safely(lambda: caches.head_patching(source, model, a, b), "Patching")
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


def induction(url: UrlState, source: str, model) -> None:
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
    found = run_safely(lambda: caches.induction_study(source, model, int(length), int(seed)), "Induction")
    if found is None:
        return
    first = " ".join(found.tokens[found.seq.prefix : found.seq.prefix + found.seq.length])
    st.caption(f"The sequence: {escape(first)}, twice ({len(found.tokens)} tokens).")
    tested = run_safely(lambda: caches.induction_tested(source, model, found, int(k)), "Induction")
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
        colours = ["#555555", "#d62728", "#1f77b4"]  # clean, the top heads ablated, random heads ablated
        st.line_chart(table, x="position", y=list(table.columns[3:]), color=colours, x_label="", y_label="", height=460)
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
    downloads.chart(spec, key="heads.chart.induction_pattern")


main()
