"""Text attention: every head of a real encoder (MiniLM, BERT, RoBERTa) or decoder-only model (GPT-2).

Read widgets -> ask the core (tformer_core.text_views) for view data -> draw. One forward pass per
input (ui.cached); choosing a layer, head, token or view reuses the cached trace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import ui
from tformer_core import text_views as tv
from tformer_core.charts import heatmap

VIEWS = {
    "head": "Head view",
    "heatmap": "Heatmap",
    "overview": "All layers × heads",
    "qkv": "Q, K, V",
    "why": "Why this weight",
    "distance": "Attention distance",
}
MATRICES = {"weights": "weights (softmax)", "scaled": "softmax input QKᵀ/√d_k", "scores": "scores QKᵀ"}
OTHER = "__other__"

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


def choose_model(url: ui.UrlState) -> str:
    """A bundled or suggested model, a local folder, or any hub id typed in; returns the source."""
    url.key("model", ui.DEFAULT_TEXT_MODEL)
    current = str(url.value("model")).strip() or ui.DEFAULT_TEXT_MODEL
    options = list(dict.fromkeys([*ui.TEXT_MODEL_SUGGESTIONS, *tv.local_model_folders()])) + [OTHER]
    if "text.model_choice" not in st.session_state:
        st.session_state["text.model_choice"] = current if current in options else OTHER
        st.session_state["text.model_other"] = "" if current in options else current
    left, right = st.columns([1, 1])
    choice = left.selectbox(
        "Model", options, key="text.model_choice",
        format_func=lambda o: "Another hub id or local folder…" if o == OTHER else o,
        help="minilm (all-MiniLM-L6-v2) is bundled and works offline. Hub models need the internet the first time.",
    )  # fmt: skip
    source = choice
    if choice == OTHER:
        typed = right.text_input("Hub id or folder", key="text.model_other",
                                 placeholder="e.g. bert-base-cased or ./models/my-bert")  # fmt: skip
        source = typed.strip() or ui.DEFAULT_TEXT_MODEL
    url.set("model", source)
    return source


def main() -> None:
    st.title("Text attention")
    st.caption(
        "Type a sentence and see what every attention head of a real model does with it. "
        "One forward pass per input; choosing a layer, head or token reuses it."
    )
    url = ui.UrlState("text")
    try:
        page(url)
    finally:
        url.publish()


def page(url: ui.UrlState) -> None:
    source = choose_model(url)
    text = st.text_area("Sentence", key=url.key("text", tv.DEFAULT_SENTENCE), height=80)
    pair = st.text_input("Second segment (optional: BERT's sentence B, for pair inputs)", key=url.key("pair", ""))

    model = ui.load_model(source)
    if model is None:
        st.info("Choose another model above; the rest of the page appears once one loads.")
        return
    problem = tv.text_model_problem(model)
    if problem:
        st.warning(problem)
        return
    fitted = ui.run_safely(lambda: tv.fit_to_model(model, text, pair), "Input")
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
    trace = ui.run_safely(lambda: ui.cached("text", source, fitted.text, fitted.pair), "Input")
    if trace is None:
        return

    L, H = trace.n_layers, trace.n_heads
    tokens = trace.tokens
    labels = tv.display_tokens(tokens)
    d_head = trace.q(0, 0).shape[1]
    kind = "decoder-only (causal)" if trace.kind == "decoder" else "encoder (bidirectional)"
    st.caption(f"{kind} · {L} layers × {H} heads · d_head = {d_head} · {len(tokens)} tokens")

    # ---- shared view controls ----
    c1, c2, c3 = st.columns([1, 1, 2])
    layer = c1.selectbox("Layer", list(range(L)), key=url.key("layer", 0, choices=range(L)))
    head = c2.selectbox("Head", list(range(H)), key=url.key("head", 0, choices=range(H)))
    hide = c3.checkbox("Hide [CLS], [SEP], <s>, </s>, BOS", key=url.key("hide", False),
                       help="Drops their rows and columns and renormalises each row over the remaining tokens; "
                            "the share of attention they received is reported.")  # fmt: skip
    heads_key = url.key("heads", list(range(H)))
    shown_heads = [h for h in st.session_state[heads_key] if isinstance(h, int) and 0 <= h < H]
    if shown_heads != st.session_state[heads_key]:
        url.set("heads", shown_heads)
    views_key = url.key("views", list(VIEWS))
    if any(v not in VIEWS for v in st.session_state[views_key]):
        url.set("views", [v for v in st.session_state[views_key] if v in VIEWS])
    views = st.multiselect("Views", list(VIEWS), key=views_key, format_func=VIEWS.get)

    shown = tv.visible_positions(tokens, hide)
    default_query = next((int(i) for i in shown if labels[i].strip("␣").lower() == "it"), int(shown[-1]))
    query = st.selectbox("Query token (the row being explained)", [int(i) for i in shown],
                         key=url.key("query", default_query, choices=[int(i) for i in shown]),
                         format_func=lambda i: f"{i}: {labels[i]}")  # fmt: skip
    window = slice(None)
    if len(shown) > tv.MAX_DETAIL_TOKENS:
        last_start = len(shown) - tv.MAX_DETAIL_TOKENS
        start = st.number_input(
            f"Long input: the head view, heatmap and Q/K/V show {tv.MAX_DETAIL_TOKENS} tokens from this one",
            min_value=0, max_value=last_start, step=8, key=url.key("start", 0, choices=range(last_start + 1)),
        )  # fmt: skip
        window = tv.token_window(len(shown), int(start))
    if trace.kind == "decoder":
        st.caption("Causal mask: each token attends only to itself and the tokens before it; "
                   "masked cells are grey in the heatmap and the overview.")  # fmt: skip

    show_predictions(trace, model, query, labels)

    if "head" in views:
        st.subheader(f"Head view · layer {layer}")
        heads = st.multiselect("Heads shown (one colour each)", list(range(H)), key=heads_key)
        focus = st.checkbox("Only the query token's lines", key=url.key("focus", False))
        view = tv.head_view(trace, layer, heads, hide_special=hide, window=window, focus=query if focus else None)
        ui.chart(tv.head_view_chart(view, H, title=f"layer {layer}: queries (left) → keys (right)"),
                 key="text.chart.head_view", file_name=f"head_view_L{layer}")
        note = (f"Line opacity = weight; lines below {view.threshold:.3f} are not drawn. "
                "Hover a token on the left to see only its lines.")  # fmt: skip
        if hide:
            note += f" {view.hidden_share:.0%} of the attention of these heads went to the hidden tokens."
        st.caption(note)

    if "heatmap" in views:
        st.subheader(f"Heatmap · layer {layer}, head {head}")
        part = st.radio("Matrix", list(MATRICES), key=url.key("matrix", "weights", choices=list(MATRICES)),
                        format_func=MATRICES.get, horizontal=True)  # fmt: skip
        full = tv.head_matrix(trace, layer, head, hide_special=hide) if part == "weights" else \
            tv.score_matrix(trace, layer, head, part, hide_special=hide)  # fmt: skip
        m = full.window(window)
        fixed = part == "weights" and len(m.keys) <= 16  # short inputs: 0..1, so heads compare at a glance
        title = f"layer {layer}, head {head}: {MATRICES[part]}"
        domain = (0.0, 1.0) if fixed else None
        ui.chart(heatmap(m.for_heatmap(), m.query_labels, m.key_labels, title=title, domain=domain),
                 key="text.chart.heatmap", file_name=f"attention_L{layer}_H{head}_{part}")
        ui.matrix_download(full.for_heatmap(), full.query_labels, full.key_labels,
                           f"attention_L{layer}_H{head}_{part}.csv", key="text.csv_matrix")  # fmt: skip
        if full.allowed is not None:
            st.caption("Grey cells are masked: their softmax input is −∞, so their weight is exactly 0.")
        if hide and part == "weights":
            st.caption(f"Rows renormalised over the shown tokens; {full.hidden_share.mean():.0%} of this head's "
                       "attention went to the hidden special tokens.")  # fmt: skip

    if "overview" in views:
        draw_overview(trace, url, layer, head, hide)

    if "qkv" in views:
        st.subheader(f"Q, K and V · layer {layer}, head {head}")
        st.caption("Rows are tokens, columns the d_head dimensions of this head: Q = X W^Q, K = X W^K, V = X W^V "
                   "(X: the layer's input; a slice of the full projections).")  # fmt: skip
        full = tv.qkv(trace, layer, head)
        shown_rows = tv.qkv(trace, layer, head, positions=shown[window])
        for column, (name, (matrix, rows, cols)) in zip(st.columns(3), shown_rows.items()):
            with column:
                chart = heatmap(matrix, rows, cols, title=f"{name} (layer {layer}, head {head})", row_title="token",
                                col_title="dimension", diverging=True, annotate=False,
                                cell_width=max(3, min(12, 200 // max(matrix.shape[1], 1))))  # fmt: skip
                ui.chart(chart, key=f"text.chart.{name}", file_name=f"{name}_L{layer}_H{head}")
                ui.matrix_download(*full[name], f"{name}_L{layer}_H{head}.csv", label=f"{name} as CSV",
                                   key=f"text.csv_{name}")  # fmt: skip

    if "why" in views:
        draw_why(trace, url, layer, head, query, labels)

    if "distance" in views:
        st.subheader("How far each head looks")
        dist = tv.derived(trace, ("distance", hide), lambda: tv.distance_frame(trace, hide_special=hide))
        baseline = tv.derived(trace, ("uniform", hide), lambda: tv.uniform_distance(trace, hide_special=hide))
        ui.chart(tv.distance_chart(dist, baseline, H, (layer, head), title="mean attention distance per head"),
                 key="text.chart.distance", file_name="attention_distance")
        st.caption(
            "Distance of a head = Σ_j w_ij·|i − j| averaged over query tokens i, in tokens. The dashed line is "
            "uniform attention over the tokens each query may see. Heads far below it look at their neighbours; "
            "heads above it look far away (often at [CLS] / [SEP])."
        )
        ui.matrix_download(dist.pivot(index="layer", columns="head", values="distance").to_numpy(),
                           [f"layer {i}" for i in range(L)], [f"head {h}" for h in range(H)],
                           "attention_distance.csv", key="text.csv_distance")  # fmt: skip

    with st.expander("What attention does and does not explain"):
        st.markdown(CAVEAT)


def show_predictions(trace, model, query: int, labels: list[str]) -> None:
    kind = tv.prediction_kind(trace)
    if kind == "next-token":
        st.subheader("Next token, top 5")
        left, right = st.columns(2)
        left.caption("after the whole input")
        left.dataframe(pd.DataFrame(tv.top_predictions(trace, 5), columns=["token", "probability"]), hide_index=True)
        if query != len(labels) - 1:
            right.caption(f"after position {query} ({tv.escape_markdown(labels[query])}), as the model saw it there")
            right.dataframe(pd.DataFrame(tv.top_predictions(trace, 5, query), columns=["token", "probability"]),
                            hide_index=True)  # fmt: skip
    elif kind == "masked-word":
        mask = tv.mask_token(model) or "[MASK]"
        positions = list(trace.meta.get("mask_positions") or [])
        st.subheader("Masked word, top 5")
        if not positions:
            st.info(f"Write {tv.escape_markdown(mask)} in the sentence where a word should be guessed.")
        for position in positions[:3]:
            st.caption(f"{tv.escape_markdown(mask)} at position {position}")
            st.dataframe(pd.DataFrame(tv.top_predictions(trace, 5, position), columns=["token", "probability"]),
                         hide_index=True)  # fmt: skip
    elif trace.kind == "encoder":
        st.caption("This checkpoint has no masked-word head (MiniLM is trained for sentence embeddings), "
                   "so it makes no word predictions.")  # fmt: skip


def draw_overview(trace, url: ui.UrlState, layer: int, head: int, hide: bool) -> None:
    st.subheader("All layers × heads")
    picture = tv.derived(trace, ("overview", hide), lambda: tv.overview(trace, hide_special=hide))
    n_q, n_k = picture.n_tokens
    b = picture.block
    detail = "one pixel per token pair" if b == 1 else f"each pixel averages {b}×{b} token pairs"
    caption = (f"Rows: layers, columns: heads; each thumbnail is a {n_q}×{n_k} attention matrix ({detail}), "
               "coloured from 0 (dark) to its own largest weight (yellow).")  # fmt: skip
    st.image(picture.png, output_format="PNG", caption=caption)
    st.download_button("PNG", lambda: picture.png, file_name="all_heads.png", mime="image/png",
                       key="text.overview_png", on_click="ignore", type="tertiary",
                       icon=":material/download:")  # fmt: skip (deferred: the browser fetches nothing until a click)
    dist = tv.derived(trace, ("distance", hide), lambda: tv.distance_frame(trace, hide_special=hide))
    values = dist.pivot(index="layer", columns="head", values="distance").to_numpy()

    def pick() -> None:
        cell = tv.clicked_cell(st.session_state.get("text.cell_pick"))
        if cell is not None and cell[0] < trace.n_layers and cell[1] < trace.n_heads:
            url.set("layer", cell[0])
            url.set("head", cell[1])

    ui.chart(
        tv.head_grid_chart(values, (layer, head), title="Click a head to select it (colour: mean distance, tokens)",
                           value_title="distance"),
        key="text.cell_pick", file_name="heads_grid", on_select=pick, selection_mode="cell",
    )  # fmt: skip


def draw_why(trace, url: ui.UrlState, layer: int, head: int, query: int, labels: list[str]) -> None:
    st.subheader(f"Why this weight · layer {layer}, head {head}, query {query}")
    why = tv.why_this_weight(trace, layer, head, query)
    n_k = len(why.key_labels)
    default_key = int(np.argmax(why.weights))
    key = st.selectbox("Key token (the column)", list(range(n_k)), key=url.key("key", default_key, choices=range(n_k)),
                       format_func=lambda j: f"{j}: {why.key_labels[j]}")  # fmt: skip
    if why.allowed is not None and not why.allowed[key]:
        st.latex(rf"s_{{{query},{key}}} = -\infty \ (\text{{masked}})\quad\Rightarrow\quad w_{{{query},{key}}} = 0")
    else:
        bias = rf" + b_{{{query},{key}}}" if why.bias is not None else ""
        bias_num = f" + ({why.bias[key]:.4f})" if why.bias is not None else ""
        st.latex(
            rf"s_{{{query},{key}}} = \frac{{q_{{{query}}}\cdot k_{{{key}}}}}{{\sqrt{{d_k}}}}{bias}"
            rf" = {why.dots[key]:.4f} \times {why.scale:.4f}{bias_num} = {why.logits[key]:.4f}"
        )
        st.latex(
            rf"w_{{{query},{key}}} = \frac{{e^{{s_{{{query},{key}}}}}}}{{\sum_j e^{{s_{{{query},j}}}}}}"
            rf" = \frac{{{why.exps[key]:.4g}}}{{{why.exps.sum():.4g}}} = {why.weights[key]:.4f}"
        )
    st.caption(
        f"Query {tv.escape_markdown(why.query_label)} against every key: the softmax runs over all "
        f"{n_k} keys (special tokens included, whatever the views hide). Exponentials are shifted by the "
        "largest input, which cancels in the ratio."
    )
    table = why.table()
    table.insert(0, "chosen", np.where(np.arange(n_k) == key, "▶", ""))  # the key whose weight is spelled out
    ui.table(table)
    numeric = table.drop(columns=[c for c in ("chosen", "key", "allowed") if c in table])
    ui.matrix_download(numeric.to_numpy(dtype=float), list(why.key_labels), list(numeric.columns),
                       f"why_L{layer}_H{head}_q{query}.csv", key="text.csv_why")  # fmt: skip
    left, right = st.columns(2)
    with left:
        st.caption(f"q·k = Σ_d q_d k_d for key {key}: {why.dots[key]:.4f}")
        ui.table(why.products(key))
    err_w, err_z = why.max_errors()
    with right:
        st.caption(f"Head output z = Σ_j w_j v_j (recomputed) beside the model's own z: "
                   f"max difference {err_z:.1e} (weights: {err_w:.1e}).")  # fmt: skip
        ui.table(pd.DataFrame({"z = Σ w_j v_j": why.z, "model's z": why.stored_z},
                              index=[f"d{i}" for i in range(len(why.z))]))  # fmt: skip


main()
