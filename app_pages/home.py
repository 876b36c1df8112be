"""Home: what tformer shows, and the lecture's smallest worked example computed live by the core."""

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc

st.title("tformer: see inside Transformers")
st.markdown(
    "Type a sentence or upload a photo and watch a real model work: the **Q, K, V** of every head, "
    "attention weights per head and layer, positional encodings, Vision Transformer patches and how far "
    "each head looks. Every number on these pages is read from an actual forward pass."
)

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
