"""Masked autoencoder: a random 75 % of the patches masked on a picture, the pixels the decoder rebuilds for them
and the error per patch. Opens on mae-tiny, trained by this project on generated shape scenes (offline); a ViT-MAE
checkpoint from the hub or the server's model folders when chosen.

Read widgets -> the masking (tformer_views.mae, no model needed) -> with a model, one cached traced pass per
picture and seed (results.mae) -> draw.
"""

from __future__ import annotations

import contextlib

import numpy as np
import streamlit as st

from tformer_app import models, presenter, results, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_core.bundled import BUNDLED_MODELS, model_card, recorded
from tformer_core.models.base import TracedModel
from tformer_views import mae as mv
from tformer_views.pictures import enlarged, overlay, to_png

BUNDLED = "mae-tiny"
DEFAULT = BUNDLED
SUGGESTIONS = (BUNDLED, "facebook/vit-mae-base", "facebook/vit-mae-large")
INTRO = (
    "A masked autoencoder hides most of a picture and learns to fill it in. Its encoder, a ViT, sees only the "
    "visible quarter of the patches (no mask tokens at all); a small decoder gets the encoder's output, puts a "
    "learned mask token at every hidden patch, and predicts their pixels."
)
KEY_IDEA = "The encoder sees only a quarter of the patches; the decoder rebuilds the other three quarters."
NEEDS = (
    "The reconstruction needs a masked autoencoder: the bundled **mae-tiny** (offline), or a ViT-MAE checkpoint "
    "(ViTMAEForPreTraining) such as **facebook/vit-mae-base** from the Hugging Face hub when this server is online "
    "(or in its hub cache), or such a folder in this server's model folders (TFORMER_MODEL_DIRS). Without one, the "
    "page shows the masking only."
)
PRESENTED_PX = 280  # four pictures side by side on a 1280 x 720 projector, under the title and one line


def main() -> None:
    run_page("Masked autoencoder (MAE)", INTRO, "mae", page)


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, picture and masking seed")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = choose_mae(url)
        picked = vision_inputs.choose_image(url, model) if model is not None else choose_picture(url)
        seed = None
        if picked is not None:
            seed = st.number_input(
                "Masking seed (another seed hides other patches)", 0, 9999, key=url.key("seed", 0, lo=0, hi=9999)
            )
    if model is None:
        st.info(NEEDS)  # outside the settings: seen on a projector too
    if picked is None or seed is None:
        return
    name, data = picked
    presenter.idea(KEY_IDEA)  # presenter mode: on the line below the title, beside the settings
    if model is None:
        shown = run_safely(lambda: mv.mask_only(data, name, int(seed)), "Picture")
        if shown is not None:
            image, mask = shown
            show_masking(image, mask, 16)
        return
    result = run_safely(lambda: results.result(results.mae(source, data, name, int(seed))), "Picture")
    if result is None:
        return
    if settings is not None:
        show_presented(result)
    else:
        show_masking(result.image, result.mask, result.patch_size)
        show_reconstruction(result)
    if source in BUNDLED_MODELS:
        say_quality(source)


def choose_mae(url: UrlState) -> tuple[str, TracedModel | None]:
    """The model picker (the bundled mae-tiny first); the model, or None with the reason shown."""
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. facebook/vit-mae-base or models/my-mae",
        help=f"{BUNDLED} is trained by this project on 32 × 32 pictures of shapes and works offline. A ViT-MAE "
        "checkpoint needs its decoder (ViTMAEForPreTraining); hub models need the internet the first time.",
    )
    model = models.load_model(source)
    if model is not None and model.kind != "mae":
        st.warning(f"**{escape(source)}** is not a masked autoencoder (ViT-MAE).")
        model = None
    return source, model


def choose_picture(url: UrlState) -> tuple[str, bytes] | None:
    """The picture chooser of the vision pages, for the masking without a model (a photo by default)."""

    class _Photo:  # choose_image asks only for the model's source, to pick its default sample
        source = "photo"

    return vision_inputs.choose_image(url, _Photo())  # type: ignore[arg-type]


def masked_heading(mask: np.ndarray) -> str:
    n, hidden = mask.size, int(mask.sum())
    return f"{hidden} of {n} patches masked ({hidden / n:.0%}); the encoder sees {n - hidden}"


def show_masking(image, mask: np.ndarray, patch: int) -> None:
    st.subheader(masked_heading(mask))
    left, right = st.columns(2)
    left.image(to_png(enlarged(image)), caption="the picture, as the model sees it", width=300)
    right.image(
        to_png(enlarged(mv.masked_picture(image, mask, patch))),
        caption="what the encoder sees (grey: masked)",
        width=300,
    )


def show_reconstruction(result: mv.MAEResult) -> None:
    st.subheader("What the decoder rebuilds")
    errors = mv.patch_errors(result)
    left, middle, right = st.columns(3)
    left.image(
        to_png(enlarged(mv.reconstruction(result, paste_visible=False))),
        width=300,
        caption="the decoder's prediction for every patch",
    )
    middle.image(
        to_png(enlarged(mv.reconstruction(result))),
        width=300,
        caption="prediction on the masked patches, visible ones pasted back",
    )
    heat = np.nan_to_num(errors, nan=0.0)
    right.image(
        to_png(overlay(result.image, heat)), width=300, caption="squared error per masked patch (bright: large)"
    )
    say_error(result, errors)


def show_presented(result: mv.MAEResult) -> None:
    """Presenter mode: what the encoder sees, what the decoder rebuilds, the picture and the error, in one row."""
    st.subheader(masked_heading(result.mask))
    errors = mv.patch_errors(result)
    pictures = (
        (mv.masked_picture(result.image, result.mask, result.patch_size), "what the encoder sees"),
        (mv.reconstruction(result), "the decoder's rebuild (visible patches pasted back)"),
        (result.image, "the picture"),
        (overlay(result.image, np.nan_to_num(errors, nan=0.0)), "squared error per masked patch"),
    )
    for column, (picture, caption) in zip(st.columns(len(pictures)), pictures):
        column.image(to_png(enlarged(picture)), caption=caption, width=PRESENTED_PX)
    say_error(result, errors)


def say_error(result: mv.MAEResult, errors: np.ndarray) -> None:
    unit = "per-patch normalised pixels" if result.norm_pix_loss else "normalised pixels"
    st.caption(
        f"Mean squared error over the masked patches: **{np.nanmean(errors):.3f}** ({unit}, the loss the "
        f"model was trained on); largest {np.nanmax(errors):.3f}, smallest {np.nanmin(errors):.3f}."
    )


def say_quality(name: str) -> None:
    """One line of the bundled model's measured quality (its training run's record), and its model card."""
    figures = recorded(name).get("evaluation")
    if figures is not None:
        a = figures["masked"]
        st.caption(
            f"**{escape(name)}** was trained by this project on generated 32 × 32 pictures of shapes. On "
            f"{figures['held_out_images']:,} held-out pictures its squared error over the hidden patches is "
            f"{a['mean_colour_ratio']:.1f} times smaller than filling them with the mean colour of the visible "
            f"patches ({a['model_mse']:.3f} against {a['mean_colour_mse']:.3f})."
        )
    with st.expander("Model card"):
        st.markdown(model_card(name))


main()
