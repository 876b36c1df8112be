"""The Positional encoding page's real-model part: x + PE on a sentence the user types (the default text model's
token, learned position and segment embeddings, and the sinusoidal table beside them), and the model's learned
positions against the sinusoidal table. Streamlit drawing only: the numbers come from
tformer_views.lessons.positional and the core.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_views.charts.spec import unique_labels
from tformer_views.lessons import positional as lp

from . import downloads, models, results
from .page import DEFAULT_TEXT_MODEL, run_safely
from .url import UrlState, int_key

MODEL = DEFAULT_TEXT_MODEL
DEFAULT_SENTENCE = "The cat sat on the mat."


def real_sections(url: UrlState, base: float) -> str:
    """The real sentence's parts and the learned positions; returns the sentence (the rotary part uses it)."""
    st.subheader(f"x + PE on a real sentence ({MODEL})")
    st.caption(
        f"{MODEL} is BERT-like: its positions are **learned** vectors (one trained row per position), added to the "
        "token embeddings together with a segment embedding; LayerNorm then gives layer 0's input. The "
        "original Transformer instead adds the fixed **sinusoidal** table (scaling the token embedding by √d first)."
    )
    left, right = st.columns([3, 1])
    sentence = left.text_input("Sentence", key=url.key("text", DEFAULT_SENTENCE))
    n_dims = right.number_input("Dims shown", 1, 32, key=int_key(url, "xdims", 5, 1, 32))
    model = models.load_model(MODEL)
    if model is None:
        return sentence
    if not sentence.strip():
        st.error("Type a sentence.")
    else:
        trace = run_safely(lambda: results.result(results.text_trace(MODEL, sentence)), "Sentence")
        parts = run_safely(lambda: lp.embedding_sum(trace, base), "Embeddings") if trace is not None else None
        if parts is not None:
            show_embedding_parts(parts, int(n_dims), base)
    show_learned_vs_sinusoidal(url, model, base)
    return sentence


def show_embedding_parts(parts: lp.EmbeddingSum, n_dims: int, base: float) -> None:
    tokens = unique_labels(parts.tokens)  # a sentence may repeat a word
    dims = [str(j) for j in range(n_dims)]
    d_model = parts.tok.shape[1]
    st.caption(f"First {n_dims} of {d_model} dimensions.")
    views = [
        ("token embedding", parts.tok, "E[token]: the word's own vector, the same at every position."),
        ("learned position", parts.pos, "P[pos]: the model's trained row for each position."),
        ("segment", parts.segment, "The segment (sentence A) embedding: the same row for every token here."),
        ("sum (before LayerNorm)", parts.total, "E + P + segment: what LayerNorm turns into layer 0's input."),
        (
            f"sinusoidal PE (base {base:g})",
            parts.sinusoidal,
            f"What the original Transformer would add at d = {d_model} (not used by this model).",
        ),
        ("token + sinusoidal", parts.tok_plus_sinusoidal, "E + PE: the sum with the sinusoidal table instead."),
    ]
    for row in range(0, len(views), 2):
        for column, (name, matrix, what) in zip(st.columns(2), views[row : row + 2]):
            with column:
                st.markdown(f"**{name}**")
                st.caption(what)
                frame = pd.DataFrame(matrix[:, :n_dims], index=pd.Index(tokens, name=name), columns=dims)
                st.dataframe(frame.style.format("{:.4f}"))
                downloads.matrix_download(
                    matrix,
                    tokens,
                    [str(j) for j in range(d_model)],
                    f"{name.split(' (')[0].replace(' ', '_')}.csv",
                    key=f"pe.csv.x.{row}.{name}",
                )
    st.markdown("**Lengths of the vectors** (all dimensions): how strongly each part pulls on the sum.")
    norms = parts.norms()
    norms.index = pd.Index(tokens, name="length")
    st.dataframe(norms.style.format("{:.3f}"))
    st.caption(
        f"Every sinusoidal row has length √(d/2) = {np.sqrt(d_model / 2):.2f}, far longer than these "
        "token embeddings: added as is, it would drown them. The original Transformer multiplies the "
        f"token embedding by √d = {np.sqrt(d_model):.1f} first; a learned table is simply trained at "
        "the right scale."
    )


def show_learned_vs_sinusoidal(url: UrlState, model: tc.TracedModel, base: float) -> None:
    st.subheader("Learned vs sinusoidal positions")
    max_pos = min(model.max_tokens or lp.MAX_PE_POSITIONS, lp.MAX_PE_POSITIONS)
    n = st.slider("Positions", 2, max_pos, key=int_key(url, "learned", 64, 2, max_pos))
    learned = run_safely(lambda: lp.learned_positions(model, n), "Learned positions")
    if learned is None:
        return
    d_model = learned.shape[1]
    sinus = tc.sinusoidal_encoding(n, d_model, base)
    halves = (
        ("Learned", f"{MODEL}, d = {d_model}", learned, "Learned position embeddings", "learned", "learned_pe"),
        (
            "Sinusoidal",
            f"base {base:g}, d = {d_model}",
            sinus,
            "Sinusoidal PE",
            "sinusoidal",
            "sinusoidal_pe_model_size",
        ),
    )
    for column, (name, about, table, title, kind, file_key) in zip(st.columns(2), halves):
        with column:
            st.markdown(f"**{name}** ({about})")
            downloads.big_heatmap(table, title, "position", "dimension", file_key, width=340)
            downloads.big_heatmap(
                lp.similarity(table, "cosine"),
                f"Cosine similarity, {kind}",
                "position p",
                "position q",
                f"{kind}_cosine",
                square=True,
                width=340,
            )
    st.caption(
        "Both give nearby positions similar vectors (the dark band along the diagonal). The sinusoidal band has "
        "the same shape on every row (it depends only on the offset); the learned one need not, and it only "
        f"exists for the {model.max_tokens} positions the model was trained with."
    )
