"""Home: how to start, for a lecturer (present, a deck, a class session), a student (join, a sentence, a photo) and
a notebook (the core in three lines), with the three pages to start with, all on the first screen of a 1280 x 720
projector; below it, one click away, what every page teaches and the smallest worked example computed live.

Nothing here loads a model (Home is the page a whole class opens at once). The pictures are screenshots of the app
(assets/home/, made by tools/home_pictures.py); the labels quoted are the sidebar's own (a test checks them).
"""

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import presenter
from tformer_app.home import INSTALL, PICTURES, SNIPPET, START, Picture

NUMBERING = (
    "**Numbering, on every page:** tokens, layers and heads count from 0, as in the code and the trace "
    "(token 0 is [CLS], layer 0 the first layer, head 0 the first head); the components of a vector count "
    "from 1, as in the lecture's formulas (x₁, q₁, z₁)."
)
# The lecturer's three steps: (picture, what to do). The words in italics are the sidebar's own labels.
LECTURER = (
    (
        "present",
        "**Present:** **Shift+P** or the sidebar's *Presenter mode*. **← → ↑ ↓** step the view, "
        "**Page Up / Down** the slides.",
    ),
    ("deck", "**Build a deck:** the sidebar's *Slides* → *Add this view* on each view, then *Present from slide 1*."),
    (
        "class",
        "**Start a class:** the sidebar's *Class session* → *Start a class session*: a code and QR for the room.",
    ),
)
STUDENT_JOIN = "**Join:** scan the QR on the projector, or type its code in the sidebar's *Class session*."
# Each entry: page file, what it teaches, in the words of docs/pages.md (its table of pages; a test keeps them equal).
# Links go through st.page_link so they follow the app's routing.
GUIDE = [
    (
        "app_pages/before_transformers.py",
        "Attention before Transformers",
        "the score functions side by side on two vectors you edit (dot, scaled dot, cosine, bilinear aᵀWb, "
        "additive vᵀtanh(W₁a + W₂b)) with every intermediate number (numbers up to 1e100 in size, so that no "
        "product overflows float64: a larger or infinite one is named with its place and the limit); "
        "attention pooling for classification (a score per word, softmax, c = Σ α_j h_j) against mean "
        "pooling, two small models trained by this project on real labelled movie-review sentences, α over "
        "your sentence and both predictions; an RNN encoder-decoder (bidirectional GRU) with Bahdanau's "
        "additive or Luong's dot / bilinear attention, its alignment α per output word beside the Transformer"
        " translator's cross-attention on the same sentence",
    ),
    (
        "app_pages/step_by_step.py",
        "Attention, step by step",
        "the lecture's worked example, editable: X, W^Q, W^K, W^V → Q, K, V → QKᵀ → ÷√d_k → softmax → Z; masks, "
        "several heads and W^O; one query row with every number; Q, K, V given directly (PyTorch's "
        '`scaled_dot_product_attention` demo, checked against PyTorch), "tayo ay masaya", the padding mask in '
        "PyTorch's conventions",
    ),
    (
        "app_pages/positional.py",
        "Positional encoding",
        "sinusoidal encodings (any size, base 10000 or 100), the formula cell by cell, similarity by offset, x + "
        "PE on a real sentence, learned vs sinusoidal positions; rotary embeddings (RoPE), opened on request "
        "(they load SmolLM2), with smollm2's own frequencies: θ_i and wavelengths, one pair turned to a position "
        "(the rotation matrix in numbers), q·k after RoPE depending on the offset only",
    ),
    (
        "app_pages/inside_block.py",
        "Inside a block",
        "the rest of the layer on a real model (MiniLM, the translator's encoder and decoder, a ViT, SmolLM2): "
        "the block drawn post-norm or pre-norm from the config, one token's residual sums, LayerNorm's μ, σ², x̂,"
        " γ, β (or RMSNorm), the FFN's hidden units before and after the activation, checked against the model's "
        "next-layer input; the residual stream's size across layers; the lecture's LayerNorm example, editable",
    ),
    (
        "app_pages/text_attention.py",
        "Text attention",
        "an encoder (MiniLM, offline; any BERT / RoBERTa / DistilBERT / XLM-R) or a decoder-only model "
        "(SmolLM2-135M, offline; GPT-2, Llama, Mistral, Qwen): head view, heatmaps, which heads link two tokens, "
        "all layers × heads, Q/K/V (with the key/value head a grouped-query head reads), why a weight has its "
        "value, query–key space (PCA, 2-D / 3-D), attention distance; a second sentence beside the first (the "
        "same head on both, and their difference where the tokens line up); masked-word and next-token top 5 after "
        "every position; a continuation, written when asked (greedy, or sampled with temperature, top-k and a "
        "seed), stepped through token by token with the new token's attention in every layer and head; a "
        "classifier's labels and its first token's attention; attention sinks and massive activations (the share "
        "of attention on the first token, [CLS] and [SEP] per layer × head, each layer's largest activation against "
        "its median, and a knockout of either with the prediction before and after); any other architecture "
        "transformers implements, weights only; the routes to the prediction from one pass (opened on request, up "
        "to 64 tokens): each edge's share of its update (Ferrando & Voita 2024), pruned by a threshold, a click on "
        "an edge opening its head",
    ),
    (
        "app_pages/encoder_decoder.py",
        "Encoder-decoder",
        "the bundled toy translator (offline) or opus-mt / T5 / BART: translation step by step with a play "
        "button, masked self-attention and cross-attention per step, alignment, cross-attention Q/K/V, teacher "
        "forcing",
    ),
    (
        "app_pages/vision.py",
        "Vision Transformer",
        "your picture in patches (N = HW/P²), embedding shapes, each head's attention as heat over the picture "
        "(class token or any patch you click), rollout, top 5 classes, the ViT paper's Fig. 7, high-norm tokens "
        "and registers, how information flows to the class token (the flow's rollout over the picture, layer by "
        "layer, and the edges that carry most of it); patch embedding by hand (the lecture's 8×8 image and two "
        "4×4 kernels, every product sum, equal to flattening times a matrix) and on one patch of your picture",
    ),
    (
        "app_pages/attention_distance.py",
        "Mean attention distance",
        "how far every head looks, in pixels over many pictures and in tokens over many sentences (at most 64 per"
        " request)",
    ),
    (
        "app_pages/inductive_bias.py",
        "Inductive bias",
        "your picture rolled k pixels sideways through DeiT-Tiny (offline: vit-tiny): for shifts by whole "
        "patches every patch embedding is the same vector moved (difference printed), while the class token's"
        " attention and the class probabilities change (learned positions); every shift from 0 to two patches"
        " in one chart",
    ),
    (
        "app_pages/mae.py",
        "Masked autoencoder",
        "opens offline on the bundled mae-tiny and a generated shape: a random 75 % of the patches masked (a "
        "seed chooses which), the decoder's reconstruction and the squared error per masked patch, the model's "
        "measured quality in one line; facebook/vit-mae-base online, or a local ViT-MAE folder, on any picture "
        "(a hub model that cannot be had: the masking alone)",
    ),
    (
        "app_pages/detr.py",
        "DETR: detection",
        "opens offline on the bundled detr-tiny and a generated scene of shapes; facebook/detr-resnet-50 "
        "online, or a local DETR folder: the object queries' boxes and classes, each query's cross-attention "
        "over the picture, the decoder's self-attention between the queries, the bundled model's measured "
        "quality in one line",
    ),
    (
        "app_pages/head_matters.py",
        "Does this head matter?",
        'offline defaults smollm2 ("The capital of France is" → Paris), translator, vit-tiny, minilm (two '
        "sentences' cosine similarity): the prediction; every head zero-ablated in batched passes (layers × "
        "heads grid of the drop); each head's direct share of the winning logit (pre-norm models; the final "
        "norm's divisor frozen); ablate a chosen head and see the number change; the logit lens (top output "
        "and the answer's rank after every layer); patching input B's residual stream into A (which layer × "
        "position carries the difference); induction heads on smollm2 (a repeated random sequence: each head's "
        "induction score, the loss on the second repeat vs the first, the top k induction heads ablated vs k "
        "random heads); on smollm2 the routes to the prediction from one pass (opened on request) beside each "
        "head's ablation",
    ),
    (
        "app_pages/train.py",
        "Train a Transformer",
        "train a small Transformer encoder classifier in the lectures' form (nn.MultiheadAttention, ReLU FFN,"
        " post-norm LayerNorm eps 1e-6) on the movie sentences, or a tiny ViT on handwritten digits; you pick"
        " layers, heads, d_model, epochs, seed (within limits); a progress bar, loss and accuracy curves and "
        "the attention on a fixed sentence / picture after every epoch; the test accuracy; the model then "
        "opens in the Text attention or Vision Transformer page, for your session only. One training runs at "
        "a time per server (a worker thread; the others wait, their place shown), cancellable; a training "
        "whose page is closed is dropped",
    ),
]


# The first screen's spacing a little tighter than a page's, so that all of it fits a 1280 x 720 projector.
HOME_CSS = """<style>
.st-key-home-first, .st-key-home-first [data-testid="stVerticalBlock"] { gap: 0.6rem; }
.st-key-home-first h1 { font-size: 2.25rem; padding-bottom: 0; }
.st-key-home-first h5 { padding: 0.5rem 0 0.15rem; }
.st-key-home-first [data-testid="stCode"] pre { margin: 0; }
.st-key-home-first [data-testid="stCode"] code { font-size: 0.8rem; }
.st-key-home-first [data-testid="stPageLink"] a { padding-left: 0; }
.st-key-home-first [data-testid="stPageLink"] * { white-space: normal; line-height: 1.35; }
</style>"""
# Presenter mode's large type (tformer_app.presenter) for what it leaves at its own size: the labels, links, code.
HOME_PRESENTER_CSS = """<style>
.st-key-home-first h5 { font-size: 30px; }
.st-key-home-first [data-testid="stPageLink"] p { font-size: 22px; }
.st-key-home-first [data-testid="stCode"] code { font-size: 20px; }
</style>"""


def picture(key: str) -> None:
    """One of Home's screenshots at its width (larger in presenter mode, as the type is)."""
    shown: Picture = PICTURES[key]
    # The PNG goes as it is (no width given to st.image, which would scale it down and encode it again): its box
    # sets the width, and a 2x screen gets every pixel.
    with st.container(width=round(shown.width * presenter.scale())):
        st.image(str(shown.path), width="stretch", output_format="PNG", alt=shown.alt)


def lecturer() -> None:
    st.markdown("##### :material/co_present: Lecturing")
    for column, (key, text) in zip(st.columns(len(LECTURER), gap="medium"), LECTURER):
        with column:
            st.markdown(text)
            picture(key)


def start_with() -> None:
    st.markdown("##### :material/flag: Start with")
    for column, page in zip(st.columns(len(START), gap="medium"), START):
        with column, st.container(horizontal=True, wrap=False, gap="small", vertical_alignment="center"):
            picture(page.picture)
            with st.container(gap=None):
                st.page_link(page.path, label=f"**{page.title}**")
                st.caption(page.opens_on)


def student() -> None:
    st.markdown("##### :material/school: In class")
    st.markdown(STUDENT_JOIN)
    st.page_link("app_pages/text_attention.py", label="Type a sentence: Text attention", icon=":material/keyboard:")
    st.page_link(
        "app_pages/vision.py",
        label="Upload a photo: Vision Transformer",
        icon=":material/add_photo_alternate:",
        query_params={"from": "upload"},
    )


def notebook() -> None:
    st.markdown("##### :material/terminal: From a notebook")
    st.caption("In the project's folder (the README's *Run the app*), then in Python:")
    st.code(INSTALL, language="bash", wrap_lines=True)
    st.code(SNIPPET, language="python", wrap_lines=True)


def first_screen() -> None:
    """What a lecturer, a student and a notebook user need first, and where to start: one 1280 x 720 screen."""
    st.html(HOME_CSS + (HOME_PRESENTER_CSS if presenter.presenting() else ""))
    with st.container(key="home-first"):
        st.title("tformer: see inside Transformers", anchor=False)
        lecturer()
        start_with()
        attend, code = st.columns([5, 7], gap="medium")
        with attend:
            student()
        with code:
            notebook()


def every_page() -> None:
    st.markdown(
        "Type a sentence or upload a photo and watch a real model work: the **Q, K, V** of every head, attention "
        "weights per head and layer, positional encodings, Vision Transformer patches and how far each head looks. "
        "Every number on these pages is read from an actual forward pass. Every view can be shared: its settings "
        "are in the page's address."
    )
    st.caption(NUMBERING)
    for page, title, teaches in GUIDE:
        with st.container(border=True):
            st.page_link(page, label=f"**{title}**")
            st.caption(teaches)
    st.subheader("What attention does not tell you", anchor=False)
    st.markdown(
        "A head's weights say where it looks, not whether the prediction needs what it finds there: a head may look "
        "hard at a token and change nothing (its output may be small, cancelled later, or unused by the head), "
        "while another with diffuse weights carries the answer. Ask the model instead: switch the head off and see "
        "what changes (**Does this head matter?**), or follow the gradient through the attention (relevancy) rather "
        "than the raw weights (rollout)."
    )


def worked_example() -> None:
    st.latex(
        r"Z = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right)V,\quad Q = XW^Q,\ K = XW^K,\ V = XW^V"
    )
    tokens = ["I", "love", "tea"]
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    steps = tc.attention_steps(X, np.eye(2), np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]))
    left, middle, right = st.columns(3)
    left.caption("Embeddings X (W^Q = W^K = I)")
    left.dataframe(pd.DataFrame(X, index=tokens, columns=["x₁", "x₂"]))
    middle.caption("Weights: softmax of each row of QKᵀ/√2")
    middle.dataframe(pd.DataFrame(steps.weights, index=tokens, columns=tokens).style.format("{:.3f}"))
    right.caption("Output Z = weights · V")
    right.dataframe(pd.DataFrame(steps.output, index=tokens, columns=["z₁", "z₂"]).style.format("{:.3f}"))


first_screen()
pages_tab, example_tab = st.tabs(["Every page, and what it teaches", "Attention in one example"])
with pages_tab:
    every_page()
with example_tab:
    worked_example()
