"""What a text model outputs, as the Text attention page shows it: its top 5 after every position (masked word
or next token), a classifier's labels and where its first token looked, and a decoder's continuation, written
when asked and stepped through token by token with the new token's attention in every layer and head (once
per prompt and settings: results.continuation, as long work: long_work.long_result). Streamlit drawing only; the
numbers come from tformer_views.
"""

from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_views import generation as gen
from tformer_views import text as tv
from tformer_views.charts.spec import heatmap

from . import downloads, long_work, presenter, results
from .markdown import escape
from .page import run_safely
from .url import UrlState, int_key

DEFAULT_NEW_TOKENS = 20
MAX_TOP_K = 1000


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
        positions = list(trace.meta.mask_positions)
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
    if model.capabilities.chat_template:
        chat = st.checkbox(
            "As a chat answer: the text as the user's message, in the model's chat template",
            key=url.key("chat", False, omit_default=True),
            help="SmolLM2-Instruct is trained on conversations: a question gets an answer. Without this, it "
            "continues the text as written.",
        )
    return int(new), float(temperature) if sampling else 0.0, int(top_k) or None, int(seed), bool(chat)


def show_continuation(url: UrlState, source: str, model: tc.CausalLM, text: str) -> None:
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
    key = results.continuation(source, prompt, new, temperature, top_k, seed)
    continuation = run_safely(
        lambda: long_work.long_result(key, "Writing the continuation, a pass per token…"), "Continuation"
    )
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
