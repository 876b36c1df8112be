"""Train: a small Transformer trained in class, watched epoch by epoch, then opened in the other pages.

Read widgets -> queue a training (tformer_app.training: one at a time per server, in a worker thread) ->
poll it once a second in a fragment (progress, curves, the attention on a fixed input) -> when it ends,
keep the model in this session (tformer_app.session_models) and draw the results.
"""

from __future__ import annotations

import streamlit as st

from tformer_app import downloads, presenter, session_models
from tformer_app.long_work import session_id
from tformer_app.markdown import escape
from tformer_app.page import device_summary, run_page
from tformer_app.training import QUEUE, QueueFull, Ticket
from tformer_app.url import UrlState
from tformer_train import classroom
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
KEY_IDEA = "Watch it learn: the loss falls, the accuracy rises, the attention takes shape."
# Presenter mode: what stands above the attention snapshot on a 720-px screen (the bar, the title, the key idea,
# the button, the result's line, the keys) and around its cells (its title, token labels and legend).
ABOVE_SNAPSHOT_PX, AROUND_SNAPSHOT_PX = 300, 140


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
    idea, settings = presenter.first_line("What to train, its sizes and seed")
    if idea is not None:
        idea.markdown(KEY_IDEA)
    with presenter.folded(settings):
        job = choose_job(url)
        st.caption(f"{device_summary()} · one training at a time on this server; others wait their turn.")
    sid = session_id()
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
    for i, kind in enumerate([k for k in KINDS if k in results]):
        result, name = results[kind]
        show_result(url, kind, result, name, keys=i == 0)  # one set of keys on a page


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
            image = ticket.job.kind == "image"
            spec = tv.snapshot_chart(last, last.attention.shape[0] - 1, 0, image, snapshot_cell(last, image))
            downloads.chart(sized(spec), "train.live_attention", "attention_snapshot")


def show_result(url: UrlState, kind: str, result: classroom.Result, name: str, keys: bool = True) -> None:
    """A finished model: test accuracy, curves, the attention after any epoch, and where to open it. keys: the
    arrow keys step its epochs and heads."""
    image = kind == "image"
    job = result.job
    what = f"{result.test_items} {'pictures' if image else 'sentences'} never trained on"
    chance = "10 %" if image else "about 50 %"
    shape = f"{job.n_layers} layers, {job.n_heads} heads, d_model {job.d_model}, {job.epochs} epochs, seed {job.seed}"
    if presenter.presenting():  # one line: the curves and the attention on the first screen
        st.markdown(
            f"**Your {'tiny ViT' if image else 'text classifier'}: {result.test_accuracy:.1%}** right on {what} "
            f"(chance: {chance})"
        )
    else:
        st.header(f"Your {'tiny ViT' if image else 'text classifier'}")
        st.metric(f"Test accuracy ({what})", f"{result.test_accuracy:.1%}")
        st.caption(f"{shape}; trained in {result.seconds:.1f} s. Chance would score {chance}.")
    left, right = st.columns(2)
    with left:
        downloads.chart(tv.curves_chart(result.history, 480), f"train.{kind}.curves", f"{kind}_training_curves")
        if presenter.presenting():
            st.caption(f"{shape}; trained in {result.seconds:.1f} s.")
        downloads.table(tv.summary(result), key=f"train.{kind}.summary")
    with right:
        show_snapshots(url, kind, result, image, keys)
    page_path, page_name, title = OPENS_IN[kind]
    if st.button(f"Open {name} in {title}", key=f"train.{kind}.open"):
        st.session_state[f"{page_name}.model"] = name
        st.session_state[f"{page_name}.model_choice"] = name
        st.switch_page(page_path)
    st.caption(
        f"In the model box of {escape(title)}, your model is listed as **{escape(name)}** for the rest of "
        "this session; nobody else sees it."
    )


def show_snapshots(url: UrlState, kind: str, result: classroom.Result, image: bool, keys: bool) -> None:
    """The fixed input's attention after the chosen epoch: watch the heads form (← → the epochs, ↑ ↓ the heads;
    in presenter mode the boxes are folded under the chart)."""
    history = result.history
    L, H = history[-1].attention.shape[:2]
    epoch_key, layer_key, head_key = (f"train.{kind}.{name}" for name in ("epoch", "layer", "head"))
    if st.session_state.get(f"train.{kind}.shown") != id(result):  # a new model opens on its last epoch and layer
        st.session_state.update(
            {epoch_key: len(history), layer_key: L - 1, head_key: 0, f"train.{kind}.shown": id(result)}
        )
    for key, low, high in ((epoch_key, 1, len(history)), (layer_key, 0, L - 1), (head_key, 0, H - 1)):
        st.session_state[key] = min(max(int(st.session_state[key]), low), high)
    if keys:
        presenter.stepper(url, f"{kind}.keys", snapshot_steps(epoch_key, len(history), layer_key, L, head_key, H))
    epoch = int(st.session_state[epoch_key]) - 1
    layer, head = int(st.session_state[layer_key]), int(st.session_state[head_key])
    spec = tv.snapshot_chart(history[epoch], layer, head, image, snapshot_cell(history[epoch], image))
    if image:
        picture, chart = st.columns([1, 3])
        picture.image(tv.fixed_digit(8 if presenter.presenting() else 12), caption="the fixed test digit, as read")
    else:
        chart = st.container()
        st.caption(f"The fixed sentence: “{escape(classroom.FIXED_SENTENCE)}”")
    with chart:
        downloads.chart(sized(spec), f"train.{kind}.snapshot", f"{kind}_attention_epoch_{epoch + 1}")
    with presenter.folded(presenter.settings_box("Epoch, layer and head")):
        if len(history) > 1:  # a one-epoch run has one snapshot (a slider needs two values)
            st.slider("After epoch", 1, len(history), key=epoch_key)
        c1, c2 = st.columns(2)
        c1.selectbox("Layer", list(range(L)), key=layer_key)
        c2.selectbox("Head", list(range(H)), key=head_key)


def snapshot_steps(epoch: str, epochs: int, layer: str, layers: int, head: str, heads: int) -> list[presenter.Step]:
    """The keys of the attention snapshot: ← → the epoch before / after, ↑ ↓ the head before / after (past a
    layer's last head, the next layer's first)."""

    def move(name: str, by: int, low: int, high: int) -> None:
        st.session_state[name] = min(max(int(st.session_state[name]) + by, low), high)

    def step_head(by: int) -> None:
        value = int(st.session_state[head]) + by
        if not 0 <= value < heads:
            st.session_state[layer] = (int(st.session_state[layer]) + (1 if value >= heads else -1)) % layers
        st.session_state[head] = value % heads

    return [
        presenter.Step("epoch", "Left", lambda: move(epoch, -1, 1, epochs), "The epoch before"),
        presenter.Step("epoch", "Right", lambda: move(epoch, 1, 1, epochs), "The epoch after"),
        presenter.Step("head", "Up", lambda: step_head(-1), "The head before (after head 0: the layer before)"),
        presenter.Step("head", "Down", lambda: step_head(1), "The head after (after the last: the next layer)"),
    ]


def snapshot_cell(epoch: classroom.Epoch, image: bool) -> int:
    """Pixels per cell of the attention snapshot in half the main column (its labels and legend beside it); in
    presenter mode low enough for the first screen too."""
    n = epoch.attention.shape[-1]
    side = tv.grid_side(n) if image else n
    cell = presenter.cell_size(side, share=0.5)
    if presenter.presenting():
        cell = min(cell, max(12, (presenter.screen_height() - ABOVE_SNAPSHOT_PX - AROUND_SNAPSHOT_PX) // side))
    return cell


def sized(spec: dict) -> dict:
    """A chart drawn at the size its cells were given for the room and presenter mode (not enlarged again)."""
    return {**spec, "usermeta": {"scale": presenter.scale()}}


main()
