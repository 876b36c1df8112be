"""Mean attention distance: how far each head of each layer looks, over many pictures (ViT paper, Fig. 7 right),
and the same for text models in tokens.

Read widgets -> ask the core (tformer_views.vision, text_views) -> draw. The pictures are traced
in batches (on the GPU when there is one) keeping only the attention weights; the result is
computed once per (model, pictures, recipe) for the whole server, with a progress bar.
"""

from __future__ import annotations

import hashlib

import numpy as np
import streamlit as st

from tformer_app import ui
from tformer_app import vision_inputs as vi
from tformer_views import text as tv
from tformer_views import vision as vv

BATCH = 32
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


def draw(url: ui.UrlState) -> None:
    vision(url)
    st.divider()
    text(url)


def main() -> None:
    ui.run_page("Mean attention distance", INTRO, "mad", draw)


def vision(url: ui.UrlState) -> None:
    st.header("Vision Transformers, in pixels")
    source, model = vi.choose_vit(url)
    if model is None:
        return
    files = vi.choose_images(url, model)
    renormalize = st.toggle(
        "Renormalise each row over the patches", key=url.key("renorm", False), help="Off: the common recipe. See below."
    )
    if not files:
        st.info("Choose sample pictures or upload some.")
        return
    pictures, names, refused = vv.read_images(files)
    for message in refused:
        st.warning(f"Left out: {tv.escape_markdown(message)}")
    if not pictures:
        return
    digest = hashlib.blake2b(b"".join(hashlib.blake2b(d, digest_size=16).digest() for _, d in files), digest_size=16)
    key = ("mad", source, digest.hexdigest(), bool(renormalize))

    def compute(progress):
        return vv.mean_attention_distances(
            model,
            pictures,
            renormalize=bool(renormalize),
            batch_size=BATCH,
            progress=lambda done, total: progress(done / total, f"{done} of {total} pictures"),
        )

    per_image = ui.run_safely(lambda: ui.computed(key, compute, f"Tracing {len(pictures)} pictures"), "Pictures")
    if per_image is None:
        return
    c = model.config
    mean = per_image.mean(0)  # [layers, heads]
    baseline = vv.uniform_mad(c.grid_hw, c.patch_size, c.n_prefix_tokens, bool(renormalize))
    frame = vv.mad_frame(mean)
    where = tv.escape_markdown(str(getattr(model, "device", "cpu")))
    st.caption(
        f"{len(pictures)} picture(s), {c.n_layers} layers × {c.n_heads} heads, {c.grid_hw[0]} × {c.grid_hw[1]} "
        f"patches of {c.patch_size} px; traced in batches of {BATCH} on {where}."
    )
    ui.chart(
        tv.distance_chart(frame, baseline, c.n_heads, title=f"{source}: mean attention distance", unit="pixels"),
        key="mad.chart.vision",
        file_name="mean_attention_distance_pixels",
    )
    st.caption(
        f"Each dot is one head, averaged over the pictures. Dashed: uniform attention over every token "
        f"({baseline:.1f} px with this recipe)."
    )
    with st.expander("Which recipe?"):
        st.markdown(RECIPE)
    ui.matrix_download(
        mean,
        [f"layer {i}" for i in range(c.n_layers)],
        [f"head {h}" for h in range(c.n_heads)],
        "mean_attention_distance_pixels.csv",
        key="mad.csv_vision",
    )
    if len(pictures) > 1:
        per = per_image.reshape(len(pictures), -1)
        ui.matrix_download(
            per,
            names,
            [f"L{layer} H{h}" for layer in range(c.n_layers) for h in range(c.n_heads)],
            "mean_attention_distance_per_picture.csv",
            label="Per picture (CSV)",
            key="mad.csv_vision_each",
        )


def text(url: ui.UrlState) -> None:
    st.header("Text models, in tokens")
    st.caption(
        "The same plot for a text model: Σ_j w_ij·|i − j| in tokens, averaged over the query tokens of "
        "each sentence and over the sentences."
    )
    source = st.selectbox(
        "Text model",
        list(dict.fromkeys([*ui.TEXT_MODEL_SUGGESTIONS, *tv.local_model_folders()])),
        key=url.key("text_model", ui.DEFAULT_TEXT_MODEL),
    )
    lines = st.text_area("Sentences, one per line", key=url.key("sentences", "\n".join(SENTENCES)), height=120)
    sentences = [s.strip() for s in lines.splitlines() if s.strip()]
    if not sentences:
        st.error("Type at least one sentence.")
        return
    model = ui.load_model(source)
    if model is None:
        return
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(problem)
        return
    frames, baselines = [], []
    for sentence in sentences[:64]:
        fitted = ui.run_safely(lambda s=sentence: tv.fit_to_model(model, s), "Sentence")
        trace = ui.run_safely(lambda f=fitted: ui.cached("text", source, f.text, None), "Sentence") if fitted else None
        if trace is None:
            continue
        frames.append(
            tv.derived(trace, ("distance", trace.main_stack, False), lambda t=trace: tv.distance_frame(t))["distance"]
        )
        baselines.append(tv.uniform_distance(trace))
    if not frames:
        return
    L, H = trace.n_layers, trace.n_heads
    mean = np.mean(np.stack([f.to_numpy() for f in frames]), axis=0).reshape(L, H)
    ui.chart(
        tv.distance_chart(
            vv.mad_frame(mean), float(np.mean(baselines)), H, title=f"{source}: mean attention distance", unit="tokens"
        ),
        key="mad.chart.text",
        file_name="mean_attention_distance_tokens",
    )
    st.caption(
        f"{len(frames)} sentence(s). Dashed: uniform attention over the tokens each query may see, averaged "
        "over the sentences. Per-sentence views are on the Text attention page."
    )
    ui.matrix_download(
        mean,
        [f"layer {i}" for i in range(L)],
        [f"head {h}" for h in range(H)],
        "mean_attention_distance_tokens.csv",
        key="mad.csv_text",
    )


main()
