"""Vision Transformer: how a ViT cuts a picture into patches, where each head looks, and the ViT paper's Fig. 7.

Read widgets -> ask the views (tformer_views.vision, pictures) for pictures and numbers -> draw. One
forward pass per picture (results.result); every layer, head, query patch or overlay choice redraws
pictures from the cached trace. Pictures go to the browser as PNG or JPEG, never as attention tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from tformer_app import (
    class_session,
    derived_views,
    downloads,
    patch_embedding,
    presenter,
    results,
    vision_flow,
    vision_norms,
)
from tformer_app import vision_explain as explain
from tformer_app import vision_inputs as vi
from tformer_app.events import clicked_patch
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.vision_explain import AttentionChoice
from tformer_core.models.vit import ViT
from tformer_views import class_questions
from tformer_views import vision as vv
from tformer_views.charts.pickers import patch_picker
from tformer_views.pictures import overlay, to_jpeg, to_png

CLASS_TOKEN = -1  # the "query" URL value for the class token; patches are 0..N-1
MEAN = -1  # the "head" value for the mean of the heads
FIRST_SCREEN_PX = 420  # presenter mode: the picture's width (and height) that fits below a 720-px screen's top


INTRO = (
    "A ViT cuts the picture into square patches, turns each into a vector, puts a class token in front and "
    "runs a Transformer encoder over the sequence. Choose a picture and see the patches, the attention of "
    "every head over the picture, and the model's own learned filters and positions."
)


def main() -> None:
    run_page("Vision Transformer", INTRO, "vit", page)


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, picture, layer, head and overlay")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = vi.choose_vit(url)
        picked = None if model is None else vi.choose_image(url, model)
    if model is None or picked is None:
        return
    name, data = picked
    key = results.picture(source, data, name)
    result = run_safely(lambda: results.result(key), "Picture")
    if result is None:
        return
    for note in result.notes:
        st.info(f"{escape(name)}: {escape(note)}.")
    if settings is not None:  # presenter mode: the attention the keys step on the first screen, the rest below
        show_attention(url, key, result, settings)
        show_patches(key, result, model)
        patch_embedding.draw(url, result, model)
        explain.show_figure_7(source, key, result)
        vision_norms.draw(url, result)
        vision_flow.draw(url, model, key, result)
        return
    show_prediction(result.trace)
    show_patches(key, result, model)
    patch_embedding.draw(url, result, model)
    show_attention(url, key, result)
    explain.show_figure_7(source, key, result)
    vision_norms.draw(url, result)
    vision_flow.draw(url, model, key, result)


def show_prediction(trace, title: str = "What the model sees: top 5") -> None:
    if not trace.has_head:
        return
    st.subheader(title)
    top = pd.DataFrame(trace.predictions(5), columns=["class", "probability"])
    st.dataframe(
        top,
        hide_index=True,
        column_config={
            "probability": st.column_config.ProgressColumn("probability", min_value=0.0, max_value=1.0, format="%.3f")
        },
    )


def show_patches(key: results.Request[vv.VisionResult], result: vv.VisionResult, model: ViT) -> None:
    trace, image = result.trace, result.image
    P, (rows, cols) = result.patch_size, result.grid_hw
    H, W = image.height, image.width
    n_prefix = trace.n_prefix_tokens
    acts = trace.activations
    patches, embedded = acts["encoder.embed.patches"].shape, acts["encoder.embed.patch"].shape
    tokens, pos = acts["encoder.embed.tokens"].shape, acts["encoder.embed.pos"].shape
    C = patches[1] // (P * P)
    D = embedded[1]
    st.header("Patches")
    ow, oh = result.original_size
    st.markdown(
        f"The picture ({ow:,} × {oh:,} pixels) is resized{' and cropped' if result.preprocessing.crop else ''} as this "
        f"checkpoint's preprocessing does, to **H × W = {H} × {W}**, then cut into patches of **P × P = {P} × {P}** "
        f"pixels: **N = HW / P² = {H} · {W} / {P}² = {rows * cols}** patches, {rows} rows × {cols} columns."
    )
    # Drawn once per picture: they do not change with the layer or head.
    grid = derived_views.grid_picture(key)
    sequence = derived_views.patch_sequence(key)
    st.image(grid, caption=f"The model's input with its {P}-pixel grid")
    st.image(
        sequence,
        caption="The same patches as the sequence the model reads: row by row, left to right "
        "(the number under every tenth)",
    )
    prefix = ", ".join(trace.tokens[:n_prefix])  # [CLS], DeiT's [DIST] or DINOv2's registers
    shapes = pd.DataFrame(
        [
            ("flatten each patch", f"N × P²·C = {rows * cols} × {P}²·{C}", f"{patches[0]} × {patches[1]}"),
            ("linear patch embedding E (P²·C × D)", "N × D", f"{embedded[0]} × {embedded[1]}"),
            (f"prepend {prefix}", f"(N + {n_prefix}) × D", f"{tokens[0]} × {tokens[1]}"),
            ("add the position embeddings", f"(N + {n_prefix}) × D, learned", f"{pos[0]} × {pos[1]}"),
            (
                f"encoder: {trace.n_layers} layers × {trace.n_heads} heads",
                f"(N + {n_prefix}) × D",
                f"{tokens[0]} × {D}",
            ),
            (
                "MLP head on the class token" + (" (and the distillation token, averaged)" if n_prefix == 2 else ""),
                "classes",
                str(model.config.n_classes) if trace.has_head else "-",
            ),
        ],
        columns=["step", "shape", "here"],
    )
    st.dataframe(shapes, hide_index=True)
    st.caption("Every number in the last column is the shape of a tensor the model computed for this picture.")


def attention_controls(url: UrlState, result: vv.VisionResult, where: Any = None) -> AttentionChoice:
    """Layer, head, smoothing and heat (in `where`: presenter mode's settings), and the keys that step them."""
    trace = result.trace
    L, Hn = trace.n_layers, trace.n_heads
    n = result.grid_hw[0] * result.grid_hw[1]
    c1, c2, c3, c4 = (where if where is not None else st).columns([1, 1, 1, 1])
    layer = c1.selectbox("Layer", list(range(L)), key=url.key("layer", L - 1, choices=range(L)))
    head = c2.selectbox(
        "Head",
        [MEAN, *range(Hn)],
        key=url.key("head", MEAN, choices=[MEAN, *range(Hn)]),
        format_func=lambda h: "mean of the heads" if h == MEAN else str(h),
    )
    smooth = c3.toggle(
        "Smooth", key=url.key("smooth", True), help="Blend between patch centres, or one block per patch"
    )
    alpha = c4.slider("Heat", 0.2, 0.9, key=url.key("alpha", 0.6, cast=float, lo=0.2, hi=0.9), step=0.05)
    layer_keys(url, L, Hn)
    query = st.session_state[url.key("query", CLASS_TOKEN, choices=[CLASS_TOKEN, *range(n)])]
    return AttentionChoice(
        int(layer),
        None if head == MEAN else int(head),
        None if query == CLASS_TOKEN else int(query),
        float(alpha),
        bool(smooth),
    )


def layer_keys(url: UrlState, n_layers: int, n_heads: int) -> None:
    """← → (and a clicker's Page Up / Page Down) step through the layers; ↑ ↓ through the heads and their mean."""
    heads = [MEAN, *range(n_heads)]

    def head(by: int) -> Callable[[], None]:
        return url.callback(lambda: url.set("head", heads[(heads.index(url.value("head")) + by) % len(heads)]))

    previous, following = presenter.cycle(url, "layer", n_layers, -1), presenter.cycle(url, "layer", n_layers, 1)
    presenter.stepper(
        url,
        "keys",
        [
            presenter.Step("layer", "Left", previous, "The layer before"),
            presenter.Step("layer", "Right", following, "The next layer"),
            presenter.Step("head", "Up", head(-1), "The head before (the mean of the heads comes first)"),
            presenter.Step("head", "Down", head(1), "The next head"),
        ],
        paging=(previous, following),
        where=presenter.keys_place(),
    )


def describe_query(result: vv.VisionResult, patch: int | None) -> str:
    if patch is None:
        return "the class token"
    cols = result.grid_hw[1]
    return f"patch {patch} (row {patch // cols}, column {patch % cols})"


def show_attention(
    url: UrlState, key: results.Request[vv.VisionResult], result: vv.VisionResult, settings: Any = None
) -> None:
    if settings is None:
        st.header("Attention over the picture")
    choice = attention_controls(url, result, settings)
    show_query_picker(url, result, choice, settings is not None)
    if result.trace.has_head and choice.head is not None:  # the class: predict the class with this head removed
        head = (result.trace.main_stack, choice.layer, choice.head)
        class_session.offer_interventions(key.source, "image", key.args, result.trace, head, "vision")
    who = describe_query(result, choice.patch)
    st.subheader(f"Every head of layer {choice.layer}")
    strip = vv.head_overlays(result, choice.layer, choice.patch, choice.alpha, choice.smooth)
    st.image(to_jpeg(strip), caption=f"Where {who} looks, head by head; each picture is scaled to its own maximum.")
    explain.show_why(url, key, result, choice)
    rolled = explain.show_rollout(url, key, result, choice)
    if rolled is not None and result.trace.has_head:
        explain.show_class_explanations(url, key, result, choice, rolled)


def show_query_picker(url: UrlState, result: vv.VisionResult, choice: AttentionChoice, first: bool = False) -> None:
    """The picture with the chosen head's attention over it; a click on a patch makes it the query. first: the
    page's first screen (presenter mode): the key idea above it, the model's top 5 beside it."""
    trace = result.trace
    n = result.grid_hw[0] * result.grid_hw[1]
    grid = vv.attention_map(trace, choice.layer, choice.head, choice.patch)
    picture = overlay(result.image, grid, alpha=choice.alpha, smooth=choice.smooth)
    who = describe_query(result, choice.patch)
    # The students' patch picker lies over the picture the model saw (small: every student's page gets it).
    class_session.offer(
        lambda: class_questions.vision_questions(
            grid, choice.layer, choice.head, who, picture=class_questions.question_picture(result.image)
        )
    )
    head_name = "mean of the heads" if choice.head is None else f"head {choice.head}"
    presenter.idea(f"**Layer {choice.layer}, {head_name}**: where {who} looks. Click a patch to ask where it looks.")
    left, right = st.columns([1, 1])
    with left:

        def pick() -> None:
            chosen = clicked_patch(st.session_state.get(f"{url.page}.picker"))
            if chosen is not None:
                url.set("query", chosen)

        # At most the picture's own size (larger in presenter mode, but within a 720-px projector's first screen),
        # narrower to fit a narrower column.
        width = round(picture.width * presenter.scale())
        if first:
            width = min(width, FIRST_SCREEN_PX)
        downloads.chart(
            patch_picker(picture, result.grid_hw, choice.patch, title=f"query: {who}", width=width),
            key=f"{url.page}.picker",
            file_name=f"attention_L{choice.layer}_{'mean' if choice.head is None else f'H{choice.head}'}",
            on_select=url.callback(pick),
            selection_mode="patch",
        )
    with right:
        if first:  # the line above the picture says which head this is
            show_prediction(trace, "What the model sees")
        else:
            st.markdown(f"**Layer {choice.layer}, {head_name}**: where {who} looks.")
        prefix = vv.prefix_tokens_named(trace)
        st.caption(
            f"Brightest = the patch it attends to most ({grid.max():.3f} of its attention). "
            f"{1 - grid.sum():.1%} of its attention goes to the {prefix} (not drawn). "
            "Click any patch to see where that patch looks."
        )
        st.selectbox(
            "Query",
            [CLASS_TOKEN, *range(n)],
            key=f"{url.page}.query",
            format_func=lambda q: "the class token" if q == CLASS_TOKEN else f"patch {q}",
        )
        downloads.file_download(
            "Overlay as PNG",
            lambda: to_png(picture),
            f"overlay_L{choice.layer}.png",
            "image/png",
            f"{url.page}.overlay_png",
        )


main()
