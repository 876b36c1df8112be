"""Text attention: every head of a real encoder (MiniLM, BERT, RoBERTa) or decoder-only model (SmolLM2, GPT-2).

Read widgets -> ask the views (tformer_views) -> draw. One forward pass per input (caches.cached);
choosing a layer, head, token or view reuses the cached trace. A decoder-only model also continues the
text when asked (greedy or sampled, once per prompt and settings: caches.cached("generate", ...)), and the
step slider shows each new token's attention in every layer and head from that cached result. A sequence
classifier shows its labels and where its first token looked.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass

import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import attention_panel as panel
from tformer_app import caches, classroom, downloads, presenter
from tformer_app.markdown import escape
from tformer_app.page import (
    DECODER_MODEL_SUGGESTIONS,
    DEFAULT_DECODER_MODEL,
    DEFAULT_TEXT_MODEL,
    TEXT_MODEL_SUGGESTIONS,
    run_page,
    run_safely,
)
from tformer_app.url import UrlState, int_key
from tformer_app.widgets import choose_model, kind_of, short_name
from tformer_views import classroom as classroom_questions
from tformer_views import generation as gen
from tformer_views import search
from tformer_views import text as tv
from tformer_views.charts.spec import heatmap
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
DEFAULT_NEW_TOKENS = 20
MAX_TOP_K = 1000
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


def page(url: UrlState) -> None:
    settings = presenter.settings_box("Model, sentence, layer, head and query")
    with settings if settings is not None else contextlib.nullcontext():
        source, text, pair = inputs(url)
    model = caches.load_model(source)
    if model is None:
        st.info("Choose another model above; the rest of the page appears once one loads.")
        return
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(escape(problem))
        return
    fitted = run_safely(lambda: tv.fit_text(model, text, pair), "Input")
    if fitted is None:
        return
    if pair.strip() and fitted.pair is None:
        st.caption("A decoder-only model reads one text: the second segment is ignored.")
    say_what_was_dropped(model, fitted)
    key = ("text", source, fitted.text, fitted.pair)
    trace = run_safely(lambda: caches.cached(*key), "Input")
    if trace is None:
        return

    tokens, labels = trace.tokens, display_tokens(trace.tokens)
    box = settings if settings is not None else st
    kind = "decoder-only (causal)" if trace.kind == "decoder" else "encoder (bidirectional)"
    d_head = f" · d_head = {trace.q(0, 0).shape[1]}" if panel.has_qkv(trace, trace.main_stack) else ""
    shape = f"{kind} · {trace.n_layers} layers × {trace.n_heads} heads{d_head} · {len(tokens)} tokens"
    show_path(trace, model, box, shape)
    say_what_the_tokenizer_changed(fitted.text + " " + (fitted.pair or ""), tokens)

    it = next((i for i, token in enumerate(tokens) if plain_word(token).lower() == "it"), None)
    # A class sees the two views a lecture starts with, on the head that answers its question (which head
    # links "it" to "animal"?); the others are one choice away (and in links).
    found = lecture_head(key, trace, it)
    c = panel.controls(
        url,
        trace,
        default_query=it,
        default_head=None if found is None else (found.layer, found.head),
        default_views=("head", "heatmap", "search"),
        where=settings,
    )
    if settings is None:
        say_the_lecture_head(found, trace, c, labels)
    classroom.offer(lambda: classroom_questions.from_trace(trace, c.stack, c.layer, c.head, c.query, labels))
    if trace.kind == "decoder":
        box.caption(
            "Causal mask: each token attends only to itself and the tokens before it; "
            "masked cells are grey in the heatmap and the overview."
        )
    # The predictions before the views, unless there are none to show or the first screen is the view's.
    first = settings is None and tv.prediction_kind(trace) is not None
    if first:
        show_predictions(trace, model, c.query, labels)
    panel.draw(panel.Shown(key, trace), url, c)
    if not first:
        show_predictions(trace, model, c.query, labels)
    if trace.kind == "decoder" and trace.has_head:
        show_continuation(url, source, model, fitted.text)
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
    reads = (
        f"this page reads at most {fitted.max_tokens:,} (the model up to {most:,})"
        if most is not None and fitted.max_tokens is not None and fitted.max_tokens < most
        else f"this model reads at most {fitted.max_tokens:,}"
    )
    st.info(
        f"The input has {fitted.n_tokens + fitted.n_dropped:,} tokens; {reads}, so the last "
        f"{fitted.n_dropped:,} tokens were dropped" + (" (cut from the longer segment first)." if fitted.pair else ".")
    )


@dataclass(frozen=True)
class LectureHead:
    """The head whose query ("it") weighs the lecture's noun ("animal") most, of all layers and heads."""

    layer: int
    head: int
    weight: float
    query: int
    key: int


def say_what_the_tokenizer_changed(text: str, tokens: tuple[str, ...]) -> None:
    """One line when the tokens do not spell the text: accents stripped, characters the vocabulary lacks written
    [UNK] (lowercasing alone goes unsaid: an uncased model's every capital would be a note)."""
    changes = text_changes(text, tokens)
    if any(not change.startswith("lowercases") for change in changes):
        listed = ", ".join(changes[:-1]) + (" and " if len(changes) > 1 else "") + changes[-1]
        st.caption(f"The tokenizer changed your text: it {escape(listed)}. The views show its tokens.")


def lecture_head(key: tuple, trace: tc.Trace, query: int | None) -> LectureHead | None:
    """The head linking `query` ("it") to the lecture's noun ("animal") most, when the sentence has them."""
    if query is None or not trace.n_layers:
        return None
    noun = search.default_key(trace.tokens, query, -1)
    if noun < 0:
        return None
    rows = caches.derived("query_rows", key, trace.main_stack, query)  # [layers, heads, keys]
    layer, head, weight = search.ranked_heads(rows[..., noun], 1)[0]
    return LectureHead(layer, head, weight, query, noun)


def say_the_lecture_head(found: LectureHead | None, trace: tc.Trace, c: panel.Controls, labels: list[str]) -> None:
    """One line with the lecture's answer, while its head is the one shown: the page's key idea on its first
    screen, before the views that show it."""
    if found is None or (c.layer, c.head) != (found.layer, found.head) or c.query != found.query:
        return
    q, k = escape(labels[found.query]), escape(labels[found.key])
    st.markdown(
        f"**{q} → {k}**: in layer {found.layer}, head {found.head}, “{q}” gives “{k}” {found.weight:.2f} of its "
        f"attention, more than in any other of the {trace.n_layers * trace.n_heads} heads. The views below show "
        "that head."
    )


def show_path(trace: tc.Trace, model: tc.TracedModel, where=st, shape: str = "") -> None:
    """In one caption: the model's shape, which code ran it (the core's own modules, or transformers'), and a note
    on its weights."""
    path = str(trace.meta.get("path", ""))
    line = f"{shape} · " if shape else ""
    if path in PATHS:
        line += f"path: **{path}**, {PATHS[path]}"
    note = getattr(model, "weights_note", "")
    if note:
        line += f"  \nWeights: {escape(note)}."
    where.caption(line)


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
        st.caption(
            "After every position: what the model predicts next having read only the tokens up to there "
            "(the causal mask makes each row the prediction it would make at that point of the text)."
        )
        frame = gen.next_token_frame(trace, 5)
        st.dataframe(frame, hide_index=True, height=min(420, 36 + 35 * len(frame)))
        st.markdown("[Continue the text, one token at a time ↓](#continue)")
    elif kind == "classification":
        show_classification(trace)
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


def show_classification(trace: tc.Trace) -> None:
    """A sequence classifier: its labels and scores, and where its first token looked in the last layer."""
    st.subheader("Classification of the whole input")
    scores, what = tv.class_scores(trace)
    frame = pd.DataFrame(scores, columns=["label", what])
    if what == "score":  # a regression head's number
        st.dataframe(frame, hide_index=True)
    else:
        bar = st.column_config.ProgressColumn(what, min_value=0.0, max_value=1.0, format="%.3f")
        st.dataframe(frame, hide_index=True, column_config={what: bar})
    view = tv.first_token_view(trace)
    downloads.chart(
        heatmap(
            view.weights,
            view.head_labels,
            view.token_labels,
            domain=(0.0, 1.0),
            row_title="head",
            col_title="key",
            title=f"{view.token} attends to, layer {view.layer} (the last)",
        ),
        key="text.chart.first_token",
        file_name=f"first_token_L{view.layer}",
    )
    st.caption(
        f"The classifier reads one vector: the final state of the first token ({escape(view.token)}). Each row "
        "is one head of the last layer: how much of each token's value that head mixed into it. Earlier layers "
        "have mixed the tokens already, so this is not the whole story of the decision."
    )


# ---- continuing the text (decoder-only) --------------------------------------------------------------
def generation_settings(url: UrlState, model: tc.TracedModel) -> tuple[int, float, int | None, int, bool]:
    """(new tokens, temperature (0: greedy), top-k or None, seed, as a chat answer), all in the link."""
    can_sample = gen.supports_sampling(model)
    c1, c2, c3, c4, c5 = st.columns([1, 1, 1, 1, 1])
    new = c1.number_input(
        "New tokens",
        1,
        gen.MAX_NEW_TOKENS,
        key=int_key(url, "new", DEFAULT_NEW_TOKENS, 1, gen.MAX_NEW_TOKENS),
        help=f"At most {gen.MAX_NEW_TOKENS}; the model may stop earlier with its end token.",
    )
    decode = c2.radio(
        "Decoding",
        ["greedy", "sample"],
        key=url.key("decode", "greedy", choices=["greedy", "sample"]),
        horizontal=True,
        disabled=not can_sample,
        help="Greedy: always the most probable token. Sample: draw at random from the probabilities "
        "(after the temperature and the top-k); the same seed draws the same tokens."
        + ("" if can_sample else " This model runs through transformers' own code: greedy only."),
    )
    sampling = decode == "sample" and can_sample
    temperature = c3.number_input(
        "Temperature",
        0.05,
        2.0,
        step=0.05,
        key=url.key("temp", 0.8, lo=0.05, hi=2.0, omit_default=True),
        disabled=not sampling,
        help="The logits are divided by it before the softmax: below 1 sharper, above 1 flatter.",
    )
    top_k = c4.number_input(
        "Top-k (0: all)",
        0,
        MAX_TOP_K,
        key=url.key("topk", 50, lo=0, hi=MAX_TOP_K, omit_default=True),
        disabled=not sampling,
        help="Only the k most probable tokens can be drawn (their probabilities renormalised).",
    )
    seed = c5.number_input(
        "Seed", 0, 2**31 - 1, key=url.key("seed", 0, lo=0, hi=2**31 - 1, omit_default=True), disabled=not sampling
    )
    chat = False
    if getattr(model, "chat_template", None):
        chat = st.checkbox(
            "As a chat answer: the text as the user's message, in the model's chat template",
            key=url.key("chat", False, omit_default=True),
            help="SmolLM2-Instruct is trained on conversations: a question gets an answer. Without this, it "
            "continues the text as written.",
        )
    return int(new), float(temperature) if sampling else 0.0, int(top_k) or None, int(seed), bool(chat)


def show_continuation(url: UrlState, source: str, model: tc.TracedModel, text: str) -> None:
    st.header("Continue the text, step by step", anchor="continue")
    st.caption(
        "The model writes one token at a time: it scores every token of its vocabulary as the next one, one is "
        "chosen and appended, and the longer text is read again. With a key/value cache only the new token "
        "runs; the keys and values of the earlier ones are kept."
    )
    new, temperature, top_k, seed, chat = generation_settings(url, model)
    prompt = run_safely(lambda: model.chat_prompt([{"role": "user", "content": text}]), "Chat") if chat else text
    if prompt is None:
        return
    if not asked_to_write(url, prompt, new):
        return
    if temperature == 0:
        top_k, seed = None, 0  # greedy: one cached result whatever the sampling settings say
    key = ("generate", source, prompt, new, temperature, top_k, seed)
    continuation = run_safely(lambda: caches.cached(*key), "Continuation")
    if continuation is None:
        return
    if continuation.n_steps == 0:
        st.info(
            f"The text fills all {model.max_tokens:,} positions this model has: there is no room for a new token. "
            "Shorten it to see the model write."
        )
        return
    show_written(continuation, chat)
    step_through(url, continuation)


def asked_to_write(url: UrlState, prompt: str, new: int) -> bool:
    """Whether to write the continuation: only once asked (a button, or write=1 in a link), for this text.

    Writing takes a forward pass per token (2-8 s for 20 tokens of SmolLM2 on a 2-core server): a new sentence
    shows its attention views at once, and writes when asked. A new text asks again; new settings (more
    tokens, sampling) rewrite the one asked for."""
    write_key = url.key("write", False, omit_default=True)
    text_key = f"{url.page}.write_for"
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()
    if st.session_state.get(text_key) not in (None, digest):
        st.session_state[write_key] = False  # another text: its views first
    st.session_state[text_key] = digest
    if st.session_state[write_key]:
        return True

    def ask() -> None:
        url.set("write", True)

    st.button(f"Write {new} new tokens", key=f"{url.page}.write_button", on_click=url.callback(ask), type="primary")
    st.caption(
        "The model writes only when asked: each new token is a forward pass (a second or two for 20 tokens of "
        "SmolLM2 here), and the views above do not wait for it."
    )
    return False


def show_written(c: gen.Continuation, chat: bool) -> None:
    how = "greedy: the most probable token each time"
    if c.sampling is not None:
        k = f"top-{c.sampling.top_k}" if c.sampling.top_k else "every token"
        how = f"sampled: temperature {c.sampling.temperature:g}, {k}, seed {c.sampling.seed}"
    end = "it wrote its end token" if c.finished else "it reached the limit"
    st.markdown(f"**{c.n_steps} new tokens** ({escape(how)}; {end}):")
    if chat:
        st.caption("The prompt in the chat template: " + escape(c.prompt))
    st.code((c.prompt if not chat else "") + c.text, language=None, wrap_lines=True)
    with st.expander("Every new token with its probability"):
        st.dataframe(
            c.tokens_frame(),
            hide_index=True,
            column_config={
                "probability": st.column_config.NumberColumn(
                    "probability", format="%.3f", help="In the distribution it was drawn from"
                ),
                "model probability": st.column_config.NumberColumn(
                    "model probability", format="%.3f", help="In the model's own softmax (before temperature, top-k)"
                ),
            },
        )


def step_keys(url: UrlState, n_steps: int) -> None:
    """Shift+← / Shift+→ step through the new tokens (the arrows alone move the heads and layers above)."""
    before, after = (presenter.clamped(url, "step", by, 1, n_steps) for by in (-1, 1))
    presenter.stepper(
        url,
        "gen_keys",
        [
            presenter.Step("step", "Shift+Left", before, "The step before"),
            presenter.Step("step", "Shift+Right", after, "The next step: the next token written"),
        ],
    )


def step_through(url: UrlState, c: gen.Continuation) -> None:
    n = c.n_steps
    step_key = url.key("step", 1, choices=range(1, n + 1))
    if n > 1:
        st.slider("Step", 1, n, key=step_key, help="Step t: the model has read the text so far and writes token t.")
        step_keys(url, n)
    step = c.step(int(st.session_state[step_key]) - 1)
    read = list(step.keys)
    shown = " ".join(escape(t) for t in read[-12:])
    st.markdown(
        f"**Step {step.t + 1} of {n}.** The model has read {len(read)} tokens ({'… ' if len(read) > 12 else ''}"
        f"{shown}); the last one, **{escape(step.query_token)}** at position {step.query}, asks what comes "
        f"next, and it writes **{escape(step.produced)}** (probability {step.probability:.3f})."
    )
    left, right = st.columns([2, 5])
    with left:
        st.caption(f"The model's top 5 at step {step.t + 1}:")
        st.dataframe(
            step.top_frame(5),
            hide_index=True,
            column_config={
                "token": st.column_config.TextColumn("token", width="small"),
                "probability": st.column_config.ProgressColumn(
                    "probability", min_value=0.0, max_value=1.0, format="%.3f", width="small"
                ),
                "written": st.column_config.CheckboxColumn("written", width="small"),
            },
        )
        if c.sampling is not None and step.produced not in [t for t, _ in step.top[:5]]:
            st.caption(f"Sampling drew {escape(step.produced)}, outside the top 5.")
    with right:
        matrix, rows, keys = step.grid()
        n_layers, n_heads, n_keys = step.rows.shape
        downloads.chart(
            heatmap(
                matrix,
                rows,
                keys,
                domain=(0.0, 1.0),
                row_title="layer, head",
                col_title="key (tokens read)",
                cell_size=max(3, min(14, 900 // len(rows))),
                cell_width=max(8, min(28, 720 // n_keys)),
                title=f"step {step.t + 1}: attention of {step.query_token} (position {step.query}), "
                f"{n_layers} layers × {n_heads} heads",
            ),
            key="text.chart.step_rows",
            file_name=f"step{step.t + 1}_attention",
        )
        st.caption(
            f"One row per layer and head ({n_layers} × {n_heads} = {n_layers * n_heads}): where the query of "
            f"{escape(step.query_token)} looked among the {n_keys} tokens read while the model chose "
            f"{escape(step.produced)}. Each row sums to 1; many heads park most of their weight on the first "
            "token."
        )


main()
