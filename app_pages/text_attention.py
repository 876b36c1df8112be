"""Text attention: every head of a real encoder (MiniLM, BERT, RoBERTa) or decoder-only model (GPT-2).

Read widgets -> ask the views (tformer_views) -> draw. One forward pass per input (caches.cached);
choosing a layer, head, token or view reuses the cached trace.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import attention_panel as panel
from tformer_app import caches
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, TEXT_MODEL_SUGGESTIONS, run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_views import text as tv
from tformer_views.tokens import display_tokens, plain_word

CAVEAT = """
**What attention weights do and do not tell you.** A weight says how much of a token's *value
vector* a head mixes into a query position in this layer. It is not, by itself, an explanation of
the model's output:

- What a head passes on is **weight × value**: a large weight on a token whose value vector is
  small (often [CLS], [SEP] or punctuation) moves little. "Why this weight" shows ‖v_j‖ and
  ‖w_j·v_j‖ beside each weight.
- Each layer adds its result to the **residual stream**, and later layers mix tokens again; after
  a few layers position *i* no longer holds only token *i*.
- Different attention patterns can give the same prediction: Jain & Wallace (2019, *Attention is
  not Explanation*) found attention often uncorrelated with gradient-based importance and
  swappable without changing the output; Wiegreffe & Pinter (2019, *Attention is not not
  Explanation*) showed it can still be informative when tested properly. Treat these pictures as
  what the model computed, not as why it decided.
"""


INTRO = (
    "Type a sentence and see what every attention head of a real model does with it. "
    "One forward pass per input; choosing a layer, head or token reuses it."
)


def main() -> None:
    run_page("Text attention", INTRO, "text", page)


def page(url: UrlState) -> None:
    source = choose_model(
        url,
        TEXT_MODEL_SUGGESTIONS,
        DEFAULT_TEXT_MODEL,
        placeholder="e.g. bert-base-cased or ./models/my-bert",
        help="minilm (all-MiniLM-L6-v2) is bundled and works offline. Hub models need the internet the first time.",
    )
    text = st.text_area("Sentence", key=url.key("text", tv.DEFAULT_SENTENCE), height=80)
    pair = st.text_input("Second segment (optional: BERT's sentence B, for pair inputs)", key=url.key("pair", ""))

    model = caches.load_model(source)
    if model is None:
        st.info("Choose another model above; the rest of the page appears once one loads.")
        return
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(escape(problem))
        return
    fitted = run_safely(lambda: tc.fit_to_model(model, text, pair), "Input")
    if fitted is None:
        return
    if pair.strip() and fitted.pair is None:
        st.caption("A decoder-only model reads one text: the second segment is ignored.")
    if fitted.n_dropped:
        st.info(
            f"The input has {fitted.n_tokens + fitted.n_dropped:,} tokens; this model reads at most "
            f"{fitted.max_tokens:,}, so the last {fitted.n_dropped:,} tokens were dropped"
            + (" (cut from the longer segment first)." if fitted.pair else ".")
        )
    key = ("text", source, fitted.text, fitted.pair)
    trace = run_safely(lambda: caches.cached(*key), "Input")
    if trace is None:
        return

    tokens = trace.tokens
    labels = display_tokens(tokens)
    d_head = trace.q(0, 0).shape[1]
    kind = "decoder-only (causal)" if trace.kind == "decoder" else "encoder (bidirectional)"
    st.caption(f"{kind} · {trace.n_layers} layers × {trace.n_heads} heads · d_head = {d_head} · {len(tokens)} tokens")

    it = next((i for i, token in enumerate(tokens) if plain_word(token).lower() == "it"), None)
    # A class sees the two views a lecture starts with; the others are one choice away (and in links).
    c = panel.controls(url, trace, default_query=it, default_views=("head", "heatmap", "search"))
    if trace.kind == "decoder":
        st.caption(
            "Causal mask: each token attends only to itself and the tokens before it; "
            "masked cells are grey in the heatmap and the overview."
        )
    show_predictions(trace, model, c.query, labels)
    panel.draw(panel.Shown(key, trace), url, c)
    with st.expander("What attention does and does not explain"):
        st.markdown(CAVEAT)


def show_predictions(trace: tc.Trace, model: tc.TracedModel, query: int, labels: list[str]) -> None:
    kind = tv.prediction_kind(trace)
    if kind == "next-token":
        st.subheader("Next token, top 5")
        left, right = st.columns(2)
        left.caption("after the whole input")
        left.dataframe(pd.DataFrame(tv.top_predictions(trace, 5), columns=["token", "probability"]), hide_index=True)
        if query != len(labels) - 1:
            right.caption(f"after position {query} ({escape(labels[query])}), as the model saw it there")
            right.dataframe(
                pd.DataFrame(tv.top_predictions(trace, 5, query), columns=["token", "probability"]), hide_index=True
            )
    elif kind == "masked-word":
        mask = tv.mask_token(model) or "[MASK]"
        positions = list(trace.meta.get("mask_positions") or [])
        st.subheader("Masked word, top 5")
        if not positions:
            st.info(f"Write {escape(mask)} in the sentence where a word should be guessed.")
        for position in positions[:3]:
            st.caption(f"{escape(mask)} at position {position}")
            st.dataframe(
                pd.DataFrame(tv.top_predictions(trace, 5, position), columns=["token", "probability"]), hide_index=True
            )
    elif trace.kind == "encoder":
        st.caption(
            "This checkpoint has no masked-word head (MiniLM is trained for sentence embeddings), "
            "so it makes no word predictions."
        )


main()
