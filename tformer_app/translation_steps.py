"""The Encoder-decoder page's decoding steps: the keys that step through them, and at each step the decoder's
masked self-attention, the cross-attention of its newest position for every layer and head, and its five most
likely next tokens. Streamlit drawing only: the numbers come from tformer_views.seq2seq (one translation, computed
once; a step only reads it).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tformer_views import seq2seq as sv
from tformer_views.charts.spec import cell_px, heatmap
from tformer_views.tokens import display_token, display_tokens

from . import downloads, play, presenter
from .markdown import escape
from .url import UrlState

FIRST_SCREEN_CHART_PX = 260  # presenter mode: the height a step's heatmap may take below the step line at 720 px


def step_keys(url: UrlState, n_steps: int, n_layers: int, n_heads: int) -> None:
    """← → (and a clicker's Page Up / Page Down) step through the decoding steps; ↑ ↓ the decoder's layers,
    Shift with ← → its heads."""
    before, after = (presenter.clamped(url, "step", by, 1, n_steps) for by in (-1, 1))
    presenter.stepper(
        url,
        "keys",
        [
            presenter.Step("step", "Left", before, "The step before"),
            presenter.Step("step", "Right", after, "The next step: the next token written"),
            presenter.Step("layer", "Up", presenter.cycle(url, "layer", n_layers, -1), "The decoder layer before"),
            presenter.Step("layer", "Down", presenter.cycle(url, "layer", n_layers, 1), "The next decoder layer"),
            presenter.Step("head", "Shift+Left", presenter.cycle(url, "head", n_heads, -1), "The head before"),
            presenter.Step("head", "Shift+Right", presenter.cycle(url, "head", n_heads, 1), "The next head"),
        ],
        paging=(before, after),
        where=presenter.keys_place(),
    )


def current_step(url: UrlState, translation: sv.Translation) -> int:
    """The step shown (1-based), clamped to this translation's steps."""
    key = url.key("step", 1, choices=range(1, translation.n_steps + 1))
    return int(st.session_state[key])


def step_through(url: UrlState, translation: sv.Translation, layer: int, head: int) -> None:
    if not presenter.presenting():  # presenter mode: the line below the title says what the steps are
        st.header("Step by step")
    n = translation.n_steps
    step_key = url.key("step", 1, choices=range(1, n + 1))
    play.play_through(
        url,
        step_key,
        n,
        lambda step: draw_step(translation, step - 1, layer, head),
        help="Decoding step t: the decoder has read t tokens and writes the next.",
    )


def draw_step(translation: sv.Translation, t: int, layer: int, head: int) -> None:
    step = sv.at_step(translation, t)
    read = " ".join(escape(x) for x in display_tokens(step.input_tokens))
    st.markdown(
        f"**Step {t + 1} of {translation.n_steps}.** The decoder has read: {read} → "
        f"{'it writes' if translation.mode == 'greedy' else 'the next target token is'} "
        f"**{escape(display_token(step.produced))}**"
    )
    left, right = st.columns([2, 3])
    # Cells sized for a 1280-px projector's columns; on a phone a wide chart scrolls in its own box.
    with left:
        m = step.self_attention(layer, head)
        downloads.chart(
            heatmap(
                m.weights,
                m.query_labels,
                m.key_labels,
                masked=m.masked,
                domain=(0.0, 1.0),
                title=f"masked self-attention, layer {layer}, head {head}",
                cell_size=cell_px(max(len(m.query_labels), len(m.key_labels)), 190),
            ),
            key="s2s.chart.step_self",
            file_name=f"step{t + 1}_self_L{layer}_H{head}",
        )
        st.caption(
            "Each decoder position sees itself and the positions before it: the grey cells above the "
            "diagonal are masked (−∞ before the softmax, so weight 0)."
        )
    with right:
        rows = step.cross_rows()  # [layers, heads, source]
        n_layers, n_heads, _ = rows.shape
        labels = [f"L{lay} H{h}" for lay in range(n_layers) for h in range(n_heads)]
        downloads.chart(
            heatmap(
                rows.reshape(n_layers * n_heads, -1),
                labels,
                display_tokens(translation.source_tokens),
                domain=(0.0, 1.0),
                row_title="layer, head",
                col_title="source",
                title=f"cross-attention of the newest position ({display_token(step.input_tokens[-1])})",
                cell_size=first_screen_cell(cell_px(len(translation.source_tokens), 320), len(labels)),
            ),
            key="s2s.chart.step_cross",
            file_name=f"step{t + 1}_cross",
        )
        st.caption(
            f"One row per decoder layer and head: where the query of the last position looks in the source "
            f"while it writes {escape(display_token(step.produced))}. Each row sums to 1."
        )
    top = pd.DataFrame([(display_token(tok), p) for tok, p in step.predictions(5)], columns=["token", "probability"])
    st.caption("The model's five most likely next tokens at this step:")
    st.dataframe(
        top,
        hide_index=True,
        column_config={
            "probability": st.column_config.ProgressColumn("probability", min_value=0.0, max_value=1.0, format="%.3f")
        },
    )


def first_screen_cell(cell: int, n_rows: int) -> int:
    """A heatmap's cell, small enough in presenter mode for its n_rows to fit a 720-px projector's first screen
    below the step line (presenter mode draws it 1.5 times larger)."""
    if not presenter.presenting():
        return cell
    return max(12, min(cell, int(FIRST_SCREEN_CHART_PX / presenter.scale() / max(n_rows, 1))))
