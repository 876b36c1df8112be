"""Masked autoencoder: a random 75 % of the patches masked on your picture; with an MAE checkpoint, the
pixels the decoder rebuilds for them and the error per patch.

Read widgets -> the masking (tformer_views.mae, no model needed) -> with a checkpoint, one cached traced
pass per picture and seed (caches.mae) -> draw.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from tformer_app import caches, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_views import mae as mv
from tformer_views.pictures import overlay, to_png

DEFAULT = "facebook/vit-mae-base"
SUGGESTIONS = (DEFAULT, "facebook/vit-mae-large")
INTRO = (
    "A masked autoencoder hides most of a picture and learns to fill it in. Its encoder, a ViT, sees only the "
    "visible quarter of the patches (no mask tokens at all); a small decoder gets the encoder's output, puts a "
    "learned mask token at every hidden patch, and predicts their pixels."
)
NEEDS = (
    "The reconstruction needs a ViT-MAE checkpoint (ViTMAEForPreTraining): **facebook/vit-mae-base** from the "
    "Hugging Face hub when this server is online (or in its hub cache), or such a folder in this server's model "
    "folders (TFORMER_MODEL_DIRS). Without one, the page shows the masking only."
)


def main() -> None:
    run_page("Masked autoencoder (MAE)", INTRO, "mae", page)


def page(url: UrlState) -> None:
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT,
        placeholder="e.g. facebook/vit-mae-base or models/my-mae",
        help="A ViT-MAE checkpoint with its decoder (ViTMAEForPreTraining).",
    )
    model = caches.load_model(source)
    if model is not None and model.kind != "mae":
        st.warning(f"**{escape(source)}** is not a masked autoencoder (ViT-MAE).")
        model = None
    if model is None:
        st.info(NEEDS)
    picked = vision_inputs.choose_image(url, model) if model is not None else choose_picture(url)
    if picked is None:
        return
    name, data = picked
    seed = st.number_input(
        "Masking seed (another seed hides other patches)", 0, 9999, key=url.key("seed", 0, lo=0, hi=9999)
    )
    if model is None:
        shown = run_safely(lambda: mv.mask_only(data, name, int(seed)), "Picture")
        if shown is not None:
            image, mask = shown
            show_masking(image, mask, 16)
        return
    result = run_safely(lambda: caches.result(caches.mae(source, data, name, int(seed))), "Picture")
    if result is not None:
        show_masking(result.image, result.mask, result.patch_size)
        show_reconstruction(result)


def choose_picture(url: UrlState) -> tuple[str, bytes] | None:
    """The picture chooser of the vision pages, for the masking without a model (a photo by default)."""

    class _Photo:  # choose_image asks only for the model's source, to pick its default sample
        source = "photo"

    return vision_inputs.choose_image(url, _Photo())  # type: ignore[arg-type]


def show_masking(image, mask: np.ndarray, patch: int) -> None:
    n, hidden = mask.size, int(mask.sum())
    st.subheader(f"{hidden} of {n} patches masked ({hidden / n:.0%}); the encoder sees {n - hidden}")
    left, right = st.columns(2)
    left.image(to_png(image), caption="the picture, as the model sees it", width=300)
    right.image(
        to_png(mv.masked_picture(image, mask, patch)), caption="what the encoder sees (grey: masked)", width=300
    )


def show_reconstruction(result: mv.MAEResult) -> None:
    st.subheader("What the decoder rebuilds")
    errors = mv.patch_errors(result)
    left, middle, right = st.columns(3)
    left.image(
        to_png(mv.reconstruction(result, paste_visible=False)),
        width=300,
        caption="the decoder's prediction for every patch",
    )
    middle.image(
        to_png(mv.reconstruction(result)),
        width=300,
        caption="prediction on the masked patches, visible ones pasted back",
    )
    heat = np.nan_to_num(errors, nan=0.0)
    right.image(
        to_png(overlay(result.image, heat)), width=300, caption="squared error per masked patch (bright: large)"
    )
    unit = "per-patch normalised pixels" if result.norm_pix_loss else "normalised pixels"
    st.caption(
        f"Mean squared error over the masked patches: **{np.nanmean(errors):.3f}** ({unit}, the loss the "
        f"model was trained on); largest {np.nanmax(errors):.3f}, smallest {np.nanmin(errors):.3f}."
    )


main()
