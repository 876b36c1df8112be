"""The Vision Transformer page's "Patch embedding by hand": the lecture's worked example, editable, then the
same computation on one patch of the user's picture with the loaded model's own kernels.

    from tformer_app import patch_embedding
    patch_embedding.draw(url, result, model)     # result: the page's VisionResult (None: the example only)

Widget values live in the page's link under names starting with "pe_"; the edited numbers do not (as on
"Attention, step by step", a new size starts the tables again from the lecture's numbers).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_core.models.base import TracedModel
from tformer_views.charts.spec import heatmap
from tformer_views.lessons import patch_embedding as lpe
from tformer_views.lessons import tables as lt
from tformer_views.lessons.attention import fmt
from tformer_views.pictures import to_png
from tformer_views.vision import VisionResult

from . import downloads
from .markdown import escape
from .page import run_safely
from .tables import Inputs, data_editor, matrix_panel
from .url import UrlState, int_key


def draw(url: UrlState, result: VisionResult | None, model: TracedModel | None) -> None:
    """The section: the worked example, then (with a picture and its ViT) one patch of the real model."""
    st.header("Patch embedding by hand")
    st.caption(
        "Each P × P patch becomes one vector: every output number e_k is a kernel laid over the patch, its "
        "products summed (plus a bias). Edit the lecture's example, then see the same on the model."
    )
    # Opt-in (and in the link as pe=1): its tables and heatmaps would otherwise be redrawn on every click on
    # the attention picture below, which a class does far more often (0.49 s -> 0.31 s per patch click).
    if not st.toggle("Work through the patch embedding", key=url.key("pe", False)):
        return
    worked_example(url)
    if result is not None and model is not None:
        real_model_patch(url, result, model)


# ---- the worked example --------------------------------------------------------------------------------
def example_settings(url: UrlState) -> tuple[int, int, int, int]:
    c = st.columns(4)
    h = c[0].number_input("Image height", 1, lpe.MAX_SIDE, key=int_key(url, "pe_h", 8, 1, lpe.MAX_SIDE))
    w = c[1].number_input("Image width", 1, lpe.MAX_SIDE, key=int_key(url, "pe_w", 8, 1, lpe.MAX_SIDE))
    p = c[2].number_input("Patch size P", 1, lpe.MAX_PATCH, key=int_key(url, "pe_p", 4, 1, lpe.MAX_PATCH))
    d = c[3].number_input(
        "Kernels D", 1, lpe.MAX_KERNELS, key=int_key(url, "pe_d", 2, 1, lpe.MAX_KERNELS), help="One per output number"
    )
    return int(h), int(w), int(p), int(d)


def edit_example(url: UrlState, h: int, w: int, p: int, d: int) -> Inputs:
    """The image and the kernels as editable tables, started from the lecture's numbers for this size."""
    digest = hashlib.sha1(repr((h, w, p, d)).encode()).hexdigest()[:10]
    out = Inputs()
    left, right = st.columns([1, 1])
    with left:
        st.markdown(f"**The image** ({h} × {w} pixels; rows and columns from 0)")
        image = pd.DataFrame(
            lpe.default_image(h, w), index=pd.Index(range(h), name="image"), columns=[str(c) for c in range(w)]
        )
        edited = data_editor(st, image, key=f"{url.page}.pe.image.{digest}")
        out.parse("image", lambda: lt.matrix_from_frame(edited, "The image"))
    kernels = lpe.default_kernels(d, p)
    with right:
        st.markdown(f"**The kernels** ({p} × {p} each; kernel k gives e_k)")
        columns = st.columns(min(d, 2))
        for k in range(d):
            with columns[k % len(columns)]:
                frame = pd.DataFrame(kernels[k], index=pd.Index(range(p), name=f"kernel {k + 1}"))
                frame.columns = [str(c) for c in range(p)]
                edited_k = data_editor(st, frame, key=f"{url.page}.pe.kernel{k}.{digest}")
                out.parse(f"kernel {k + 1}", functools.partial(lt.matrix_from_frame, edited_k, f"Kernel {k + 1}"))
    return out


def worked_example(url: UrlState) -> None:
    h, w, p, d = example_settings(url)
    inputs = edit_example(url, h, w, p, d)
    for message in inputs.errors.values():
        st.error(escape(message))
    image = inputs.values.get("image")
    given = [inputs.values.get(f"kernel {k + 1}") for k in range(d)]
    kernels = [k for k in given if k is not None]
    if image is None or len(kernels) < d:
        st.info("Fix the tables above to see the patch embeddings.")
        return
    if any(k.shape != (p, p) for k in kernels):
        st.error(f"Each kernel must be {p} × {p}, the patch size.")
        return
    steps = run_safely(lambda: tc.patch_embedding_steps(image, np.stack(kernels), p), "Patch embedding")
    if steps is not None:
        show_example(steps)


def show_patches(steps: tc.PatchEmbeddingSteps) -> None:
    rows, cols = steps.grid_hw
    n = rows * cols
    P = steps.patch_size
    st.markdown(f"**Cut into patches**: N = HW / P² = {steps.image.shape[1]} · {steps.image.shape[2]} / {P}² = **{n}**")
    if n > 16:
        st.caption(f"{n} patches: too many to draw one by one; the table below lists each of them.")
        return
    lo, hi = float(steps.image.min()), float(steps.image.max())
    domain = (lo, hi if hi > lo else lo + 1)
    for start in range(0, n, 4):
        for column, i in zip(st.columns(4), range(start, min(start + 4, n))):
            with column:
                chart = heatmap(
                    lpe.patch_matrix(steps, i),
                    [str(r) for r in range(P)],
                    [str(c) for c in range(P)],
                    lpe.patch_label(i, steps.grid_hw),
                    row_title="row",
                    col_title="column",
                    scheme="greys",
                    domain=domain,
                    cell_size=max(12, min(30, 72 // P)),  # four kernels fit a 1280-px row
                )
                downloads.chart(chart, key=f"pe.chart.patch{i}")


def show_example(steps: tc.PatchEmbeddingSteps) -> None:
    show_patches(steps)
    st.markdown("**Each kernel laid over each patch**: multiply the numbers that lie on each other, then add.")
    products = lpe.products_frame(steps)
    st.dataframe(products, hide_index=True, column_config={"sum": st.column_config.NumberColumn(format="%g")})
    embeddings = lpe.embeddings_frame(steps)
    st.markdown(f"**The patch embeddings** (N × D = {embeddings.shape[0]} × {embeddings.shape[1]}):")
    st.dataframe(embeddings.style.format("{:g}"))
    downloads.matrix_download(
        steps.output, list(embeddings.index), list(embeddings.columns), "patch_embeddings.csv", key="pe.csv.out"
    )
    st.markdown(lpe.statement(steps))
    P2 = steps.patches.shape[1]
    patch_names = [f"patch {i}" for i in range(len(steps.patches))]
    pixel_names = [f"x{j + 1}" for j in range(P2)]
    kernel_names = [f"e{k + 1}" for k in range(steps.weight.shape[1])]
    matrix_panel(
        "X_p",
        r"X_p:\ \text{each patch flattened, row by row}",
        steps.patches,
        patch_names,
        pixel_names,
        key_prefix="pe",
        file_prefix="patch",
        row_title="patch",
        col_title="pixel",
        diverging=False,
    )
    matrix_panel(
        "E",
        r"E:\ \text{each kernel flattened the same way, one per column}",
        steps.weight,
        pixel_names,
        kernel_names,
        key_prefix="pe",
        file_prefix="patch",
        row_title="pixel",
        col_title="kernel",
        diverging=False,
    )
    matrix_panel(
        "X_p E",
        r"X_p E = \text{the patch embeddings}",
        steps.output,
        patch_names,
        kernel_names,
        key_prefix="pe",
        file_prefix="patch",
        row_title="patch",
        col_title="e",
        diverging=False,
    )


# ---- one patch of the real model ------------------------------------------------------------------------
def real_model_patch(url: UrlState, result: VisionResult, model: TracedModel) -> None:
    rows, cols = result.grid_hw
    n = rows * cols
    st.subheader(f"The same on {escape(model.source)}: one patch of your picture")
    c = st.columns(2)
    patch = c[0].number_input(
        f"Patch (0 to {n - 1}, row by row)",
        0,
        n - 1,
        key=int_key(url, "pe_patch", (rows // 2) * cols + cols // 2, 0, n - 1),
    )
    n_dims = c[1].number_input("Output dimensions shown", 1, 16, key=int_key(url, "pe_dims", 4, 1, 16))
    real = run_safely(lambda: lpe.real_patch(model, result.trace, int(patch)), "Patch")
    if real is None:
        return
    P, C, D = real.patch_size, real.channels, real.weight.shape[1]
    left, right = st.columns([1, 2])
    left.image(
        to_png(lpe.patch_picture(result.image, result.grid_hw, real.patch)),
        caption=f"{lpe.patch_label(real.patch, result.grid_hw)}: {P} × {P} pixels × {C} channels",
    )
    right.image(
        to_png(lpe.kernel_pictures(real, int(n_dims))),
        caption=f"The kernels of e1 … e{min(int(n_dims), D)} (of D = {D}), each {P} × {P} × {C}, shown as colours "
        "(each scaled to its own range)",
    )
    show_real_sums(real, int(n_dims), D)


def show_real_sums(real: lpe.RealPatch, n_dims: int, D: int) -> None:
    m = len(real.pixels)
    st.latex(rf"e_k = \sum_{{j=1}}^{{{m}}} x_j\, w_{{jk}} + b_k\qquad (k = 1 \dots {D})")
    st.markdown(
        f"The patch, normalised as the model reads it and flattened (channel, then row, then column), is "
        f"**{m}** numbers x_j. For e₁: {escape(real.first_products(0))} = **{fmt(real.output[0])}**."
    )
    sums = real.sums_frame(n_dims)
    styled = sums.style.format("{:.6f}").format("{:.1e}", subset=["difference"])  # float32 rounding, not 0
    st.dataframe(styled, key="pe.table.real")
    products = real.products_frame(n_dims)
    downloads.matrix_download(
        products.to_numpy(),
        list(products.index),
        list(products.columns),
        f"patch_{real.patch}_products.csv",
        "Every product (CSV)",
        key="pe.csv.real",
    )
    st.caption(
        f"Recomputed in float64 for every patch of the picture from the model's own kernels and bias: the "
        f"largest difference from the model's embeddings (float32) is {real.max_difference:.1e}."
    )
