"""Text attention: every head of a real encoder (MiniLM, BERT, RoBERTa) or decoder-only model (SmolLM2, GPT-2).

Read widgets -> ask the views (tformer_views) -> draw. One forward pass per input (results.result);
choosing a layer, head, token or view reuses the cached trace. A decoder-only model also continues the
text when asked (greedy or sampled, once per prompt and settings: results.continuation(...)), and the
step slider shows each new token's attention in every layer and head from that cached result. A sequence
classifier shows its labels and where its first token looked.
"""

from __future__ import annotations

import contextlib
from typing import Any

import streamlit as st

import tformer_core as tc
from tformer_app import attention_panel as panel
from tformer_app import class_session, compare, flow_panel, lecture, models, outputs, presenter, results, sinks_panel
from tformer_app.markdown import escape
from tformer_app.page import (
    DECODER_MODEL_SUGGESTIONS,
    DEFAULT_DECODER_MODEL,
    DEFAULT_TEXT_MODEL,
    TEXT_MODEL_SUGGESTIONS,
    run_page,
    run_safely,
)
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model, kind_of, short_name
from tformer_views import class_questions
from tformer_views import text as tv
from tformer_views.tokens import display_tokens, plain_word, text_changes

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

# The two kinds of text model the page offers, each with its own default model (the choice is in the link).
ARCHITECTURES = {"encoder": "Encoder", "decoder": "Decoder-only"}
DEFAULT_MODELS = {"encoder": DEFAULT_TEXT_MODEL, "decoder": DEFAULT_DECODER_MODEL}
SUGGESTIONS = {
    "encoder": tuple(m for m in TEXT_MODEL_SUGGESTIONS if m not in DECODER_MODEL_SUGGESTIONS),
    "decoder": DECODER_MODEL_SUGGESTIONS,
}
MODEL_HELP = {
    "encoder": "minilm (all-MiniLM-L6-v2) is bundled and works offline. Hub models need the internet the first time.",
    "decoder": "smollm2 (SmolLM2-135M-Instruct, Llama-style: RoPE, grouped-query attention) is bundled and works "
    "offline. Hub models need the internet the first time.",
}
PATHS = {
    "tformer": "every Q, K, V and weight recorded.",
    "transformers": "transformers' own code runs this architecture (eager attention): the views show its "
    "attention weights and hidden states, not the Q, K and V they came from.",
}


def main() -> None:
    run_page("Text attention", INTRO, "text", page)


def choose_architecture(url: UrlState) -> str:
    """Encoder or decoder-only, in the link as "arch"; choosing one loads its default model. A link that names
    a decoder-only model (smollm2, gpt2, a decoder among the server's folders) and no "arch" opens on the
    decoder side."""
    linked = short_name(str((url.incoming or {}).get("model", "")).strip())
    decoder = linked in DECODER_MODEL_SUGGESTIONS or kind_of(linked) == "decoder"
    key = url.key("arch", "decoder" if decoder else "encoder", choices=list(ARCHITECTURES))

    def switched() -> None:
        model = DEFAULT_MODELS[st.session_state[key]]
        url.set("model", model)
        st.session_state[f"{url.page}.model_choice"] = model

    arch = st.radio(
        "Kind of model",
        list(ARCHITECTURES),
        key=key,
        format_func=ARCHITECTURES.get,
        horizontal=True,
        label_visibility="collapsed",
        on_change=url.callback(switched),
        help="An encoder (BERT, MiniLM) lets every token see every other one; a decoder-only model (GPT-2, "
        "SmolLM2) lets each token see only the tokens before it, and predicts the next one.",
    )
    return str(arch)


def traced(settings: Any, url: UrlState) -> tuple[str, Any, Any, results.Request[tc.Trace], tc.Trace] | None:
    """(source, model, fitted text, cache request, trace) for the page's inputs, or None with the reason shown."""
    with settings if settings is not None else contextlib.nullcontext():
        source, text, pair = inputs(url)
    model = models.load_model(source)
    if model is None:
        st.info("Choose another model above; the rest of the page appears once one loads.")
        return None
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(escape(problem))
        return None
    fitted = run_safely(lambda: tv.fit_text(model, text, pair), "Input")
    if fitted is None:
        return None
    if pair.strip() and fitted.pair is None:
        st.caption("A decoder-only model reads one text: the second segment is ignored.")
    say_what_was_dropped(model, fitted)
    key = results.text_trace(source, fitted.text, fitted.pair)
    trace = run_safely(lambda: results.result(key), "Input")
    return None if trace is None else (source, model, fitted, key, trace)


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, sentence, layer, head and query")
    found_trace = traced(settings, url)
    if found_trace is None:
        return
    source, model, fitted, key, trace = found_trace
    tokens = trace.tokens
    labels = display_tokens(tokens)
    box = settings if settings is not None else st
    kind = "decoder-only (causal)" if trace.kind == "decoder" else "encoder (bidirectional)"
    d_head = f" · d_head = {trace.q(0, 0).shape[1]}" if panel.has_qkv(trace, trace.main_stack) else ""
    shape = f"{kind} · {trace.n_layers} layers × {trace.n_heads} heads{d_head} · {len(tokens)} tokens"
    show_path(trace, model, box, shape)
    say_what_the_tokenizer_changed(fitted.text + " " + (fitted.pair or ""), tokens)

    it = next((i for i, token in enumerate(tokens) if plain_word(token).lower() == "it"), None)
    # A class sees the two views a lecture starts with, on the head that answers its question (which head
    # links "it" to "animal"?); the others are one choice away (and in links).
    found = lecture.lecture_head(key, trace, it)
    c = panel.controls(
        url,
        trace,
        default_query=it,
        default_head=None if found is None else (found.layer, found.head),
        default_views=("head", "heatmap", "search"),
        where=settings,
    )
    lecture.say_the_lecture_head(found, trace, c, labels)
    class_session.offer(lambda: class_questions.from_trace(trace, c.stack, c.layer, c.head, c.query, labels))
    if isinstance(model, tc.CausalLM) and trace.has_head and c.head is not None:
        class_session.offer_interventions(source, "text", (fitted.text,), trace, (c.stack, c.layer, c.head), "text")
    if trace.kind == "decoder":
        box.caption(
            "Causal mask: each token attends only to itself and the tokens before it; "
            "masked cells are grey in the heatmap and the overview."
        )
    # The predictions before the views, unless there are none to show or the first screen is the view's.
    first = settings is None and tv.prediction_kind(trace) is not None
    if first:
        outputs.show_predictions(trace, model, c.query, labels)
    panel.draw(panel.Shown(key, trace), url, c)
    compare.draw(url, source, model, trace, c, fitted.pair)
    flow_panel.draw(url, source, model, fitted.text, fitted.pair, trace, (c.layer, c.head), c.prefix)
    if not first:
        outputs.show_predictions(trace, model, c.query, labels)
    if isinstance(model, tc.CausalLM) and trace.has_head:
        outputs.show_continuation(url, source, model, fitted.text)
    sinks_panel.draw(url, key, fitted.text, fitted.pair)
    with st.expander("What attention does and does not explain"):
        st.markdown(CAVEAT)


def inputs(url: UrlState) -> tuple[str, str, str]:
    """(model source, sentence, second segment): the kind of model and the model beside the text, the second
    segment folded away (kept short: a projector's first screen should reach the views)."""
    left, right = st.columns([2, 3])
    with left:
        arch = choose_architecture(url)
        source = choose_model(
            url,
            SUGGESTIONS[arch],
            DEFAULT_MODELS[arch],
            placeholder="e.g. bert-base-cased or ./models/my-bert" if arch == "encoder" else "e.g. ./models/my-gpt2",
            help=MODEL_HELP[arch],
            stacked=True,
            kinds=(arch,),
        )
    text = right.text_area("Sentence", key=url.key("text", tv.DEFAULT_SENTENCE), height=122)
    url.described["text"] = "the sentence"
    pair = ""
    if arch == "encoder":
        pair_key = url.key("pair", "")
        with st.expander(
            "Second segment (optional: BERT's sentence B, for pair inputs)", expanded=bool(st.session_state[pair_key])
        ):
            pair = st.text_input("Second segment", key=pair_key, label_visibility="collapsed")
    return source, text, pair


def say_what_was_dropped(model: tc.TracedModel, fitted) -> None:
    """The tokens cut from a long input, and why (the page's limit or the model's)."""
    if not fitted.n_dropped:
        return
    most = model.max_tokens
    passes = model.pass_tokens
    if passes is not None and fitted.max_tokens == passes < min(most or passes + 1, tv.PAGE_MAX_TOKENS):
        reads = (
            f"one pass of this model reads at most {fitted.max_tokens:,} on this server (the working memory a pass "
            f"may take, TFORMER_PASS_MB; the model up to {most:,})"
        )
    elif most is not None and fitted.max_tokens is not None and fitted.max_tokens < most:
        reads = f"this page reads at most {fitted.max_tokens:,} (the model up to {most:,})"
    else:
        reads = f"this model reads at most {fitted.max_tokens:,}"
    st.info(
        f"The input has {fitted.n_tokens + fitted.n_dropped:,} tokens; {reads}, so the last "
        f"{fitted.n_dropped:,} tokens were dropped" + (" (cut from the longer segment first)." if fitted.pair else ".")
    )


def say_what_the_tokenizer_changed(text: str, tokens: tuple[str, ...]) -> None:
    """One line when the tokens do not spell the text: accents stripped, characters the vocabulary lacks written
    [UNK] (lowercasing alone goes unsaid: an uncased model's every capital would be a note)."""
    changes = text_changes(text, tokens)
    if any(not change.startswith("lowercases") for change in changes):
        listed = ", ".join(changes[:-1]) + (" and " if len(changes) > 1 else "") + changes[-1]
        st.caption(f"The tokenizer changed your text: it {escape(listed)}. The views show its tokens.")


def show_path(trace: tc.Trace, model: tc.TracedModel, where=st, shape: str = "") -> None:
    """In one caption: the model's shape, which code ran it (the core's own modules, or transformers'), and a note
    on its weights."""
    path = trace.meta.path
    line = f"{shape} · " if shape else ""
    if path in PATHS:
        line += f"path: **{path}**, {PATHS[path]}"
    note = model.weights_note
    if note:
        line += f"  \nWeights: {escape(note)}."
    where.caption(line)


main()
