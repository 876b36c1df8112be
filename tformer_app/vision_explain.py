"""The Vision page's views beyond one head's attention: why one weight (its score traced to its sources), attention
rollout, raw attention / rollout / relevancy side by side for a class, and the ViT paper's Fig. 7 (the
patch-embedding filters, the position embeddings' similarities, the mean attention distance). Streamlit drawing
only; the numbers come from tformer_views.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from tformer_core.score_sources import Cell
from tformer_views import distance
from tformer_views import vision as vv
from tformer_views.charts.attention import distance_chart
from tformer_views.pictures import overlay, to_jpeg

from . import derived_views, downloads, results, score_sources_panel
from .markdown import escape
from .page import run_safely
from .url import UrlState
from .widgets import following_choice

WHY = "Why this weight: its score traced to its sources"


@dataclass(frozen=True)
class AttentionChoice:
    """What the attention section's widgets chose."""

    layer: int
    head: int | None  # None: the mean of the heads
    patch: int | None  # None: the class token is the query
    alpha: float
    smooth: bool


def show_why(
    url: UrlState, key: results.Request[vv.VisionResult], result: vv.VisionResult, choice: AttentionChoice
) -> None:
    """Folded (its content runs only while open): for the chosen layer, head and query, a key (the strongest
    until one is picked), its weight, and the sources of its score, split from the page's cached trace (a key,
    layer or head changed runs no pass); "remove this source" runs the same picture again (result.pixels)."""
    box = st.expander(WHY, key=f"{url.page}.why_open", on_change="rerun")
    if not box.open:
        return
    with box:
        trace = result.trace
        head = choice.head
        if head is None:  # the page shows the mean of the heads, which is no softmax and has no score to split
            heads = list(range(trace.n_heads))
            head = int(
                st.selectbox(
                    "Head (the mean of the heads above has no single score to split)",
                    heads,
                    key=url.key("why_head", 0, choices=heads),
                )
            )
        query = vv.query_token(trace, choice.patch)
        weights = vv.key_weights(trace, choice.layer, head, choice.patch)
        labels = list(trace.tokens)  # "[CLS]", DeiT's "[DIST]", then the patches "r0c0", "r0c1", ...
        picked = following_choice(
            url,
            "why_key",
            "Key (the column): a patch or a prefix token",
            range(len(labels)),
            labels,
            int(np.argmax(weights)),
            follow_default=True,  # the strongest key until the user picks one: it changes with the head and query
        )
        st.markdown(
            f"Layer {choice.layer}, head {head}: **{escape(labels[query])}** gives "
            f"**{escape(labels[picked])}** a weight of **{float(weights[picked]):.4f}**, the softmax of its score "
            f"over all {len(labels)} keys (largest {float(weights.max()):.4f})."
        )
        cell = Cell(trace.main_stack, choice.layer, head, query, picked)
        rerun = score_sources_panel.Rerun(key.source, (result.pixels,))
        score_sources_panel.draw(url, rerun, cell, "why_", cached=key)


def show_rollout(
    url: UrlState, key: results.Request[vv.VisionResult], result: vv.VisionResult, choice: AttentionChoice
) -> np.ndarray | None:
    st.subheader("Attention rollout")
    c1, c2 = st.columns(2)
    fusion = c1.radio(
        "Head fusion", list(vv.FUSIONS), horizontal=True, key=url.key("fusion", "mean", choices=list(vv.FUSIONS))
    )
    discard = c2.slider(
        "Discard ratio",
        0.0,
        0.99,
        step=0.01,
        key=url.key("discard", 0.9, cast=float, lo=0.0, hi=0.99),
        help="The lowest share of each layer's fused weights set to 0 before rolling out",
    )
    rolled = run_safely(lambda: derived_views.rollout(key, fusion, float(discard)), "Rollout")
    if rolled is not None:
        # At its own size: a width would make Streamlit decode, resize and encode it again on every rerun.
        st.image(to_jpeg(overlay(result.image, rolled, alpha=choice.alpha, smooth=choice.smooth)))
        st.caption(
            "Rollout (Abnar & Zuidema, 2020) follows attention through all the layers: each layer's heads are fused, "
            "the weakest weights dropped, the residual connection added as (A + I) / 2, and the layers multiplied. "
            "The picture is the class token's row of the product over the patches."
        )
    return rolled


def show_class_explanations(
    url: UrlState,
    key: results.Request[vv.VisionResult],
    result: vv.VisionResult,
    choice: AttentionChoice,
    rolled: np.ndarray,
) -> None:
    """Raw attention, rollout and relevancy side by side, for one of the top-5 classes."""
    st.subheader("Which patches explain a class? Attention, rollout and relevancy")
    ids, _ = result.trace.ranked(5)
    labels = [label for label, _ in result.trace.predictions(5)]
    rank = st.selectbox(
        "Class to explain (the model's top 5)",
        list(range(len(ids))),
        format_func=lambda i: f"{i + 1}. {labels[i]}",
        key=url.key("explain", 0, choices=list(range(len(ids)))),
    )
    data, name = key.args
    relevance = run_safely(
        lambda: results.result(results.relevancy(key.source, data, name, int(ids[rank]))), "Relevancy"
    )
    last = result.trace.n_layers - 1
    pictures = [
        (vv.attention_map(result.trace, last, None), f"Raw attention: the class token in layer {last}, mean of heads"),
        (rolled, "Rollout: attention through every layer"),
    ]
    if relevance is not None:
        pictures.append((relevance, f"Relevancy for {escape(labels[rank])} (attention × its gradient)"))
    for column, (values, caption) in zip(st.columns(3), pictures, strict=False):
        column.image(to_jpeg(overlay(result.image, values, alpha=choice.alpha, smooth=choice.smooth)), caption=caption)
    st.caption(
        "Raw attention and rollout are the same whichever class is asked about: they say where the model looked. "
        "Relevancy (Chefer, Gur & Wolf 2021) weights each layer's attention by its gradient for the chosen class's "
        "probability and keeps only what raises it: it changes with the class."
    )


def show_figure_7(source: str, key: results.Request[vv.VisionResult], result: vv.VisionResult) -> None:
    st.header("The model's own pictures (ViT paper, Fig. 7)")
    pcs, variance, positions = derived_views.figure_7(source)
    trace = result.trace
    left, middle, right = st.columns(3)
    with left:
        st.image(
            pcs,
            caption=f"Patch-embedding filters: the first {len(variance)} principal components "
            f"({sum(variance):.0%} of their variance), as RGB {result.patch_size} × "
            f"{result.patch_size} tiles.",
        )
    with middle:
        step = vv.similarity_map_step(result.grid_hw)
        each = "each patch" if step == 1 else f"every {step}th patch in each direction"
        st.image(
            positions,
            caption=f"Position embeddings: for {each} (at its place in the grid), the cosine "
            "similarity of its position embedding with every patch's (blue −1, red 1).",
        )
    with right:
        mad = derived_views.image_distances(key)  # every layer's weights: once per picture
        baseline = distance.uniform_image_distance(result.grid_hw, result.patch_size, trace.n_prefix_tokens)
        # 320 px at most, axes and legend included (the chart fits its width): narrower in a third of a projector.
        fig_7 = {"width": 320, "height": 240, "config": {"legend": {"orient": "bottom", "columns": 6}}}
        downloads.chart(
            distance_chart(mad, baseline, trace.n_heads, title="mean attention distance", unit="pixels") | fig_7,
            key="vit.chart.mad",
            file_name="mean_attention_distance",
        )
        st.caption(
            "Each dot is a head: how far, in pixels, it looks on average for this picture (not renormalised "
            "over the patches). The dashed line is uniform attention. The Mean attention distance page "
            "averages over many pictures."
        )
