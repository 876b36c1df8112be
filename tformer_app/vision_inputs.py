"""The inputs of the two vision pages, drawn with Streamlit: which ViT, and which picture(s).

    source, model = vision_inputs.choose_vit(url)          # DeiT-Tiny when it can be had, else vit-tiny (said so)
    picked = vision_inputs.choose_image(url, model)       # (name, file bytes) from a sample, an upload or the camera
    files = vision_inputs.choose_images(url, model)       # several, for the mean attention distance

Uploads are checked by the core (tformer_core.inputs.image_file) when they are read: a bad file gets
its message there. Uploads cannot travel in a link; samples can (their name is in the URL).
"""

from __future__ import annotations

import streamlit as st

from tformer_core import ViT
from tformer_core.checkpoints.errors import CheckpointError
from tformer_core.checkpoints.hfconfig import read_json
from tformer_core.checkpoints.sources import local_models
from tformer_core.inputs.image_file import MAX_BYTES
from tformer_core.models.base import TracedModel
from tformer_views import samples

from .derived_views import digit_pictures, sample_pictures
from .markdown import escape
from .models import load_model
from .page import once_per_session
from .url import UrlState
from .widgets import choose_model, replace_model

DEFAULT_VIT = "facebook/deit-tiny-patch16-224"
FALLBACK_VIT = "vit-tiny"
SUGGESTIONS = (
    DEFAULT_VIT,
    FALLBACK_VIT,
    "facebook/deit-small-patch16-224",
    "google/vit-base-patch16-224",
    "facebook/deit-base-distilled-patch16-224",
)
SOURCES = {"sample": "Sample", "upload": "Upload", "camera": "Camera"}
CAMERA_NAME = "camera.jpg"  # a camera shot's name: the browser sends none
VIT_TYPES = ("vit", "deit")
SHAPES_ONLY = (
    f"{FALLBACK_VIT} is a small ViT trained by this project on 32 × 32 pictures of eight shapes: it knows only "
    "those eight classes, so for a photo its answer is always one of them."
)


def local_vits() -> list[str]:
    """Names of the ViT and DeiT checkpoints in this server's model folders (by their config.json)."""
    found = []
    for name, folder in local_models():
        try:
            if read_json(folder / "config.json").get("model_type") in VIT_TYPES:
                found.append(name)
        except CheckpointError:
            continue  # a broken folder is reported when someone chooses it
    return found


def available_default() -> tuple[str, str | None]:
    """The ViT a page opens with, and a note when it is not DeiT-Tiny: DeiT-Tiny from the hub (or its cache);
    offline, a real ViT from this server's model folders; else the bundled shapes model."""
    if load_model(DEFAULT_VIT, quiet=True) is not None:
        return DEFAULT_VIT, None
    for name in local_vits():
        if load_model(name, quiet=True) is not None:
            note = f"{DEFAULT_VIT} cannot be had (no internet, not in the hub's cache): this is **{escape(name)}**"
            return name, note + ", from this server's model folders."
    return FALLBACK_VIT, (
        f"{DEFAULT_VIT} cannot be had (no internet, not in the hub's cache) and this server's model folders hold "
        f"no other ViT, so this is the bundled **{FALLBACK_VIT}**. {SHAPES_ONLY}"
    )


def choose_vit(url: UrlState) -> tuple[str, ViT | None]:
    """The model picker. The default is the first ViT that can be had (`available_default`); a link or a
    choice of DeiT-Tiny that cannot be had shows that one instead, and the box and the link name it."""
    default, note = available_default()
    if default != DEFAULT_VIT:
        replace_model(url, DEFAULT_VIT, default)
    source = choose_model(
        url,
        SUGGESTIONS,
        default,
        placeholder="e.g. google/vit-base-patch16-224 or models/my-vit",
        kinds=("vit",),
        help=f"{DEFAULT_VIT} comes from the Hugging Face hub (or its local cache). {FALLBACK_VIT} is trained by "
        "this project on generated shapes and works offline.",
    )
    if note and source == default and once_per_session("vit-default"):  # the list marks the hub id meanwhile
        st.info(note)
    elif source == FALLBACK_VIT:
        st.info(SHAPES_ONLY)
    model = load_model(source)
    if model is None:
        return source, None
    if not isinstance(model, ViT):
        page = {"encoder-decoder": "the Encoder-decoder", "mae": "the Masked autoencoder", "detr": "the DETR"}
        where = page.get(model.kind, "the Text attention")
        st.warning(f"**{escape(source)}** is not a Vision Transformer classifier: open {where} page.")
        return source, None
    return source, model


# The sample each bundled model opens on: the kind of picture it was trained on.
BUNDLED_SAMPLES = {FALLBACK_VIT: "shapes: circle", "mae-tiny": "shapes: circle", "detr-tiny": "scene: 3 shapes"}


def _default_sample(model: TracedModel, names: list[str]) -> str:
    """The bundled models' own kind of picture (a shape, a scene of shapes), the Train page's fixed digit for a ViT
    trained there, a photo for the others."""
    if samples.reads_digits(model) and samples.first_digit() in names:
        return samples.first_digit()
    own = BUNDLED_SAMPLES.get(model.source)
    if own in names:
        return str(own)
    return next((n for n in names if n.startswith("photo:")), names[0])


def _samples(model: TracedModel) -> dict[str, bytes]:
    """The sample pictures (name -> file bytes); for a ViT trained on the digits, their test pictures first."""
    files = sample_pictures()
    return {**digit_pictures(), **files} if samples.reads_digits(model) else files


def choose_image(url: UrlState, model: TracedModel) -> tuple[str, bytes] | None:
    """One picture: a sample (named in the link), an upload or a camera shot; None until there is one (the link's
    settings for the picture are kept until then: `UrlState.wait_for`)."""
    kind = st.radio(
        "Picture",
        list(SOURCES),
        format_func=SOURCES.get,
        horizontal=True,
        key=url.key("from", "sample", choices=list(SOURCES)),
    )
    if kind == "sample":
        files = _samples(model)
        names = list(files)
        name = st.selectbox("Sample", names, key=url.key("sample", _default_sample(model, names), choices=names))
        return name, files[name]
    if kind == "upload":
        uploaded = st.file_uploader(
            f"An image (PNG, JPEG, WebP, BMP, TIFF or GIF; at most {MAX_BYTES // 2**20} MB)",
            key=f"{url.page}.upload",
            help="Uploads stay in this browser session; a shared link cannot carry them.",
        )
        if uploaded is None:
            st.info("Upload a picture to see what the model does with it.")
            url.wait_for("an uploaded picture")
            return None
        return uploaded.name, uploaded.getvalue()
    shot = st.camera_input("Take a picture", key=f"{url.page}.camera")
    if shot is None:
        st.info("Take a picture with your camera (the browser asks for permission first).")
        url.wait_for("a camera picture")
        return None
    return CAMERA_NAME, shot.getvalue()


def current_picture(url: UrlState, model: TracedModel) -> tuple[str, bytes] | None:
    """The picture `choose_image` chose in the page's last run, read from its widgets' values without drawing them
    (for a part of the page that runs alone: page.part); None when there is none."""
    kind = st.session_state.get(f"{url.page}.from")
    if kind == "sample":
        files = _samples(model)
        name = st.session_state.get(f"{url.page}.sample")
        return (name, files[name]) if name in files else None
    chosen = st.session_state.get(f"{url.page}.upload" if kind == "upload" else f"{url.page}.camera")
    if chosen is None:
        return None
    return (chosen.name if kind == "upload" else CAMERA_NAME), chosen.getvalue()


def choose_images(url: UrlState, model: TracedModel) -> list[tuple[str, bytes]]:
    """Several pictures: samples chosen by name (in the link), and any uploads."""
    files = _samples(model)
    names = list(files)
    default = [n for n in names if n.startswith("photo:")] + [n for n in names if n.startswith("shapes:")]
    chosen_key = url.key("samples", default, choices=names)  # a link's unknown names are left out, and said
    if any(n not in names for n in st.session_state[chosen_key]):
        st.session_state[chosen_key] = [n for n in st.session_state[chosen_key] if n in names]
    chosen = st.multiselect("Sample pictures", names, key=chosen_key)
    uploads = st.file_uploader(
        "And your own pictures",
        accept_multiple_files=True,
        key=f"{url.page}.uploads",
        help="Uploads stay in this browser session; a shared link cannot carry them.",
    )
    return [(n, files[n]) for n in chosen] + [(u.name, u.getvalue()) for u in uploads or []]
