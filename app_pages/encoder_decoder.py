"""Encoder-decoder: a translation token by token, the decoder's masked self-attention and its cross-attention.

Read widgets -> ask the views (tformer_views.seq2seq) -> draw. The translation is computed once per
input (results.result); the step slider, the play button and every layer / head choice only read it.
The encoder's self-attention uses the Text attention page's views (tformer_app.attention_panel); the decoding
steps are drawn by tformer_app.translation_steps.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import streamlit as st

from tformer_app import attention_panel as panel
from tformer_app import derived_views, downloads, models, presenter, results, score_sources_panel
from tformer_app import translation_steps as steps
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState, int_key
from tformer_app.widgets import choose_model
from tformer_core.bundled import BUNDLED_MODELS, model_card
from tformer_core.models.base import TracedModel
from tformer_views import seq2seq as sv
from tformer_views.charts.spec import cell_px, heatmap
from tformer_views.tokens import display_tokens

DEFAULT_MODEL = "translator"
SUGGESTIONS = ("translator", "Helsinki-NLP/opus-mt-en-de", "t5-small", "facebook/bart-base")


INTRO = (
    "The encoder reads the whole source sentence once; the decoder writes the translation one token at a "
    "time, looking back at what it wrote (masked self-attention) and at the source (cross-attention: its "
    "queries come from the decoder, its keys and values from the encoder's output)."
)


def main() -> None:
    run_page("Encoder-decoder: translation and cross-attention", INTRO, "s2s", page)


def choose_seq2seq(url: UrlState) -> tuple[str, TracedModel | None]:
    """The model picker; None (with a message) until an encoder-decoder model is loaded."""
    source = choose_model(
        url,
        SUGGESTIONS,
        DEFAULT_MODEL,
        placeholder="e.g. Helsinki-NLP/opus-mt-en-fr or ./models/my-t5",
        kinds=("encoder-decoder",),
        help="translator is trained by this project and works offline (a toy English → Tarish). "
        "Hub models need the internet the first time.",
    )
    model = models.load_model(source)
    if model is None:
        st.info("Choose another model above; the rest of the page appears once one loads.")
        return source, None
    if model.kind != "encoder-decoder":
        page_name = "Vision Transformer" if model.kind == "vit" else "Text attention"
        st.warning(f"**{escape(source)}** is not an encoder-decoder model: open the {page_name} page.")
        return source, None
    return source, model


def translation_inputs(url: UrlState, source: str) -> results.Request[sv.Translation] | None:
    """The source sentence, the token limit and the optional target; returns the cache request of the translation."""
    default_text = sv.DEFAULT_SOURCES.get(source, "")
    text_key = url.key("text", default_text)
    if st.session_state[text_key] in sv.DEFAULT_SOURCES.values() and default_text:
        st.session_state[text_key] = default_text  # another model's example: this model's instead
    left, right = st.columns([3, 1])
    text = left.text_input("Source sentence", key=text_key)
    max_new = right.number_input(
        "At most this many new tokens", 1, sv.MAX_NEW_TOKENS, key=int_key(url, "max", 40, 1, sv.MAX_NEW_TOKENS)
    )
    target = st.text_input(
        "Target (optional): type a translation to see the attention for it instead of the model's own",
        key=url.key("target", ""),
        help="Teacher forcing: the decoder reads your target one token at a time, "
        "as in training, and you see its attention at every step.",
    )
    if not text.strip():
        st.error("The source sentence is empty: type a sentence to translate.")
        return None
    if target.strip():
        return results.teacher_forced(source, text, target)
    return results.translation(source, text, int(max_new))


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, sentence, target, decoder layer and head")
    with settings if settings is not None else contextlib.nullcontext():
        source, model = choose_seq2seq(url)
        key = None if model is None else translation_inputs(url, source)
    if model is None:
        return
    translation = run_safely(lambda: results.result(key), "Input") if key else None
    if key is None or translation is None:
        show_vocabulary(model, source)
        return
    if settings is None:
        show_translation(key, translation)  # the translation first: the page's key idea on its first screen
        show_vocabulary(model, source)
    else:  # presenter mode: the translation in one line above the steps the keys move through
        presenter.idea(f"**{escape(translation.output_text or '(nothing)')}** ← “{escape(str(url.value('text')))}”")
    if translation.n_steps == 0:
        return
    trace = translation.trace
    L, H = trace.layers_in("decoder"), trace.n_heads
    c1, c2, _ = (settings if settings is not None else st).columns([1, 1, 2])
    layer = int(c1.selectbox("Decoder layer", list(range(L)), key=url.key("layer", L - 1, choices=range(L))))
    head = int(c2.selectbox("Head", list(range(H)), key=url.key("head", 0, choices=range(H))))
    steps.step_keys(url, translation.n_steps, L, H)
    steps.step_through(url, translation, layer, head)
    if settings is not None:
        show_translation(key, translation)
        show_vocabulary(model, source)
    show_alignment(translation, layer, head)
    show_cross_attention(url, key, translation, layer, head)
    st.header("The encoder's self-attention")
    st.caption("The same views as on the Text attention page, for the encoder reading the source sentence.")
    enc = panel.controls(
        url, trace, stack="encoder", prefix="enc_", default_views=("heatmap", "overview"), label="encoder ", keys=False
    )
    panel.draw(panel.Shown(key, trace, _rerun(key, translation)), url, enc, label="encoder ")


def _rerun(key: results.Request[sv.Translation], translation: sv.Translation) -> score_sources_panel.Rerun:
    """The translation's teacher-forced pass again: the source sentence and the decoder's input ids."""
    return score_sources_panel.Rerun(key.source, (key.args[0], translation.decoder_ids))


def show_cross_attention(
    url: UrlState, key: results.Request[sv.Translation], translation: sv.Translation, layer: int, head: int
) -> None:
    """Q, K, V and "why this weight" of the cross-attention, for the position that wrote the step's token; its
    sources are split from the translation's cached trace (`key`), the remove button reruns the pass."""
    cross = panel.Controls(
        stack="cross",
        prefix="x_",
        layer=layer,
        head=head,
        hide=False,
        views=(),
        query=steps.current_step(url, translation) - 1,
        shown=np.arange(translation.n_steps + 1),
        window=slice(None),
    )
    panel.draw_qkv(translation.trace, url, cross, label="cross-attention, ")
    rerun = _rerun(key, translation)
    panel.draw_why(translation.trace, url, cross, "cross-attention, ", rerun, sources_opt_in=True, cached=key)
    # Off by default: a Plotly chart on every step change would slow the page a class steps through.
    if st.toggle("Query–key space of the cross-attention (decoder queries, encoder keys)", key=url.key("x_qk", False)):
        panel.draw_qk(translation.trace, url, cross, label="cross-attention, ")


def show_vocabulary(model: TracedModel, source: str) -> None:
    lexicon = sv.vocabulary(model)
    if lexicon is None:
        return
    with st.expander("What the translator understands: its whole vocabulary"):
        st.markdown(
            "Tarish is a toy language with another word order than English: subject, object, then verb; "
            "the noun first, then its adjectives (in mirrored order), then the determiner; postpositions; "
            "and two particles with no English word, **ga** after the subject and **wo** after the object. "
            "Words it does not know become **\\<unk\\>**."
        )
        rows = [(name, en, ta) for name, pairs in lexicon for en, ta in pairs]
        st.dataframe(pd.DataFrame(rows, columns=["class", "English", "Tarish"]), hide_index=True, height=260)
    if source in BUNDLED_MODELS:
        with st.expander("Model card"):
            st.markdown(model_card(source))


def show_translation(key: results.Request[sv.Translation], translation: sv.Translation) -> None:
    st.subheader("Translation" if translation.mode == "greedy" else "Your target (teacher forcing)")
    st.code(translation.output_text or "(nothing)", language=None)
    n = translation.n_steps
    if translation.mode == "greedy":
        end = "it wrote the end token" if translation.finished else "it reached the token limit before the end token"
        st.caption(f"Greedy decoding: the most likely token at each of {n} steps; {end}.")
    else:
        agree = derived_views.teacher_agreement(key)  # once per translation, not on every step change
        st.caption(
            f"The decoder read your target token by token ({n} steps). The model's own most likely token "
            f"agrees with it at {agree} of {n} steps."
        )
    if translation.unknown_words:
        words = ", ".join(escape(w) for w in translation.unknown_words)
        st.warning(
            f"Not in this model's vocabulary: {words}. Each is read as **\\<unk\\>** (visible in the tokens below)."
        )
    st.caption("Source tokens: " + " · ".join(escape(t) for t in display_tokens(translation.source_tokens)))
    st.caption("Decoder tokens: " + " · ".join(escape(t) for t in display_tokens(translation.decoder_tokens)))


def show_alignment(translation: sv.Translation, layer: int, head: int) -> None:
    st.header("Alignment: the whole cross-attention")
    st.caption(
        "Rows: the token each decoder position wrote; columns: the source tokens. A bright cell means the "
        "position that wrote that token looked at that source token. Word order differs between the "
        "languages, so a good alignment is not the diagonal."
    )
    left, right = st.columns(2)
    for column, which, title in (
        (left, head, f"layer {layer}, head {head}"),
        (right, None, f"layer {layer}, mean of the heads"),
    ):
        with column:
            m = sv.alignment(translation, layer, which)
            downloads.chart(
                heatmap(
                    m.weights,
                    m.query_labels,
                    m.key_labels,
                    domain=(0.0, 1.0),
                    row_title="target (written)",
                    col_title="source",
                    title=f"cross-attention, {title}",
                    cell_size=cell_px(max(len(m.query_labels), len(m.key_labels)), 250),  # half of a projector
                ),
                key=f"s2s.chart.align_{'mean' if which is None else 'head'}",
                file_name=f"alignment_L{layer}_{'mean' if which is None else f'H{head}'}",
            )
            downloads.matrix_download(
                m.weights,
                m.query_labels,
                m.key_labels,
                f"alignment_L{layer}_{'mean' if which is None else f'H{head}'}.csv",
                key=f"s2s.csv_align_{'mean' if which is None else 'head'}",
            )


main()
