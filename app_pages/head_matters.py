"""Does this head matter? Every head ablated, each head's direct share of the prediction, a head ablated by a click
(the prediction and the attention after it), the logit lens, and patching between two inputs: what attention
weights alone cannot tell.

Read widgets -> one study per input (long_work.head_study: long work in its own queue, once per input for the whole
server, with a progress bar) -> draw (tformer_app.heads_view: the grid beside the chosen head's effect;
tformer_app.heads_experiments: patching and induction heads).
"""

from __future__ import annotations

import streamlit as st

from tformer_app import flow_panel, heads_experiments, heads_view, long_work, models, presenter, vision_inputs
from tformer_app.markdown import escape
from tformer_app.page import run_page, run_safely
from tformer_app.url import UrlState
from tformer_app.widgets import choose_model
from tformer_core.models.base import TracedModel
from tformer_views.seq2seq import DEFAULT_SOURCES

DEFAULT = "smollm2"
SUGGESTIONS = ("smollm2", "translator", "vit-tiny", "minilm")
TEXT = "The capital of France is"
PAIR = ("The cat sat on the mat.", "A kitten was sitting on the rug.")
INTRO = (
    "Attention weights show where a head looks, not whether the answer needs it. Here each head is switched off "
    "(its output set to zero) and the prediction measured again; each head's direct share of the winning logit is "
    "read from the residual stream; and the prediction is read after every layer (the logit lens)."
)


def main() -> None:
    run_page("Does this head matter?", INTRO, "heads", page)


def page(url: UrlState) -> None:
    top = heads_view.top()
    with presenter.folded(top.settings):
        source = choose_model(
            url,
            SUGGESTIONS,
            DEFAULT,
            placeholder="e.g. smollm2, translator, vit-tiny, minilm",
            help="A language model, a translator, a Vision Transformer or a sentence encoder run by tformer's own "
            "modules.",
        )
    model = models.load_model(source)
    if model is None:
        return
    if model.path != "tformer" or model.kind not in ("decoder", "encoder-decoder", "vit", "encoder"):
        st.warning(f"**{escape(source)}** cannot be intervened on here: choose one of {', '.join(SUGGESTIONS)}.")
        return
    with presenter.folded(top.settings):
        asked = _inputs(url, model)
    if asked is None:
        return
    kind, inputs = asked
    study = run_safely(lambda: long_work.head_study(source, model, kind, inputs), "Input")
    if study is not None:
        heads_view.show(url, source, study, top)
        if model.kind == "decoder":  # the routes read from one pass, beside what ablating each head changes
            selected = (url.value("layer"), url.value("head"))
            flow_panel.draw(url, source, model, inputs[0], None, study.trace, selected, scroll=False)
    if model.kind == "decoder":
        heads_experiments.sinks_note(source, inputs[0])
        heads_experiments.patching(url, source, model)
        heads_experiments.induction(url, source, model)


def _inputs(url: UrlState, model: TracedModel) -> tuple[str, tuple] | None:
    """(study kind, its inputs) from this kind's widgets; None while no picture is chosen."""
    if model.kind == "decoder":
        return "text", (st.text_input("Text (the model predicts the next token)", key=url.key("text", TEXT)),)
    if model.kind == "encoder-decoder":
        label = "Source (the model writes its first target word)"
        return "translation", (st.text_input(label, key=url.key("source", DEFAULT_SOURCES.get(model.source, ""))),)
    if model.kind == "vit":
        picked = vision_inputs.choose_image(url, model)
        return None if picked is None else ("image", (picked[1], picked[0]))
    first = st.text_input("First sentence", key=url.key("first", PAIR[0]))
    second = st.text_input("Second sentence", key=url.key("second", PAIR[1]))
    return "similarity", (first, second)


main()
