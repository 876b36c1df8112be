"""Attention before Transformers: score functions, attention pooling for classification, and an RNN
encoder-decoder's alignment beside the Transformer translator's cross-attention.

Read widgets -> ask the core (tformer_core.scores) and the cached traces of the small bundled models
(results.small_trace) -> the views (tformer_views.early_attention) -> draw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import downloads, models, presenter, results, tables
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_core.bundled import model_card, recorded
from tformer_core.scores import default_parameters, score_functions
from tformer_views import early_attention as ea
from tformer_views import seq2seq as sv
from tformer_views.charts.spec import cell_px, heatmap

INTRO = (
    "Attention began before Transformers: a score for every word, a softmax over the scores, a weighted sum. "
    "Compare the score functions on two vectors, see which words a small classifier weighs (against plain "
    "averaging), and how an RNN translator aligns its output with its input."
)
MAX_DIM = 8
DEFAULT_SENTENCE = "A gorgeous, witty film, but the plot is thin and the ending falls flat."
SCORES = {"additive": "additive (Bahdanau)", "dot": "dot (Luong)", "bilinear": "bilinear (Luong's general)"}


def main() -> None:
    run_page("Attention before Transformers", INTRO, "early", page)


def page(url: UrlState) -> None:
    score_functions_section(url)
    pooling_section(url)
    rnn_section(url)


def parse_vector(text: str, what: str) -> np.ndarray:
    """ "1, 2, -0.5" -> array; ValueError naming the problem."""
    parts = [p for p in text.replace(";", ",").split(",") if p.strip()]
    if not parts:
        raise ValueError(f"{what} is empty: give numbers separated by commas, e.g. 1, 2")
    if len(parts) > MAX_DIM:
        raise ValueError(f"{what} has {len(parts)} numbers; at most {MAX_DIM} here")
    try:
        values = np.array([float(p) for p in parts])
    except ValueError:
        raise ValueError(f"{what} must be numbers separated by commas, e.g. 1, 2") from None
    return values  # infinite or too large numbers: the score functions name the entry and the limit


def _matrix_editor(label: str, default: np.ndarray, key: str) -> np.ndarray:
    frame = pd.DataFrame(default, columns=[str(j) for j in range(default.shape[1])])
    edited = tables.data_editor(st, frame, key=f"{key}@{default.shape}", hide_index=False)
    st.caption(label)
    values = edited.to_numpy(dtype=np.float64)
    return np.where(np.isnan(values), 0.0, values)  # an emptied cell; an infinite one is left for the core to name


def score_functions_section(url: UrlState) -> None:
    st.header("Score functions side by side")
    if not presenter.presenting():  # presenter mode says it on the line below the title
        st.caption(
            "How much should query a attend to key b? Each function gives a number; a softmax over the keys "
            "turns the numbers into weights. Edit the vectors and the learned parameters."
        )
    settings = presenter.settings_box("The vectors a and b")
    presenter.idea(
        "How much should a query attend to a key? Five score functions; a softmax turns scores into weights."
    )
    left, right = (settings if settings is not None else st).columns(2)
    a_text = left.text_input("a (the query, or the decoder's state)", key=url.key("a", "1, 2"))
    b_text = right.text_input("b (the key, or an encoder annotation)", key=url.key("b", "3, -1"))
    try:
        a, b = parse_vector(a_text, "a"), parse_vector(b_text, "b")
    except ValueError as error:
        st.error(escape(error))
        return
    if a.size != b.size:
        st.error(f"a has {a.size} numbers and b {b.size}: give them the same length.")
        return
    defaults = default_parameters(a.size, b.size)
    with st.expander("The learned parameters: W (bilinear), W₁, W₂ and v (additive)"):
        c1, c2, c3, c4 = st.columns(4)
        with c1:
            W = _matrix_editor("W [d × d]", defaults["W"], "early.W")
        with c2:
            W1 = _matrix_editor("W₁ [2 × d]", defaults["W1"], "early.W1")
        with c3:
            W2 = _matrix_editor("W₂ [2 × d]", defaults["W2"], "early.W2")
        with c4:
            v = _matrix_editor("v [2]", defaults["v"][None, :], "early.v")[0]
    steps = run_safely(lambda: score_functions(a, b, W=W, W1=W1, W2=W2, v=v), "Score functions")
    if steps is None:
        return
    downloads.table(ea.score_table(steps), digits=4, key="early.scores")
    st.caption(
        "The dot product grows with the vectors' lengths; the cosine keeps the angle only; scaling by √d "
        "keeps a dot product's spread the same as d grows; bilinear and additive scores learn what to "
        "compare (W, W₁, W₂, v are trained with the rest of the model)."
    )


def pooling_section(url: UrlState) -> None:
    st.header("Attention pooling for classification")
    st.caption(
        "Each word → a vector h_j → a small network gives a score s_j → softmax over the words gives "
        "α_j → the sentence is c = Σ α_j h_j → a classifier. The twin model averages instead "
        "(α_j = 1/n). Both were trained by this project on 7,899 movie-review sentences labelled by "
        "people (see the model cards)."
    )
    text = st.text_input("A sentence about a film", key=url.key("sentence", DEFAULT_SENTENCE))
    att_model = models.load_model("sentiment-attention")
    if att_model is None or models.load_model("sentiment-mean") is None:
        return
    words = run_safely(lambda: ea.pooling_input(att_model, text), "Sentence")
    if words is None:
        return
    att = results.result(results.small_trace("sentiment-attention", words))
    mean = results.result(results.small_trace("sentiment-mean", words))
    unknown = att_model.tokenizer.unknown_words(text) if att_model.tokenizer is not None else ()
    p = ea.compare_pooling(att, mean, unknown)
    left, right = st.columns(2)
    for column, name, prediction in ((left, "attention", p.attention_prediction), (right, "mean", p.mean_prediction)):
        figures = recorded(f"sentiment-{name}")["evaluation"]
        label, probability = prediction[0]
        column.metric(
            f"{name} pooling says",
            f"{label} ({probability:.0%})",
            help=f"test accuracy {figures['test_accuracy']:.1%} on {figures['test_sentences']:,} sentences",
        )
        column.caption(
            f"Test accuracy of {name} pooling: {figures['test_accuracy']:.1%} "
            f"({figures['test_sentences']:,} held-out sentences)."
        )
    if p.unknown:
        st.info("Not in the vocabulary, read as <unk>: " + escape(", ".join(p.unknown)))
    downloads.chart(ea.weights_chart(p), "early.pooling", "attention_pooling_weights")
    downloads.table(p.frame(), digits=4, key="early.pooling_table")
    with st.expander("Model cards"):
        st.markdown(model_card("sentiment-attention"))
        st.markdown(model_card("sentiment-mean"))


def rnn_section(url: UrlState) -> None:
    st.header("An RNN encoder-decoder with attention")
    st.caption(
        "A bidirectional GRU reads the source into annotations h_j; at every output step m the decoder "
        "scores each h_j, softmaxes the scores into α_mj and reads c_m = Σ α_mj h_j. Trained by this "
        "project on the translator's toy English → Tarish; beside it, the Transformer translator's "
        "cross-attention on the same sentence."
    )
    left, right = st.columns([3, 1])
    text = left.text_input("Source sentence", key=url.key("source", sv.DEFAULT_SOURCES["translator"]))
    score = str(
        right.selectbox(
            "Score",
            list(SCORES),
            format_func=lambda s: SCORES.get(s, s),
            key=url.key("score", "additive", choices=list(SCORES)),
        )
    )
    name = f"rnn-{score}"
    if models.load_model(name) is None or models.load_model("translator") is None:
        return
    trace = run_safely(lambda: results.result(results.small_trace(name, text)), "Source sentence")
    translation = run_safely(lambda: results.result(results.translation("translator", text, 40)), "Source sentence")
    if trace is None or translation is None:
        return
    rnn = ea.rnn_alignment(trace)
    L, H = translation.trace.layers_in("decoder"), translation.trace.n_heads
    c1, c2 = st.columns(2)
    layer = c1.selectbox(
        "Translator's decoder layer", list(range(L)), key=url.key("layer", L - 1, choices=list(range(L)))
    )
    head = c2.selectbox(
        "Translator's head",
        [-1, *range(H)],
        format_func=lambda h: "mean of the heads" if h < 0 else str(h),
        key=url.key("head", -1, choices=[-1, *range(H)]),
    )
    cross = sv.alignment(translation, layer, None if head < 0 else head)
    figures = recorded(name)["evaluation"]
    st.caption(
        f"RNN ({escape(SCORES[score])}): **{escape(' '.join(w for w in rnn.query_labels if w != '<eos>'))}** · "
        f"Transformer: "
        f"**{escape(translation.output_text)}**. On {figures['held_out_sentences']} held-out sentences the "
        f"RNN translates {figures['held_out_exact_match']:.1%} exactly and puts its largest α on the right "
        f"source word for {figures['alignment_accuracy']:.1%} of the words."
    )
    alignment_charts(rnn, cross, score, layer, head)
    same, rows = ea.argmax_agreement(rnn.weights, cross.weights)
    st.caption(f"The two put their largest weight on the same source word for {same} of {rows} output words.")


def alignment_charts(rnn, cross, score: str, layer: int, head: int) -> None:
    """The RNN's alpha and the translator's cross-attention side by side, on one colour scale."""
    left, right = st.columns(2)
    px = cell_px(max(len(rnn.key_labels), len(rnn.query_labels), 1), 420)
    with left:
        spec = heatmap(
            rnn.weights,
            rnn.query_labels,
            rnn.key_labels,
            f"RNN α ({SCORES[score]})",
            row_title="output word",
            col_title="source word",
            domain=(0.0, 1.0),
            cell_size=px,
        )
        downloads.chart(spec, "early.rnn", "rnn_alignment")
    with right:
        title = f"Transformer cross-attention, layer {layer}, " + ("mean of the heads" if head < 0 else f"head {head}")
        spec = heatmap(
            cross.weights,
            cross.query_labels,
            cross.key_labels,
            title,
            row_title="output word",
            col_title="source word",
            domain=(0.0, 1.0),
            cell_size=px,
        )
        downloads.chart(spec, "early.cross", "transformer_cross_attention")


main()
