"""Inductive bias: shift the picture by k pixels and see what moves with it inside a ViT and what does not.

Read widgets -> ask the views (tformer_views.inductive_bias) for the two traces (cached per picture and
shift) -> draw the numbers and the pictures.
"""

from __future__ import annotations

import contextlib

import streamlit as st

from tformer_app import downloads, presenter, results
from tformer_app import vision_inputs as vi
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_views.charts.spec import line_chart
from tformer_views.pictures import overlay, to_png

INTRO = (
    "A CNN's convolutions slide over the picture: move the picture and their outputs move with it "
    "(translation equivariance, an inductive bias built in). A ViT's patch embedding is a convolution too, "
    "with a stride of one patch; but its position embeddings are learned and stay put. Shift the picture and "
    "see which numbers follow it and which change."
)


def main() -> None:
    run_page("Inductive bias: shifting the picture", INTRO, "shift", page)


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model and picture")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = vi.choose_vit(url)
        picked = None if model is None else vi.choose_image(url, model)
    if model is None or picked is None:
        return
    name, data = picked
    presenter.idea(
        "Shift the picture by whole patches and the patch embeddings only move; by part of a patch and they change."
    )
    P = model.config.patch_size
    k = st.slider(
        f"Shift to the right, in pixels (one patch is {P} px; the picture wraps around)",
        0,
        2 * P,
        key=url.key("k", P, lo=0, hi=2 * P),
    )
    study = run_safely(lambda: results.result(results.shift(source, data, name, int(k))), "Picture")
    if study is None:
        return
    show_embeddings(study)
    show_attention(study)
    show_predictions(study)
    show_sweep(source, data, name, P)


def show_embeddings(study) -> None:
    st.subheader("Patch embeddings")
    error, size = study.embedding_error, study.embedding_size
    if study.moved_by_whole_patches:
        st.success(
            f"Shifted by {study.k} px = {study.k // study.patch_size} whole patches: every patch embedding is "
            f"the same vector as before, {study.k // study.patch_size} column(s) further. Largest difference "
            f"{error:.2e} (the embeddings themselves reach {size:.2f}): rounding only."
        )
    else:
        st.warning(
            f"Shifted by {study.k} px, not a multiple of {study.patch_size}: the patches cut the picture "
            f"elsewhere, and the embeddings differ by up to {error:.3f} (they reach {size:.2f})."
        )
    left, right = st.columns(2)
    left.image(to_png(study.image), caption="as the model sees it", width=280)
    right.image(to_png(study.shifted_image), caption=f"rolled {study.k} px to the right", width=280)


def show_attention(study) -> None:
    st.subheader("The class token's attention, last layer (mean of the heads)")
    left, right = st.columns(2)
    left.image(to_png(overlay(study.image, study.class_token_map("original"))), width=280, caption="original")
    right.image(to_png(overlay(study.shifted_image, study.class_token_map("shifted"))), width=280, caption="shifted")
    st.caption(
        f"Total variation between the shifted picture's attention and the original's moved along with the "
        f"patches: **{study.attention_change():.3f}** (0 would mean the attention simply followed the "
        "content). The positions are learned: the content now sits at other position embeddings."
    )


def show_predictions(study) -> None:
    st.subheader("Class probabilities")
    downloads.table(study.predictions(5).set_index("class"), digits=4, key="shift.predictions")


def show_sweep(source: str, data: bytes, name: str, P: int) -> None:
    st.subheader(f"Every shift from 0 to {2 * P} px")
    frame = run_safely(
        lambda: results.result(results.shift_sweep(source, data, name, tuple(range(2 * P + 1)))), "Picture"
    )
    if frame is None:
        return
    label = frame.attrs["label"]
    left, right = st.columns(2)
    for column, value, title in (
        (left, "embedding error", "largest patch-embedding difference (0: the same vectors, moved)"),
        (right, f"p({label})", f"probability of {label}"),
    ):
        long = frame.melt(id_vars=["shift (px)"], value_vars=[value], var_name="series")
        with column:
            spec = line_chart(long, "shift (px)", "value", "series", title, "shift (px)", "", width=420)
            downloads.chart(spec, f"shift.sweep.{value}", "shift_sweep")
    downloads.table(frame.set_index("shift (px)"), digits=4, key="shift.sweep_table")
    st.caption(
        f"The error falls to rounding at 0, {P} and {2 * P} px (whole patches); the probability of "
        f"**{escape(label)}** moves with every shift, also at whole patches."
    )


main()
