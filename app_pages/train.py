"""Train: a small Transformer trained in class, watched epoch by epoch, then opened in the other pages.

Read widgets -> queue a training (tformer_app.training: one at a time per server, in a worker thread) ->
poll it once a second in a fragment (progress, curves, the attention on a fixed input) -> when it ends,
keep the model in this session (tformer_app.session_models) and draw the results.
"""

from __future__ import annotations

import streamlit as st

from tformer_app import caches, downloads, session_models
from tformer_app.markdown import escape
from tformer_app.page import device_summary, run_page
from tformer_app.training import QUEUE, QueueFull, Ticket
from tformer_app.url import UrlState
from tformer_core import classroom
from tformer_views import training as tv

INTRO = (
    "Train a small Transformer here and watch it learn: a text classifier in the lectures' form "
    "(nn.MultiheadAttention, ReLU feed-forward, post-norm LayerNorm with eps 1e-6) on movie-review sentences, "
    "or a tiny ViT on handwritten digits. After every epoch the page keeps the attention on one fixed sentence "
    "or picture, so you can see the heads form; at the end, the model opens in the other pages (for you only)."
)
KINDS = {"text": "Text classifier (movie sentences: negative / positive)", "image": "Tiny ViT (handwritten digits)"}
WHAT = {"text": "text-classifier", "image": "digits-vit"}
OPENS_IN = {
    "text": ("app_pages/text_attention.py", "text", "Text attention"),
    "image": ("app_pages/vision.py", "vit", "Vision Transformer"),
}
_RESULTS = "train.results"  # kind -> (classroom.Result, the model's session name)


def main() -> None:
    run_page("Train a Transformer", INTRO, "train", page)


def choose_job(url: UrlState) -> classroom.Job | None:
    """The kind and sizes of the model to train (within classroom's limits)."""
    kind = st.radio(
        "What to train",
        list(KINDS),
        format_func=KINDS.get,
        horizontal=True,
        key=url.key("kind", "text", choices=list(KINDS)),
    )
    image = kind == "image"
    c1, c2, c3, c4, c5 = st.columns(5)
    layers = c1.slider("Layers", 1, 4, key=url.key("layers", 2, lo=1, hi=4))
    heads = c2.selectbox("Heads", list(classroom.HEADS), key=url.key("heads", 2, choices=list(classroom.HEADS)))
    d_model = c3.selectbox("d_model", list(classroom.D_MODELS), key=url.key("d", 64, choices=list(classroom.D_MODELS)))
    lo, hi = classroom.LIMITS[f"{kind}_epochs"]
    epochs = c4.slider("Epochs", lo, hi, key=url.key(f"epochs_{kind}", 15 if image else 3, lo=lo, hi=hi))
    seed = c5.number_input("Seed", 0, 9999, key=url.key("seed", 0, lo=0, hi=9999))
    patch = 2
    if image:
        patch = st.radio(
            "Patch size (pixels of the 8 × 8 picture)", [2, 4], horizontal=True, key=url.key("patch", 2, choices=[2, 4])
        )
    try:
        if image:
            return classroom.ImageJob(
                n_layers=layers, n_heads=heads, d_model=d_model, epochs=epochs, seed=int(seed), patch_size=int(patch)
            )
        return classroom.TextJob(n_layers=layers, n_heads=heads, d_model=d_model, epochs=epochs, seed=int(seed))
    except ValueError as error:
        st.error(f"These sizes cannot be trained: {escape(error)}")
        return None


def page(url: UrlState) -> None:
    job = choose_job(url)
    st.caption(f"{device_summary()} · one training at a time on this server; others wait their turn.")
    sid = caches.session_id()
    ticket = QUEUE.ticket(sid)
    if ticket is not None and ticket.active:
        st.button("Cancel the training", key="train.cancel", on_click=QUEUE.cancel, args=(ticket,))
        live(sid)
    else:
        take_result(sid, ticket)
        if job is not None and st.button("Train", type="primary", key="train.start"):
            try:
                QUEUE.submit(sid, job)
            except QueueFull as error:
                st.warning(escape(error))
            else:
                st.rerun()
    results = st.session_state.get(_RESULTS, {})
    for kind in [k for k in KINDS if k in results]:
        show_result(url, kind, *results[kind])


def take_result(sid: str, ticket: Ticket | None) -> None:
    """A finished training becomes this session's model of its kind (a cancelled or failed one is said so)."""
    if ticket is None:
        return
    if ticket.state == "done" and ticket.result is not None:
        kind = ticket.job.kind
        name = session_models.store(ticket.result.model, WHAT[kind])
        st.session_state.setdefault(_RESULTS, {})[kind] = (ticket.result, name)
    elif ticket.state == "cancelled":
        st.info(f"The training was stopped{': ' + escape(ticket.error) if ticket.error else ''}.")
    elif ticket.state == "failed":
        st.error(f"The training failed: {escape(ticket.error)}")
    QUEUE.forget(sid)


@st.fragment(run_every=1.0)
def live(sid: str) -> None:
    """Where the training stands, redrawn every second while it waits or runs."""
    ticket = QUEUE.ticket(sid)
    if ticket is None or not ticket.active:
        st.rerun()  # the whole page: the result, or the message of a stopped training
        return
    ticket.seen()
    position = QUEUE.position(ticket)
    if ticket.state == "queued":
        before = max(position - 1, 0)
        st.info(f"Waiting: your training is number {position} in the queue ({before} before it, one running).")
        return
    latest, epochs = ticket.latest, list(ticket.epochs)
    done = latest.step / latest.total_steps if latest else 0.0
    text = (
        f"epoch {latest.epoch + 1} of {ticket.job.epochs}, step {latest.step} of {latest.total_steps}, "
        f"loss {latest.loss:.3f}"
        if latest
        else "starting"
    )
    st.progress(min(done, 1.0), text=text)
    if epochs:
        left, right = st.columns(2)
        with left:
            downloads.chart(tv.curves_chart(epochs, 480), "train.live_curves", "training_curves")
        with right:
            last = epochs[-1]
            layers = last.attention.shape[0]
            downloads.chart(
                tv.snapshot_chart(last, layers - 1, 0, ticket.job.kind == "image"),
                "train.live_attention",
                "attention_snapshot",
            )


def show_result(url: UrlState, kind: str, result: classroom.Result, name: str) -> None:
    """A finished model: test accuracy, curves, the attention after any epoch, and where to open it."""
    image = kind == "image"
    st.header(f"Your {'tiny ViT' if image else 'text classifier'}")
    job = result.job
    st.metric(
        f"Test accuracy ({result.test_items} {'pictures' if image else 'sentences'} never trained on)",
        f"{result.test_accuracy:.1%}",
    )
    st.caption(
        f"{job.n_layers} layers, {job.n_heads} heads, d_model {job.d_model}, {job.epochs} epochs, seed "
        f"{job.seed}; trained in {result.seconds:.1f} s. Chance would score "
        f"{'10 %' if image else 'about 50 %'}."
    )
    left, right = st.columns(2)
    with left:
        downloads.chart(tv.curves_chart(result.history, 480), f"train.{kind}.curves", f"{kind}_training_curves")
        downloads.table(tv.summary(result), key=f"train.{kind}.summary")
    with right:
        show_snapshots(url, kind, result, image)
    page_path, page_name, title = OPENS_IN[kind]
    if st.button(f"Open {name} in {title}", key=f"train.{kind}.open"):
        st.session_state[f"{page_name}.model"] = name
        st.session_state[f"{page_name}.model_choice"] = name
        st.switch_page(page_path)
    st.caption(
        f"In the model box of {escape(title)}, your model is listed as **{escape(name)}** for the rest of "
        "this session; nobody else sees it."
    )


def show_snapshots(url: UrlState, kind: str, result: classroom.Result, image: bool) -> None:
    """The fixed input's attention after the chosen epoch: watch the heads form."""
    history = result.history
    L, H = history[-1].attention.shape[:2]
    epoch = 0  # a one-epoch run has one snapshot (a slider needs two values)
    if len(history) > 1:
        epoch = st.slider("After epoch", 1, len(history), len(history), key=f"train.{kind}.epoch") - 1
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", list(range(L)), index=L - 1, key=f"train.{kind}.layer")
    head = c2.selectbox("Head", list(range(H)), key=f"train.{kind}.head")
    if image:
        st.image(tv.fixed_digit(), caption="the fixed picture (a test digit), as the model reads it")
    else:
        st.caption(f"The fixed sentence: “{escape(classroom.FIXED_SENTENCE)}”")
    downloads.chart(
        tv.snapshot_chart(history[epoch], layer, head, image),
        f"train.{kind}.snapshot",
        f"{kind}_attention_epoch_{epoch + 1}",
    )


main()
