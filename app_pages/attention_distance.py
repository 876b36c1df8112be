"""Mean attention distance: how far each head of each layer looks, over many pictures (ViT paper, Fig. 7 right),
and the same for text models in tokens.

Read widgets -> ask the views (tformer_views.distance) -> draw. The pictures are traced in batches (on
the GPU when there is one) keeping only the attention weights; the result is computed once per
(model, pictures, recipe) for the whole server, with a progress bar.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib

import numpy as np
import streamlit as st

import tformer_core as tc
from tformer_app import downloads, long_work, models, presenter, results
from tformer_app import vision_inputs as vi
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, TEXT_MODEL_SUGGESTIONS, run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import NEEDS_INTERNET, local_model_names_of, needs_internet
from tformer_views import distance
from tformer_views import text as tv
from tformer_views import vision as vv
from tformer_views.charts.attention import distance_chart

MAX_SENTENCES = 64  # sentences one request reads
MAX_PICTURES = 64  # pictures one request reads (each is decoded, used and dropped before the next)
SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "Attention is all you need.",
    "The cat sat on the mat while the dog slept by the fire.",
    "A Transformer reads every word of a sentence at once and lets each word look at all the others.",
)
RECIPE = """**Renormalise over the patches?** For each query patch, the distance is Σ_j w_ij·d(i, j), the
attention-weighted distance (in pixels) between patch centres, averaged over the query patches.
The class (and distillation) token has no place in the picture, so it is left out as a key. The common
recipe (the one used for the ViT paper's figure in public re-implementations) leaves each row as it
is: the share a patch gives the class token simply counts as distance 0. Renormalising divides each
row by its mass on the patches, giving a true average distance over the patches it looks at."""


INTRO = (
    "How far does each head look? For every head of every layer: the attention-weighted distance between "
    "a query and what it attends to, averaged over queries and inputs. In the ViT paper (Fig. 7, right), "
    "some heads of the first layers already look far, others locally, and all look far in the last layers."
)


def draw(url: UrlState) -> None:
    vision(url)
    st.divider()
    text(url)


def main() -> None:
    run_page("Mean attention distance", INTRO, "mad", draw)


def vision(url: UrlState) -> None:
    settings = presenter.settings_box("Model, pictures and recipe")
    presenter.idea("How far each head looks, in pixels: early layers mix near and far heads, late layers look far.")
    if settings is None:
        st.header("Vision Transformers, in pixels")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = vi.choose_vit(url)
    if model is None:
        return
    # The figure first (the page's key idea on its first screen), the pictures it is made of under it.
    figure = st.container()
    with settings if settings is not None else contextlib.nullcontext():
        files = vi.choose_images(url, model)
        renormalize = st.toggle(
            "Renormalise each row over the patches",
            key=url.key("renorm", False),
            help="Off: the common recipe. See below.",
        )
    if not files:
        st.info("Choose sample pictures or upload some.")
        return
    if len(files) > MAX_PICTURES:
        st.info(f"{len(files)} pictures given; the first {MAX_PICTURES} are read. Remove some to use the others.")
        files = files[:MAX_PICTURES]
    digest = hashlib.blake2b(b"".join(hashlib.blake2b(d, digest_size=16).digest() for _, d in files), digest_size=16)
    key = ("mad", source, digest.hexdigest(), bool(renormalize))

    def compute(progress):
        names: list[str] = []
        refused: list[str] = []
        per_image = None
        pictures = vv.read_pictures(files, names, refused)  # decoded one by one as the batches need them
        if len(refused) < len(files):
            per_image = distance.distances_over_images(
                model,
                pictures,
                renormalize=bool(renormalize),
                progress=lambda done: progress(done / len(files), f"{done} of {len(files)} pictures"),
            )
        return per_image, names, refused

    result = run_safely(lambda: long_work.computed(key, compute, f"Tracing {len(files)} pictures"), "Pictures")
    if result is None:
        return
    per_image, names, refused = result
    for message in refused:
        st.warning(f"Left out: {escape(message)}")
    if per_image is not None and names:
        with figure:
            show_pixel_distances(source, model, per_image, names, bool(renormalize))


def show_pixel_distances(
    source: str, model: tc.ViT, per_image: np.ndarray, names: list[str], renormalize: bool
) -> None:
    """per_image: [pictures, layers, heads] in pixels."""
    c = model.config
    mean = per_image.mean(0)  # [layers, heads]
    baseline = distance.uniform_image_distance(c.grid_hw, c.patch_size, c.n_prefix_tokens, renormalize)
    st.caption(
        f"{len(names)} picture(s), {c.n_layers} layers × {c.n_heads} heads, {c.grid_hw[0]} × {c.grid_hw[1]} "
        f"patches of {c.patch_size} px; traced in batches of {distance.auto_batch_size(model)} on "
        f"{escape(str(model.device))}."
    )
    downloads.chart(
        distance_chart(mean, baseline, c.n_heads, title=f"{source}: mean attention distance", unit="pixels"),
        key="mad.chart.vision",
        file_name="mean_attention_distance_pixels",
    )
    st.caption(
        f"Each dot is one head, averaged over the pictures. Dashed: uniform attention over every token "
        f"({baseline:.1f} px with this recipe)."
    )
    with st.expander("Which recipe?"):
        st.markdown(RECIPE)
    layers, heads = [f"layer {i}" for i in range(c.n_layers)], [f"head {h}" for h in range(c.n_heads)]
    downloads.matrix_download(mean, layers, heads, "mean_attention_distance_pixels.csv", key="mad.csv_vision")
    if len(names) > 1:
        downloads.matrix_download(
            per_image.reshape(len(names), -1),
            names,
            [f"L{layer} H{h}" for layer in range(c.n_layers) for h in range(c.n_heads)],
            "mean_attention_distance_per_picture.csv",
            label="Per picture (CSV)",
            key="mad.csv_vision_each",
        )


def text(url: UrlState) -> None:
    st.header("Text models, in tokens")
    st.caption(
        "The same plot for a text model: Σ_j w_ij·|i − j| in tokens, averaged over the query tokens of "
        "each sentence and over the sentences."
    )
    options = list(dict.fromkeys([*TEXT_MODEL_SUGGESTIONS, *local_model_names_of(("encoder", "decoder"))]))
    source = st.selectbox(
        "Text model",
        options,
        key=url.key("text_model", DEFAULT_TEXT_MODEL, choices=options),
        format_func=lambda o: o + NEEDS_INTERNET * needs_internet(o),
    )  # a link's model that is not offered is replaced, and the page says so
    lines = st.text_area("Sentences, one per line", key=url.key("sentences", "\n".join(SENTENCES)), height=120)
    sentences = [s.strip() for s in lines.splitlines() if s.strip()]
    if not sentences:
        st.error("Type at least one sentence.")
        return
    model = models.load_model(source)
    if model is None:
        return
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(escape(problem))
        return
    if len(sentences) > MAX_SENTENCES:
        st.info(f"{len(sentences)} sentences given; the first {MAX_SENTENCES} are read.")
    grids, baselines = [], []
    for sentence in sentences[:MAX_SENTENCES]:
        fitted = run_safely(functools.partial(tc.fit_to_model, model, sentence), "Sentence")
        # Each sentence is reduced to its [layers, heads] figures as it is traced; no trace is kept.
        request = results.token_distance(source, fitted.text) if fitted is not None else None
        figures = request and run_safely(functools.partial(results.result, request), "Sentence")
        if figures:
            grids.append(figures[0])
            baselines.append(figures[1])
    if not grids:
        return
    mean = np.mean(grids, axis=0)  # over the sentences
    L, H = mean.shape
    downloads.chart(
        distance_chart(mean, float(np.mean(baselines)), H, title=f"{source}: mean attention distance", unit="tokens"),
        key="mad.chart.text",
        file_name="mean_attention_distance_tokens",
    )
    st.caption(
        f"{len(grids)} sentence(s). Dashed: uniform attention over the tokens each query may see, averaged "
        "over the sentences. Per-sentence views are on the Text attention page."
    )
    downloads.matrix_download(
        mean,
        [f"layer {i}" for i in range(L)],
        [f"head {h}" for h in range(H)],
        "mean_attention_distance_tokens.csv",
        key="mad.csv_text",
    )


main()
