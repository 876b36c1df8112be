"""The attention views, drawn with Streamlit: shared by the Text attention and Encoder-decoder pages.

    c = attention_panel.controls(url, trace, stack="encoder", prefix="enc_")   # layer, head, views, query...
    attention_panel.draw(shown, url, c)                                          # the views chosen in c

`Shown` is the trace on screen with the request it was cached under (`results.result(key)`), so what the
views derive from it once (the overview picture, the distance grid) is cached with it. The numbers
come from tformer_views; this module only lays them out. `prefix` keeps the widgets (and URL
parameters) of two attention sections on one page apart; with prefix "" the names are the plain
ones ("layer", "head", ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from tformer_core.score_sources import Cell
from tformer_core.trace import ATTENTION_STACKS, Trace
from tformer_views import search
from tformer_views import text as tv
from tformer_views.charts.attention import distance_chart, head_view_chart
from tformer_views.charts.pickers import PICKER_PADDING, head_grid_chart, thumbnail_picker
from tformer_views.charts.projection import qk_figure, qk_space
from tformer_views.charts.spec import fitting, heatmap
from tformer_views.lessons.attention import tex
from tformer_views.text import peak_weights
from tformer_views.tokens import MAX_DETAIL_TOKENS, SPECIAL_TOKENS, display_tokens, token_window, visible_positions
from tformer_views.why import why_this_weight

from . import derived_views, downloads, presenter, results, score_sources_panel
from .events import clicked_cell
from .markdown import escape
from .page import scroll_to
from .url import UrlState
from .widgets import choose_token, following_choice

VIEWS = {
    "head": "Head view",
    "heatmap": "Heatmap",
    "search": "Which heads link two tokens",
    "overview": "All layers × heads",
    "qkv": "Q, K, V",
    "why": "Why this weight",
    "qk": "Query–key space",
    "distance": "Attention distance",
}
OPT_IN = frozenset({"qk"})  # views a page shows only when chosen (not among the defaults of `controls`)
SPECIAL_LABELS = frozenset(display_tokens(list(SPECIAL_TOKENS)))  # as the query box shows them
HEAD_VIEW_MAX_PX = 900  # the head view's widest (a line from a query to a key stays easy to follow)
# The link's settings each view draws (a slide saved with every view keeps them while another view is shown).
VIEW_SETTINGS = {
    "head": ("focus",),
    "heatmap": ("matrix",),
    "search": ("pair_key",),
    "why": ("key",),
    "qk": ("qk_dims", "qk_align"),
}
MATRICES = {"weights": "weights (softmax)", "scaled": "softmax input QKᵀ/√d_k", "scores": "scores QKᵀ"}


@dataclass(frozen=True)
class Shown:
    """A trace on screen: `key` is the cache request whose result holds it; `rerun`: how to run its input again
    (the sources of "Why this weight"), derived from a text request when None."""

    key: results.Request[Any]
    trace: Trace
    rerun: score_sources_panel.Rerun | None = None

    def input_again(self) -> score_sources_panel.Rerun | None:
        if self.rerun is not None or self.key.kind != "text":
            return self.rerun
        text, pair = self.key.args
        return score_sources_panel.Rerun(self.key.source, (text,), (("pair", pair),) if pair else ())


@dataclass(frozen=True)
class Controls:
    """What the view controls chose for one attention stack."""

    stack: str
    prefix: str
    layer: int
    head: int
    hide: bool
    views: tuple[str, ...]
    query: int
    shown: np.ndarray  # positions shown (special tokens hidden or not)
    window: slice  # of `shown`, for the detail views of long inputs


def controls(
    url: UrlState,
    trace: Trace,
    stack: str | None = None,
    prefix: str = "",
    default_query: int | None = None,
    default_head: tuple[int, int] | None = None,
    views: Sequence[str] = tuple(VIEWS),
    default_views: Sequence[str] | None = None,
    label: str = "",
    keys: bool = True,
    where: Any = None,
) -> Controls:
    """Layer, head, hide-special-tokens, the views to show, the query token and (long inputs) the window.

    label ("encoder ", ...) starts the layer and head selectors' names. keys: arrow and page keys step
    through the heads and layers (one section of a page may have them). default_head: (layer, head) chosen
    when the link names none (else the first). where: a container for the layer,
    head and query boxes (presenter mode's closed settings, `presenter.settings_box`); the keys and the
    views stay on the page.
    """
    stack = stack or trace.main_stack
    L, H = trace.layers_in(stack), trace.n_heads
    q_tokens, _ = trace.tokens_for(stack)
    box = st if where is None else where
    first_layer, first_head = default_head or (0, 0)
    c1, c2, c_query, c3 = box.columns([1, 1, 2, 1.6], vertical_alignment="bottom")
    layer = c1.selectbox(
        f"{label}layer".capitalize(), list(range(L)), key=url.key(f"{prefix}layer", first_layer, choices=range(L))
    )
    head = c2.selectbox(
        f"{label}head".capitalize(), list(range(H)), key=url.key(f"{prefix}head", first_head, choices=range(H))
    )
    hide = c3.checkbox(
        "Hide [CLS], [SEP], BOS",
        key=url.key(f"{prefix}hide", False),
        help="Drops their rows and columns and renormalises each row over the remaining tokens; "
        "the share of attention they received is reported.",
    )
    url.key(f"{prefix}heads", list(range(H)), choices=list(range(H)))
    # The keys' buttons and the views: one row on a projector in presenter mode (the page's whole width).
    row = presenter.presenting() and where is not None
    with st.container(horizontal=True, vertical_alignment="center") if row else contextlib.nullcontext():
        if keys:
            head_keys(url, prefix, L, H)
        chosen = _views(url, prefix, views, default_views)
    shown = visible_positions(q_tokens, hide)
    query = _query(url, prefix, shown, display_tokens(q_tokens), default_query, c_query)
    window = _window(url, prefix, len(shown), box, folded=where is not None)
    return Controls(stack, prefix, int(layer), int(head), bool(hide), chosen, int(query), shown, window)


def _window(url: UrlState, prefix: str, n: int, box: Any, folded: bool) -> slice:
    """The tokens the detail views show of n: all, or (a long input) a window whose start is chosen in `box`;
    folded (presenter mode's settings): the views say what they leave out, as the box is out of sight."""
    if n <= MAX_DETAIL_TOKENS:
        return slice(None)
    last_start = n - MAX_DETAIL_TOKENS
    start = box.number_input(
        f"Long input: the head view, heatmap and Q/K/V show {MAX_DETAIL_TOKENS} tokens from this one",
        min_value=0,
        max_value=last_start,
        step=8,
        key=url.key(f"{prefix}start", 0, choices=range(last_start + 1)),
    )
    window = token_window(n, int(start))
    if folded:
        first, last = window.indices(n)[:2]
        st.caption(
            f"Tokens {first + 1}–{last} of {n} shown in the head view, heatmap and Q, K, V: the rest are cut from "
            "these views (Settings: where the window starts)."
        )
    return window


def head_keys(url: UrlState, prefix: str, n_layers: int, n_heads: int) -> None:
    """← → (and a clicker's Page Up / Page Down) step through every head, layer after layer; ↑ ↓ the layers."""
    head, layer = f"{prefix}head", f"{prefix}layer"
    previous = presenter.cycle(url, head, n_heads, -1, carry=(layer, n_layers))
    following = presenter.cycle(url, head, n_heads, 1, carry=(layer, n_layers))
    presenter.stepper(
        url,
        f"{prefix}keys",
        [
            presenter.Step("head", "Left", previous, "The previous head (after head 0: the last of the layer before)"),
            presenter.Step("head", "Right", following, "The next head (after the last: head 0 of the next layer)"),
            presenter.Step("layer", "Up", presenter.cycle(url, layer, n_layers, -1), "The layer before"),
            presenter.Step("layer", "Down", presenter.cycle(url, layer, n_layers, 1), "The next layer"),
        ],
        paging=(previous, following),
        where=presenter.keys_place(),
    )


def _views(url: UrlState, prefix: str, views: Sequence[str], default_views: Sequence[str] | None) -> tuple[str, ...]:
    """The views to draw: several, chosen as pills (in the link as "views"); in presenter mode one at a time,
    full width (in the link as "view")."""
    defaults = list(default_views if default_views is not None else [v for v in views if v not in OPT_IN])
    views_key = url.key(f"{prefix}views", defaults, choices=list(views))
    if presenter.presenting():
        view_key = url.key(f"{prefix}view", defaults[0], choices=list(views))
        one = st.pills(
            "View",
            list(views),
            key=view_key,
            format_func=lambda view: VIEWS.get(view, view),
            selection_mode="single",
            label_visibility="collapsed",
        )
        return (one or defaults[0],)
    url.undrawn(f"{prefix}view")  # presenter mode's one view, for when it is on again
    chosen = st.pills(
        "Views",
        list(views),
        key=views_key,
        format_func=lambda view: VIEWS.get(view, view),
        selection_mode="multi",
        label_visibility="collapsed",
    )
    return tuple(chosen or ())


def _query(
    url: UrlState, prefix: str, shown: np.ndarray, labels: list[str], default: int | None, where: Any = st
) -> int:
    """The query token: `default` ("it" on the Text attention page) when there is one, else the first token
    that is not a special one; a new input keeps the same word when it has it."""
    options = [int(i) for i in shown]
    content = [i for i in options if labels[i] not in SPECIAL_LABELS] or options
    fallback = int(default) if default is not None and default in options else content[0]
    return following_choice(
        url, f"{prefix}query", "Query token (the row being explained)", options, labels, fallback, where=where
    )


def _key(url: UrlState, c: Controls, name: str) -> str:
    """A widget / chart key unique to this section of the page."""
    return f"{url.page}.{c.prefix}{name}"


def has_qkv(trace: Trace, stack: str) -> bool:
    """True when the trace holds the queries and keys of `stack` (not so for a model transformers runs)."""
    return f"{ATTENTION_STACKS[stack].format(layer=0)}.q" in trace


def qkv_absent(trace: Trace, stack: str, view: str) -> bool:
    """When the trace has no Q, K, V (a model run by transformers' own code): says so where `view` would be
    and returns True; else False."""
    if has_qkv(trace, stack):
        return False
    reason = trace.meta.absent or "This model's trace holds the attention weights only, not Q, K and V."
    st.info(f"**{escape(view)}** cannot be shown for this model. {escape(reason)}")
    return True


def kv_sharing(trace: Trace, head: int) -> str | None:
    """With grouped-query attention, which key/value head query head `head` reads and who shares it; else None."""
    if trace.n_kv_heads == trace.n_heads:
        return None
    g = trace.kv_head(head)
    group = trace.query_heads(g)
    others = ", ".join(str(h) for h in group)
    return (
        f"Grouped-query attention ({trace.n_heads} query heads, {trace.n_kv_heads} key/value heads): query head "
        f"{head} reads key/value head {g}, shared by query heads {others}. They all score against the same K "
        "and mix the same V; only their queries differ."
    )


def draw(shown: Shown, url: UrlState, c: Controls, label: str = "") -> None:
    """Every view chosen in `c`, in a fixed order. `label` ("encoder ", ...) goes into the titles."""
    trace = shown.trace
    url.undrawn(*(c.prefix + name for view, names in VIEW_SETTINGS.items() if view not in c.views for name in names))
    if "head" in c.views:
        draw_head_view(trace, url, c, label)
    if "heatmap" in c.views:
        draw_heatmap(trace, url, c, label)
    if "search" in c.views:
        draw_search(shown, url, c, label)
    if "overview" in c.views:
        draw_overview(shown, url, c, label)
    if "qkv" in c.views:
        draw_qkv(trace, url, c, label)
    if "why" in c.views:
        draw_why(trace, url, c, label, shown.input_again(), cached=shown.key)
    if "qk" in c.views:
        draw_qk(trace, url, c, label)
    if "distance" in c.views:
        draw_distance(shown, url, c, label)


def draw_head_view(trace: Trace, url: UrlState, c: Controls, label: str = "") -> None:
    """Every head's lines from the queries to the keys. In presenter mode the chosen head (stepped with the
    keys) is drawn in colour over the others, grey and faint; else the heads chosen in a box, one colour each."""
    H = trace.n_heads
    presenting = presenter.presenting()
    where = f"{label}layer {c.layer}, head {c.head}" if presenting else f"{label}layer {c.layer}"
    st.subheader(f"Head view · {where}", anchor=f"{c.prefix}head-view")
    focus_key = url.key(f"{c.prefix}focus", False)
    if presenting:  # every head, the chosen one over the others; no boxes (the keys step the head)
        heads, focus = list(range(H)), bool(st.session_state[focus_key])
    else:
        left, right = st.columns([1, 2], vertical_alignment="center")
        heads_key = _key(url, c, "heads")
        chosen = st.session_state.get(heads_key, list(range(H)))
        with left.popover(f"Heads shown: {'all ' + str(H) if len(chosen) == H else ', '.join(map(str, chosen))}"):
            heads = st.multiselect("Heads shown (one colour each)", list(range(H)), key=heads_key)
        focus = right.checkbox("Only the query token's lines", key=focus_key)
    view = tv.head_view(
        trace, c.layer, heads, c.stack, hide_special=c.hide, window=c.window, focus=c.query if focus else None
    )
    scale = presenter.scale()
    downloads.chart(
        head_view_chart(
            view,
            H,
            # In presenter mode the heading above says it, and the view keeps the first screen's room.
            title="" if presenting else f"{label}{where}: queries (left) → keys (right)",
            row_px=15 if presenting else 18,
            scale=scale,
            highlight=c.head if presenting else None,
            width=min(presenter.room(), round(HEAD_VIEW_MAX_PX * scale)),
        ),
        key=_key(url, c, "chart.head_view"),
        file_name=f"{c.prefix}head_view_L{c.layer}" + (f"_H{c.head}" if presenting else ""),
    )
    note = (
        f"Line opacity = weight; lines below {view.threshold:.3f} are not drawn. "
        "Hover a token on the left to see only its lines."
    )
    if c.hide:
        note += f" {view.hidden_share:.0%} of the attention of these heads went to the hidden tokens."
    st.caption(note)


def draw_heatmap(trace: Trace, url: UrlState, c: Controls, label: str = "") -> None:
    layer, head = c.layer, c.head
    st.subheader(f"Heatmap · {label}layer {layer}, head {head}", anchor=f"{c.prefix}heatmap")
    parts = list(MATRICES) if has_qkv(trace, c.stack) else ["weights"]  # scores need Q and K
    part = st.radio(
        "Matrix",
        parts,
        key=url.key(f"{c.prefix}matrix", "weights", choices=parts),
        format_func=MATRICES.get,
        horizontal=True,
    )
    if len(parts) == 1:
        st.caption("This model hands out its attention weights only: the scores before the softmax need Q and K.")
    if part == "weights":
        full = tv.head_matrix(trace, layer, head, c.stack, hide_special=c.hide)
    else:
        full = tv.score_matrix(trace, layer, head, part, c.stack, hide_special=c.hide)
    m = full.window(c.window, slice(None) if c.stack == "cross" else c.window)
    fixed = part == "weights" and len(m.keys) <= 16  # short inputs: 0..1, so heads compare at a glance
    q_title, k_title = ("target", "source") if c.stack == "cross" else ("query", "key")
    chart = heatmap(
        m.weights,
        m.query_labels,
        m.key_labels,
        masked=m.masked,
        title=f"{label}layer {layer}, head {head}: {MATRICES[part]}",
        domain=(0.0, 1.0) if fixed else None,
        row_title=q_title,
        col_title=k_title,
        clickable=True,
        cell_size=presenter.cell_size(max(len(m.queries), len(m.keys))),
    )
    chart["usermeta"] = {"scale": presenter.scale()}  # sized for the room and presenter mode already
    name = f"{c.prefix}attention_L{layer}_H{head}_{part}"
    pick_key = _key(url, c, "chart.heatmap")

    def pick() -> None:  # a cell: its query becomes the query, its key the searched pair's key
        cell = clicked_cell(st.session_state.get(pick_key), "pair", ("row", "col"))
        if cell is not None and cell[0] < len(m.queries) and cell[1] < len(m.keys):
            choose_token(url, f"{c.prefix}query", int(m.queries[cell[0]]))
            choose_token(url, f"{c.prefix}pair_key", int(m.keys[cell[1]]))
            choose_token(url, f"{c.prefix}key", int(m.keys[cell[1]]))  # the cell "Why this weight" explains

    downloads.chart(chart, key=pick_key, file_name=name, on_select=url.callback(pick), selection_mode="pair")
    st.caption(
        "Click a cell to make its row the query, search the heads that link its two tokens and explain its weight."
    )
    downloads.matrix_download(
        full.weights, full.query_labels, full.key_labels, f"{name}.csv", key=_key(url, c, "csv_matrix")
    )
    if full.allowed is not None and not full.allowed.all():
        st.caption("Grey cells are masked: their softmax input is −∞ (shown as -inf), so their weight is exactly 0.")
    if c.hide and part == "weights":
        st.caption(
            f"Rows renormalised over the shown tokens; {full.hidden_share.mean():.0%} of this head's "
            "attention went to the hidden special tokens."
        )


def draw_search(shown: Shown, url: UrlState, c: Controls, label: str = "") -> None:
    """Every layer x head's weight from the query to one key, as a clickable grid and a ranked list."""
    trace = shown.trace
    q_labels, k_labels = (display_tokens(t) for t in trace.tokens_for(c.stack))
    st.subheader(f"Which {label}heads link two tokens?")
    rows = derived_views.query_rows(shown.key, c.stack, c.query)  # [layers, heads, keys]
    default = search.default_key(trace.tokens_for(c.stack)[1], c.query, int(np.argmax(rows[c.layer, c.head])))
    left, right = st.columns([1, 1])
    with left:
        key = following_choice(
            url, f"{c.prefix}pair_key", "Key token", range(rows.shape[2]), k_labels, default, follow_default=True
        )
    grid = rows[..., key]
    pair = f"{escape(q_labels[c.query])} → {escape(k_labels[key])}"
    pick_key = _key(url, c, "chart.search")

    def pick() -> None:
        cell = clicked_cell(st.session_state.get(pick_key))
        if cell is not None:
            select_head(url, c.prefix, *cell)

    with left:
        downloads.chart(
            head_grid_chart(grid, (c.layer, c.head), title="click a head to select it", value_title="weight"),
            key=pick_key,
            file_name=f"{c.prefix}heads_{c.query}_{key}",
            on_select=url.callback(pick),
            selection_mode="cell",
        )
    with right:
        st.markdown(f"Strongest heads for {pair} (query token {c.query}, key token {key}):")
        for layer, head, weight in search.ranked_heads(grid, 5):
            st.button(
                f"layer {layer}, head {head}: {weight:.3f}",
                key=_key(url, c, f"rank.{layer}.{head}"),
                on_click=url.callback(select_head),
                args=(url, c.prefix, layer, head),
                type="primary" if (layer, head) == (c.layer, c.head) else "secondary",
            )


def scroll_to_views(url: UrlState, prefix: str) -> None:
    """After choosing a head far down the page, show its views: the head view, else the heatmap."""
    views = url.value(f"{prefix}views")
    anchor = "head-view" if "head" in views else "heatmap" if "heatmap" in views else None
    if anchor:
        scroll_to(f"{prefix}{anchor}")


def select_head(url: UrlState, prefix: str, layer: int, head: int) -> None:
    """Make (layer, head) the chosen one (a callback: it runs before the page is drawn again)."""
    url.set(f"{prefix}layer", int(layer))
    url.set(f"{prefix}head", int(head))


def thumbnail_width(png: bytes) -> int:
    """The overview picture's width in pixels, read from its PNG header (bytes 16-19)."""
    return int.from_bytes(png[16:20], "big")


def draw_overview(shown: Shown, url: UrlState, c: Controls, label: str = "") -> None:
    st.subheader(f"All {label}layers × heads")
    picture = derived_views.overview_picture(shown.key, c.stack, c.hide)
    n_q, n_k = picture.n_tokens
    b = picture.block
    detail = "one pixel per token pair" if b == 1 else f"each pixel averages {b}×{b} token pairs"
    caption = (
        f"Rows: layers, columns: heads; each thumbnail is a {n_q}×{n_k} attention matrix ({detail}), "
        "coloured from 0 (dark) to its own largest weight (yellow)."
    )
    boxes = {(l, h): picture.box(l, h) for l in range(picture.thumbs.shape[0]) for h in range(picture.thumbs.shape[1])}
    thumbs_key = _key(url, c, "chart.thumbnails")

    def pick_thumbnail() -> None:
        cell = clicked_cell(st.session_state.get(thumbs_key))
        if cell is not None:
            select_head(url, c.prefix, *cell)
            scroll_to_views(url, c.prefix)

    # As large as the main column allows (half as large again at most: the thumbnails are small pictures).
    picker_px = max(200, min(presenter.room() - 2 * PICKER_PADDING, round(1.5 * thumbnail_width(picture.png))))
    st.vega_lite_chart(
        thumbnail_picker(picture.png, boxes, width=picker_px),
        width="content",
        key=thumbs_key,
        on_select=url.callback(pick_thumbnail),
        selection_mode="cell",
    )
    st.caption(caption + " Click a thumbnail to select that head.")
    downloads.file_download("PNG", picture.png, f"{c.prefix}all_heads.png", "image/png", _key(url, c, "overview_png"))
    if c.stack == "cross":  # token distances mean nothing between two sentences: colour by the largest weight
        values = peak_weights(shown.trace, "cross")
        title, value_title = "Click a head to select it (colour: mean of each row's largest weight)", "peak weight"
    else:
        values = derived_views.token_distances(shown.key, c.stack, c.hide)
        title, value_title = "Click a head to select it (colour: mean distance, tokens)", "distance"
    pick_key = _key(url, c, "cell_pick")

    def pick() -> None:
        cell = clicked_cell(st.session_state.get(pick_key))
        if cell is not None and cell[0] < values.shape[0] and cell[1] < values.shape[1]:
            select_head(url, c.prefix, *cell)

    downloads.chart(
        head_grid_chart(values, (c.layer, c.head), title=title, value_title=value_title),
        key=pick_key,
        file_name=f"{c.prefix}heads_grid",
        on_select=url.callback(pick),
        selection_mode="cell",
    )


def draw_qkv(trace: Trace, url: UrlState, c: Controls, label: str = "") -> None:
    layer, head = c.layer, c.head
    st.subheader(f"Q, K and V · {label}layer {layer}, head {head}")
    if qkv_absent(trace, c.stack, VIEWS["qkv"]):
        return
    sharing = kv_sharing(trace, head)
    if sharing:
        st.info(f"{sharing} K and V below are key/value head {trace.kv_head(head)}'s.")
    if c.stack == "cross":
        st.caption(
            "Q = (decoder state) W^Q: one row per target position. K = (encoder output) W^K and "
            "V = (encoder output) W^V: one row per source token. Every decoder layer reads the same "
            "encoder output, through its own W^K, W^V."
        )
    else:
        st.caption(
            "Rows are tokens, columns the d_head dimensions of this head: Q = X W^Q, K = X W^K, V = X W^V "
            "(X: the layer's input; a slice of the full projections)."
        )
    full = tv.qkv(trace, layer, head, c.stack)
    positions = None if c.stack == "cross" else c.shown[c.window]
    shown_rows = tv.qkv(trace, layer, head, c.stack, positions=positions)
    for column, (name, (matrix, rows, cols)) in zip(st.columns(3), shown_rows.items()):
        with column:
            side = "target" if c.stack == "cross" and name == "Q" else "source" if c.stack == "cross" else "token"
            whose = f"head {head}" if name == "Q" or not sharing else f"key/value head {trace.kv_head(head)}"
            chart = heatmap(
                matrix,
                rows,
                cols,
                title=f"{name} (layer {layer}, {whose})",
                row_title=side,
                col_title="dimension",
                diverging=True,
                annotate=False,
            )
            # Its third of the page, whatever the page's width: the dimensions' columns narrow to fit (at most
            # 12 px each).
            chart = fitting(chart, 12 * max(matrix.shape[1], 1))
            chart["title"] = {"text": chart["title"], "subtitle": f"{full[name][0].shape[0]} × {matrix.shape[1]}"}
            which = f"KV{trace.kv_head(head)}" if name != "Q" and sharing else f"H{head}"
            file_name = f"{c.prefix}{name}_L{layer}_{which}"
            downloads.chart(chart, key=_key(url, c, f"chart.{name}"), file_name=file_name)
            downloads.matrix_download(
                *full[name], f"{file_name}.csv", label=f"{name} as CSV", key=_key(url, c, f"csv_{name}")
            )


def _why_formulas(why, query: int, key: int) -> None:
    if why.allowed is not None and not why.allowed[key]:
        st.latex(rf"s_{{{query},{key}}} = -\infty \ (\text{{masked}})\quad\Rightarrow\quad w_{{{query},{key}}} = 0")
        return
    bias = rf" + b_{{{query},{key}}}" if why.bias is not None else ""
    bias_num = f" + ({why.bias[key]:.4f})" if why.bias is not None else ""
    if why.scale != 1.0:
        scaling = rf"\frac{{q_{{{query}}}\cdot k_{{{key}}}}}{{\sqrt{{d_k}}}}"
        scaled = rf"{why.dots[key]:.4f} \times {why.scale:.4f}"
    else:  # T5 does not scale
        scaling, scaled = rf"q_{{{query}}}\cdot k_{{{key}}}", f"{why.dots[key]:.4f}"
    st.latex(rf"s_{{{query},{key}}} = {scaling}{bias} = {scaled}{bias_num} = {why.logits[key]:.4f}")
    st.latex(
        rf"w_{{{query},{key}}} = \frac{{e^{{s_{{{query},{key}}}}}}}{{\sum_j e^{{s_{{{query},j}}}}}}"
        rf" = \frac{{{tex(why.exps[key])}}}{{{tex(why.exps.sum())}}} = {why.weights[key]:.4f}"
    )


def draw_why(
    trace: Trace,
    url: UrlState,
    c: Controls,
    label: str = "",
    rerun: score_sources_panel.Rerun | None = None,
    sources_opt_in: bool = False,
    cached: results.Request[Any] | None = None,
) -> None:
    """The query's row step by step; with `rerun` (the input again), the cell's sources (toggled: sources_opt_in)."""
    layer, head, query = c.layer, c.head, c.query
    st.subheader(f"Why this weight · {label}layer {layer}, head {head}, query {query}")
    if qkv_absent(trace, c.stack, VIEWS["why"]):
        return
    if sharing := kv_sharing(trace, head):
        st.info(f"{sharing} The keys k_j and values v_j below are key/value head {trace.kv_head(head)}'s.")
    why = why_this_weight(trace, layer, head, query, c.stack)
    n_k = len(why.key_labels)
    key = following_choice(  # the strongest key until the user picks one: it changes with the head
        url,
        f"{c.prefix}key",
        "Key token (the column)",
        range(n_k),
        list(why.key_labels),
        int(np.argmax(why.weights)),
        follow_default=True,
    )
    _why_formulas(why, query, key)
    if rerun is not None:
        score_sources_panel.draw(url, rerun, Cell(c.stack, layer, head, query, key), c.prefix, sources_opt_in, cached)
    st.caption(
        f"Query {escape(why.query_label)} against every key: the softmax runs over all "
        f"{n_k} keys (special tokens included, whatever the views hide). Exponentials are shifted by the "
        "largest input, which cancels in the ratio."
    )
    table = why.table()
    table.insert(0, "chosen", np.where(np.arange(n_k) == key, "▶", ""))  # the key whose weight is spelled out
    downloads.table(table)
    numeric = table.drop(columns=[col for col in ("chosen", "key", "allowed") if col in table])
    downloads.matrix_download(
        numeric.to_numpy(dtype=float),
        list(why.key_labels),
        list(numeric.columns),
        f"{c.prefix}why_L{layer}_H{head}_q{query}.csv",
        key=_key(url, c, "csv_why"),
    )
    left, right = st.columns(2)
    with left:
        st.caption(f"q·k = Σ_d q_d k_d for key {key}: {why.dots[key]:.4f}")
        downloads.table(why.products(key))
    err_w, err_z = why.max_errors()
    with right:
        st.caption(
            f"Head output z = Σ_j w_j v_j (recomputed) beside the model's own z: "
            f"max difference {err_z:.1e} (weights: {err_w:.1e})."
        )
        z = pd.DataFrame(
            {"z = Σ w_j v_j": why.z, "model's z": why.stored_z}, index=[f"d{i + 1}" for i in range(len(why.z))]
        )
        downloads.table(z)


def draw_qk(trace: Trace, url: UrlState, c: Controls, label: str = "") -> None:
    """Every query and key of one head in one PCA projection (2-D or 3-D), lines from the query token to the keys
    it weighs most (AttentionViz). Cross-attention: the decoder's queries and the encoder's keys."""
    layer, head = c.layer, c.head
    st.subheader(f"Query–key space · {label}layer {layer}, head {head}", anchor=f"{c.prefix}qk")
    if qkv_absent(trace, c.stack, VIEWS["qk"]):
        return
    left, right = st.columns([1, 3])
    dims = left.radio(
        "Axes",
        [2, 3],
        key=url.key(f"{c.prefix}qk_dims", 2, choices=[2, 3]),
        format_func=lambda d: f"{d}-D",
        horizontal=True,
    )
    align = right.checkbox(
        "Move the keys onto the queries' centre (no weight changes)",
        key=url.key(f"{c.prefix}qk_align", True),
        help="AttentionViz's translation: one vector c is added to every key so that the keys' mean is the "
        "queries' mean. It adds q·c to every score of query q's row, which the softmax cancels; without it "
        "queries and keys often sit in two clusters apart and the picture shows that gap.",
    )
    # Queries: the positions shown (cross-attention: the decoder's); keys: every key token, the special ones
    # left out when hidden (self-attention: the same tokens as the queries; cross-attention: the source).
    keys = visible_positions(trace.tokens_for(c.stack)[1], c.hide)
    space = qk_space(trace, layer, head, c.query, c.stack, int(dims), c.shown, keys, align_means=bool(align))
    scale = presenter.scale()
    q_name, k_name = ("target positions", "source tokens") if c.stack == "cross" else ("queries", "keys")
    figure = qk_figure(
        space,
        title=f"{label}layer {layer}, head {head}: {q_name} (circles) and {k_name} (diamonds)",
        height=int(560 * scale),
        font_scale=scale,
    )
    st.plotly_chart(figure, width="stretch", key=_key(url, c, "chart.qk"), config={"displaylogo": False})
    st.caption(_qk_caption(trace, space, c, head, bool(align)))
    p = space.projection
    rows = [f"q{int(i)} {t}" for i, t in zip(space.query_positions, space.query_labels)]
    rows += [f"k{int(i)} {t}" for i, t in zip(space.key_positions, space.key_labels)]
    downloads.matrix_download(
        np.concatenate([p.queries, p.keys]),
        rows,
        [f"PC{i + 1}" for i in range(p.n_components)],
        f"{c.prefix}qk_space_L{layer}_H{head}.csv",
        key=_key(url, c, "csv_qk"),
    )


def _qk_caption(trace: Trace, space, c: Controls, head: int, align: bool) -> str:
    """What the query–key picture shows: the PCA, the variance kept, the scaling, the strongest keys."""
    p = space.projection
    dims = p.n_components
    d_head = p.components.shape[1]
    shares = ", ".join(f"{share:.0%}" for share in p.explained)
    strongest = ", ".join(
        f"{escape(space.key_labels[int(np.flatnonzero(space.key_positions == k)[0])])} ({w:.2f})"
        for k, w in zip(space.top_keys, space.top_weights)
    )
    n_q, n_k = len(space.query_positions), len(space.key_positions)
    counted = (
        f"{n_q} queries (target positions) and {n_k} keys (source tokens)"
        if c.stack == "cross"
        else f"{n_q} queries and {n_k} keys"
    )
    if p.scale == 1.0:
        scaling = "This model does not scale its scores, so a query·key dot product here is the softmax input."
    elif np.isclose(p.scale, d_head**-0.5):
        scaling = (
            f"Queries and keys are multiplied by d_k^(−1/4) = {p.scale**0.5:.3f} first, so a query·key dot product "
            "here is the softmax input q·k/√d_k."
        )
    else:
        scaling = (
            f"Queries and keys are multiplied by {p.scale**0.5:.3f}, the square root of the model's score scale "
            f"{p.scale:.4g}, so a query·key dot product here is the softmax input."
        )
    caption = (
        f"PCA: the {counted} of this head are {d_head}-dimensional; these {int(dims)} axes are the directions in "
        f"which they vary most together, and keep {p.explained.sum():.0%} of that variance ({shares}). {scaling} "
        "Nearness is a guide, not the rule: a weight grows with the dot product (lengths and angle), and the axes "
        "not drawn hold the rest of the variance."
    )
    if space.query is not None and strongest:
        query_label = escape(space.query_labels[int(np.flatnonzero(space.query_positions == space.query)[0])])
        caption += (
            f" Lines from query “{query_label}” to the keys it weighs most: {strongest} (width, opacity: weight)."
        )
    if align:
        caption += " The keys are moved so their centre is the queries' (this changes no weight)."
    if c.hide:
        caption += " Hidden special tokens are left out of the PCA."
    sharing = kv_sharing(trace, head)
    if sharing:
        caption += f" {sharing}"
    return caption


def draw_distance(shown: Shown, url: UrlState, c: Controls, label: str = "") -> None:
    L, H = shown.trace.layers_in(c.stack), shown.trace.n_heads
    st.subheader(f"How far each {label}head looks")
    distances = derived_views.token_distances(shown.key, c.stack, c.hide)
    baseline = derived_views.uniform_token_distance(shown.key, c.stack, c.hide)
    downloads.chart(
        distance_chart(distances, baseline, H, (c.layer, c.head), title=f"mean attention distance per {label}head"),
        key=_key(url, c, "chart.distance"),
        file_name=f"{c.prefix}attention_distance",
    )
    st.caption(
        "Distance of a head = Σ_j w_ij·|i − j| averaged over query tokens i, in tokens. The dashed line is "
        "uniform attention over the tokens each query may see. Heads far below it look at their neighbours; "
        "heads above it look far away (often at [CLS] / [SEP])."
    )
    downloads.matrix_download(
        distances,
        [f"layer {i}" for i in range(L)],
        [f"head {h}" for h in range(H)],
        f"{c.prefix}attention_distance.csv",
        key=_key(url, c, "csv_distance"),
    )
    st.markdown(
        "Averaged over many sentences, or in pixels for Vision Transformers: [Mean attention distance](./distance)"
    )
