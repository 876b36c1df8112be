"""What "Does this head matter?" draws of one study: the layers x heads grid beside what the chosen head changes
(a click on the grid, or the keys ← → ↑ ↓, choose it), then the prediction, the head whose attention changed most,
each head's direct share of the logit and the logit lens. Streamlit drawing only; the numbers come from
tformer_views.head_matters, computed through tformer_app.long_work and tformer_app.results (once per input for the
whole server).

    top = heads_view.top()                          # presenter mode: the key idea's line and the folded settings
    with presenter.folded(top.settings): ...        # a page's inputs: in the settings, or on the page
    heads_view.show(url, source, study, top)        # everything else

On a projector (presenter mode) the first screen holds the title, one line with the key idea and the closed
settings, and the grid beside the chosen head's effect: the grid is sized to the room left on a 16:9 screen, its
numbers printed only at 14 px or more (else its colours alone, and the head's number large beside it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tformer_views import class_questions
from tformer_views import head_matters as hm
from tformer_views.charts.head_grid import NUMBER_EM, GridLook, chrome, grid_look, head_grid
from tformer_views.charts.spec import heatmap

from . import class_session, downloads, presenter, results
from .attention_panel import head_keys
from .events import clicked_cell
from .markdown import escape
from .page import run_safely
from .url import UrlState

# The ablation grid's colours span at least ± a hundredth of the number measured (a probability or a cosine): the
# translator's first word is so sure (p = 0.99999) that no head moves it by 1e-4, and on a range of its own that
# grid would glow dark red and blue over nothing.
LEAST_SPAN = 0.01
PRESENTER_FONT_PX = 14  # the least a class reads from the back of a room: smaller numbers are not printed
PAGE_FONT_PX = 9  # the least on a screen of one's own
# Presenter mode's first screen (presenter.screen_height: a 16:9 projector) less what stands above the grid (the
# presenter bar, the title, the key idea's line with the closed settings) and a margin below.
ABOVE_GRID_PX = 210
GRID_BOX_PX = 640  # the grid's height on a page of its own (outside presenter mode): a laptop's screen
COLUMN_GAP_PX = 16  # between two columns (Streamlit's "small" gap)
# Small enough for a head's own attention to print its weights (a 5-token sentence) in half a column.
NUMBERED_CELL_PX = 18
EFFECT_CSS = """<style>
.st-key-heads-effect [data-testid="stMetricValue"] { font-size: %(value)dpx; }
.st-key-heads-effect [data-testid="stMetricDelta"] { font-size: %(delta)dpx; }
.st-key-heads-effect [data-testid="stMetricLabel"] p { font-size: %(label)dpx; }
</style>"""


@dataclass(frozen=True)
class Top:
    """What stands under the page's title: in presenter mode the key idea's line (filled once the study says what
    it measures) beside the closed settings (`presenter.first_line`); outside it, neither (None)."""

    idea: Any
    settings: Any


def top() -> Top:
    """In presenter mode one row: the key idea (filled by `show`) beside the closed settings."""
    return Top(*presenter.first_line("Model, input and head"))


def key_idea(what: str) -> str:
    """The page's key idea in one line (Markdown, escaped), for the number the study measures."""
    return f"Each head switched off in turn: the colour is how far **{escape(what)}** drops."


def show(url: UrlState, source: str, study: hm.HeadStudy, top: Top) -> None:
    """The study: the grid beside the chosen head's effect, then the rest (see the module)."""
    presenting = top.settings is not None
    if not presenting:
        prediction(study)
    stacks = list(study.importance.effects)
    first = study.importance.ranked()[0][0]  # the page opens on the head that matters most, in its stack
    with presenter.folded(top.settings):
        stack = st.radio("Attention", stacks, horizontal=True, key=url.key("stack", first.stack, choices=stacks))
    effects = hm.grid(study, stack, "ablation")
    layers, heads = effects.shape
    keys = (
        url.key("layer", first.layer if first.stack == stack else 0, choices=list(range(layers))),
        url.key("head", first.head if first.stack == stack else 0, choices=list(range(heads))),
    )
    layer, head = int(st.session_state[keys[0]]), int(st.session_state[keys[1]])  # a click's, a key's, a link's
    if presenting:
        top.idea.markdown(key_idea(study.what))
        with top.settings:
            _head_boxes(keys, effects.shape)
    share = grid_share(heads, presenter.room(), presenting)
    left, right = st.columns([share, 1 - share], gap="small")
    with left:
        draw_grid(url, study, stack, effects, (layer, head), share)
    with right, st.container(key="heads-effect"):
        if not presenting:
            _head_boxes(keys, effects.shape)
        chosen = effect(url, source, study, stack, (layer, head), effects.shape, 1 - share)
    # The class's questions about this study (a lecturer in a session only); a reveal ablates the class's head
    # through the same cached request as the page's own ablation: one intervention for the whole class.
    intervention = class_session.Intervention(
        lambda layer, head: results.result(results.head_ablation(source, study, stack, layer, head)),
        study.importance.clean,
        effects,
    )
    class_session.offer(lambda: class_questions.head_questions(study, stack, chosen), intervention)
    if chosen is not None:
        downstream(chosen)
    if presenting:
        prediction(study)
    attribution_and_lens(study, stack)


def _head_boxes(keys: tuple[str, str], shape: tuple[int, int]) -> None:
    c1, c2 = st.columns(2)
    c1.selectbox("Layer", list(range(shape[0])), key=keys[0])
    c2.selectbox("Head", list(range(shape[1])), key=keys[1])


def grid_share(heads: int, room: int, presenting: bool) -> float:
    """The grid's share of a main column `room` px wide, the chosen head's effect taking the rest: what its heads
    need for cells that hold numbers at the least legible size (presenter mode's, or a page's), from 45 to 60 per
    cent."""
    least = PRESENTER_FONT_PX if presenting else PAGE_FONT_PX
    cell = math.ceil(least * NUMBER_EM + 6) + 1  # a pixel to spare for the rounding of the column's width
    needed = heads * cell + chrome(label_font(presenting))[0] + COLUMN_GAP_PX // 2
    return min(0.6, max(0.45, needed / room))


def grid_box(share: float, room: int, screen: int | None) -> tuple[int, int]:
    """(width, height) px for the grid in `share` of a main column `room` px wide: on a projector (presenter mode)
    as high as its first screen, `screen` px high (`presenter.screen_height`), leaves; else GRID_BOX_PX."""
    width = round(room * share) - COLUMN_GAP_PX // 2
    return width, GRID_BOX_PX if screen is None else screen - ABOVE_GRID_PX


def label_font(presenting: bool) -> int:
    """The grids' axis labels and titles: Vega-Lite's 11 px, 1.5 times that in presenter mode."""
    return round(11 * (presenter.FONT_SCALE if presenting else 1.0))


def look_of(layers: int, heads: int, box: tuple[int, int], presenting: bool) -> GridLook:
    """How a grid of layers x heads is drawn in a box of (width, height) px (tformer_views.charts.head_grid)."""
    return grid_look(
        layers,
        heads,
        *box,
        least_font=PRESENTER_FONT_PX if presenting else PAGE_FONT_PX,
        label_font=label_font(presenting),
        most_cell=round(56 * (presenter.FONT_SCALE if presenting else 1.0)),
    )


def draw_grid(
    url: UrlState, study: hm.HeadStudy, stack: str, effects: np.ndarray, chosen: tuple[int, int], share: float
) -> None:
    """The ablation grid in `share` of the main column, clickable (a click chooses that head), `chosen` outlined."""
    presenting = presenter.presenting()
    screen = presenter.screen_height() if presenting else None
    layers, heads = effects.shape
    look = look_of(layers, heads, grid_box(share, presenter.room(), screen), presenting)
    scale = presenter.scale()
    span = max(float(np.nanmax(np.abs(effects))), LEAST_SPAN)
    # Two lines: on one, a class's name ("Egyptian cat") made the chart wider than its column.
    title = [f"Drop in {study.what}", "when the head is ablated (click one)"]
    spec = head_grid(effects, title, look, chosen=chosen, domain=(-span, span), clickable=True, scale=scale)
    chart_key = f"heads.chart.ablation-{stack}"

    def pick() -> None:
        cell = clicked_cell(st.session_state.get(chart_key), "pair", ("row", "col"))
        if cell is not None:
            url.set("layer", cell[0])
            url.set("head", cell[1])

    downloads.chart(spec, key=chart_key, on_select=url.callback(pick), selection_mode="pair")
    if not look.numbers:
        st.caption("Each head's number: hover over its cell; the chosen head's is beside the grid.")


def effect(
    url: UrlState,
    source: str,
    study: hm.HeadStudy,
    stack: str,
    chosen: tuple[int, int],
    shape: tuple[int, int],
    share: float,
) -> hm.Ablation | None:
    """The chosen head switched off, in `share` of the main column: the number (large: the grid's cell for it), the
    keys that step the head, the prediction then and the head's own attention. Returns its ablation (None when it
    could not run)."""
    layer, head = chosen
    request = results.head_ablation(source, study, stack, layer, head)
    result = run_safely(lambda: results.result(request, f"Switching off {stack} L{layer} H{head}:"), "Ablation")
    if presenter.presenting():
        st.html(EFFECT_CSS % {"value": 48, "delta": 30, "label": 22})
    if result is None:
        return None
    change = result.value - study.importance.clean
    digits = decimals(change)
    label = f"{escape(study.what)} with {escape(str(result.head))} ablated"  # Markdown: a token may hold * or _
    st.metric(label, f"{result.value:.{digits}f}", f"{change:+.{digits}f}")
    head_keys(url, "", *shape)
    st.markdown(f"**The prediction with {escape(str(result.head))} ablated**")
    prediction(study, result.prediction)
    attention(result.own, result.head, result, f"{result.head}: its own attention", "own", share=share)
    st.caption(
        "Its weights come before its output, so its ablation leaves them as they are; "
        "the heads after it see a changed stream."
    )
    return result


def downstream(result: hm.Ablation) -> None:
    """The later head whose attention the ablation changed most, before and after (one colour scale)."""
    if result.downstream is None or result.before is None or result.after is None:
        st.caption("No later head's attention changes: the ablated head is in the last layer, or nothing reads it.")
        return
    st.markdown(
        f"**The head whose attention changes most: {escape(str(result.downstream))}** (by {result.changed:.3f}, "
        "half the L1 distance summed over its rows)"
    )
    before, after = st.columns(2)
    most = float(max(result.before.max(), result.after.max()))  # one colour scale for the two
    with before:
        attention(result.before, result.downstream, result, f"{result.downstream}, before", "before", most)
    with after:
        title = f"{result.downstream}, with {result.head} ablated"
        attention(result.after, result.downstream, result, title, "after", most)


def prediction(study: hm.HeadStudy, ablated: list[tuple[str, float]] | None = None) -> None:
    """The study's top outputs as a table (a similarity: its value, not a probability) with its caption, beside an
    image study's picture; `ablated`: the top outputs with the chosen head switched off, alone."""
    value = "value" if study.kind == "similarity" else "probability"
    frame = pd.DataFrame(study.prediction if ablated is None else ablated, columns=["output", value])
    if ablated is not None:
        if presenter.presenting():
            presenter.table(frame)  # type grown with the presenter's
        else:
            st.dataframe(frame, hide_index=True)
        return
    st.subheader("The prediction")
    if study.picture is None:
        st.dataframe(frame, hide_index=True)
    else:
        picture, table = st.columns([1, 3])
        picture.image(study.picture, caption=escape(study.inputs[1]))
        table.dataframe(frame, hide_index=True)
    imp = study.importance
    st.caption(
        f"Measured: **{escape(study.what)}** = {imp.clean:.4f}. Every head ablated in {imp.passes} batched "
        f"pass(es), {imp.rows} rows, {imp.seconds:.2f} s."
    )


def attribution_and_lens(study: hm.HeadStudy, stack: str) -> None:
    """Each head's direct share of the winning logit beside the logit lens (both read from the clean pass)."""
    if study.attribution is None and study.lens is None:
        st.info(f"Direct attribution: {escape(study.note)}")
        return
    st.subheader("Read from the clean pass: each head's direct share, and the prediction after every layer")
    left, right = st.columns(2)
    with left:
        if study.attribution is None:
            st.info(f"Direct attribution: {escape(study.note)}")
        else:
            values = hm.grid(study, stack, "attribution")
            presenting = presenter.presenting()
            screen = presenter.screen_height() if presenting else None
            layers, heads = values.shape
            look = look_of(layers, heads, grid_box(0.5, presenter.room(), screen), presenting)
            title = ["Direct share of the logit", f"of {hm.display_token(study.attribution.label)}"]
            spec = head_grid(values, title, look, scale=presenter.scale())
            downloads.chart(spec, key=f"heads.chart.attr-{stack}")
    if study.lens is None:
        return
    with right:
        table = hm.lens_table(study)
        formats = {c: st.column_config.NumberColumn(c, format="%.3g") for c in table.columns if c.startswith("p(")}
        st.markdown("**The logit lens: the prediction after every layer**")
        st.dataframe(table, hide_index=True, column_config=formats)
    ranks = pd.DataFrame({"after layer (-1 = the embedding)": range(-1, len(table) - 1), "rank": table.iloc[:, 3]})
    st.line_chart(ranks, x=ranks.columns[0], y="rank")  # numbers, not labels: "10" would sort before "2"


def decimals(change: float) -> int:
    """Decimals that show a change's first two digits: 4, up to 8 for the tiny changes of a saturated prediction
    (p('varo') = 0.99999 moved by 4e-5 would read 1.0000 both ways)."""
    if change == 0 or abs(change) >= 1e-3:
        return 4
    return min(8, 1 - math.floor(math.log10(abs(change))))


def attention(
    weights: np.ndarray,
    head: Any,
    result: hm.Ablation,
    title: str,
    key: str,
    most: float | None = None,
    share: float = 0.5,
) -> None:
    """A head's weights: queries x keys (colours 0 to 1, a row's sum), or for a ViT the class token's row over the
    patch grid (colours 0 to `most`, default its largest weight: DeiT-Tiny's 196 patches share a row, at most a few
    hundredths each, all one dark colour on 0 to 1); sized to `share` of the main column (numbers in the cells while
    they fit)."""
    rows, cols = result.labels.get(head.stack, ((), ()))
    titles = ("query", "key") if rows else ("patch row", "patch column")
    domain = (0.0, 1.0) if rows else (0.0, float(weights.max()) if most is None else most)
    if not rows:
        rows, cols = tuple(str(i) for i in range(weights.shape[0])), tuple(str(j) for j in range(weights.shape[1]))
    cell = presenter.cell_size(max(len(rows), len(cols)), share=share)
    spec = heatmap(
        weights,
        list(rows),
        list(cols),
        title,
        row_title=titles[0],
        col_title=titles[1],
        domain=domain,
        cell_size=cell,
        annotate=None if cell >= NUMBERED_CELL_PX else False,
    )
    spec["usermeta"] = {"scale": presenter.scale()}  # sized for its column and presenter mode already
    downloads.chart(spec, key=f"heads.chart.attention.{key}")
