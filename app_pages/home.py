"""Home: what each page teaches, with a link to it, and the smallest worked example computed live."""

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc

st.title("tformer: see inside Transformers")
st.markdown(
    "Type a sentence or upload a photo and watch a real model work: the **Q, K, V** of every head, "
    "attention weights per head and layer, positional encodings, Vision Transformer patches and how far "
    "each head looks. Every number on these pages is read from an actual forward pass. "
    "Every view can be shared: its settings are in the page's address."
)
NUMBERING = (
    "**Numbering, on every page:** tokens, layers and heads count from 0, as in the code and the trace "
    "(token 0 is [CLS], layer 0 the first layer, head 0 the first head); the components of a vector count "
    "from 1, as in the lecture's formulas (x₁, q₁, z₁)."
)
st.caption(NUMBERING)

# Each entry: page file, what it teaches. Links go through st.page_link so they follow the app's routing.
GUIDE = [
    (
        "app_pages/before_transformers.py",
        "Attention before Transformers",
        "Where the lectures start: the score functions (dot, cosine, bilinear, additive) side by side on two "
        "vectors you edit; attention pooling against mean pooling on a sentence you type (two small models "
        "trained on real movie-review sentences); an RNN translator's alignment beside the Transformer's.",
    ),
    (
        "app_pages/step_by_step.py",
        "Attention, step by step",
        "The lecture's worked example, editable: X, W^Q, W^K, W^V → Q, K, V → scores → scaling by 1/√d_k → "
        "softmax → Z, with causal and padding masks, several heads and W^O. Pick a query row to see every "
        "number of its computation. Also: Q, K, V given directly (PyTorch's scaled_dot_product_attention demo, "
        'checked against PyTorch), "tayo ay masaya", and the padding mask in PyTorch\'s conventions.',
    ),
    (
        "app_pages/positional.py",
        "Positional encoding",
        "Sinusoidal encodings for any size and base (10000, or 100 as in the lecture), the formula cell by cell, "
        "similarity between positions, and the learned position embeddings of a real model.",
    ),
    (
        "app_pages/inside_block.py",
        "Inside a block",
        "The rest of the encoder layer on a real model (MiniLM, the translator's encoder and decoder, a ViT): "
        "the block drawn as post-norm or pre-norm, one token's residual sums, LayerNorm's μ and σ², the "
        "feed-forward network's hidden units, checked against the model's next layer; the stream's size "
        "across layers; the lecture's LayerNorm example, editable.",
    ),
    (
        "app_pages/text_attention.py",
        "Text attention",
        "A real encoder (MiniLM, offline) or decoder-only model (SmolLM2, offline), or any BERT / RoBERTa / GPT-2 / "
        "Llama / Qwen from the hub: head view, heatmaps, which heads link two tokens, all layers × heads at once, "
        "Q/K/V, why a weight has its value, the query–key space, attention distance, next-token and masked-word "
        "predictions, and a continuation generated token by token with every head's attention.",
    ),
    (
        "app_pages/encoder_decoder.py",
        "Encoder-decoder",
        "Translation one token at a time (the bundled toy translator offline, or opus-mt / T5 / BART): the "
        "decoder's masked self-attention and its cross-attention over the source at every step, with a play "
        "button; the whole alignment; Q from the decoder, K and V from the encoder; teacher forcing.",
    ),
    (
        "app_pages/vision.py",
        "Vision Transformer",
        "Your photo cut into patches (N = HW/P²), the shapes through the patch embedding, each head's attention as "
        "heat over the picture for the class token or any patch you click, attention rollout, the top-5 classes, "
        "and the ViT paper's Fig. 7: embedding filters, position similarities, attention distance.",
    ),
    (
        "app_pages/attention_distance.py",
        "Mean attention distance",
        "How far every head of every layer looks, in pixels over many pictures (ViT, DeiT) or in tokens over many "
        "sentences (BERT, GPT-2), against uniform attention.",
    ),
    (
        "app_pages/inductive_bias.py",
        "Inductive bias",
        "Shift your picture by k pixels: the patch embeddings move with it (a strided convolution), the attention "
        "and the class probabilities do not simply follow (learned positions). With numbers, for DeiT.",
    ),
    (
        "app_pages/mae.py",
        "Masked autoencoder",
        "75 % of your picture's patches masked at random; with an MAE checkpoint, what the decoder rebuilds and "
        "the error per patch.",
    ),
    (
        "app_pages/detr.py",
        "DETR: detection",
        "With a DETR checkpoint: each object query's box and class, where it looks in the picture, and how the "
        "queries attend to each other.",
    ),
    (
        "app_pages/train.py",
        "Train a Transformer",
        "Train a small Transformer classifier (movie sentences) or a tiny ViT (digits) here, watch its curves and "
        "its heads form epoch by epoch, then open it in the other pages (for you only).",
    ),
]

for page, title, teaches in GUIDE:
    with st.container(border=True):
        st.page_link(page, label=f"**{title}**")
        st.caption(teaches)

st.subheader("Attention in one example")
st.latex(r"Z = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right)V,\quad Q = XW^Q,\ K = XW^K,\ V = XW^V")
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
