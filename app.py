"""tformer: the Streamlit shell. Page config, the shared sidebar, navigation.

Pages live in app_pages/, not pages/: Streamlit takes a pages/ folder beside the main script for an
old-style multipage app, and the first session of a fresh server would then run a page file on its
own, without this shell (no sidebar, no page config), or show "Page not found" for a shared link.
"""

import streamlit as st

from tformer_app import admin, class_session, decks, logs, presenter, upkeep
from tformer_app.page import count_visit, device_summary, models_summary

logs.configure()  # once per process: the log's handlers, and every setting checked (bad ones logged)
upkeep.start()  # the sweeper of ended sessions (once per process); results fitted beside the sessions' uploads

st.set_page_config(
    page_title="tformer: inside Transformers",
    page_icon="🔍",
    layout="wide",
    initial_sidebar_state=presenter.sidebar_state(),
)

# Grouped as a lecture goes: the ideas, then real models, then what a head does, then training one. Material
# icons (Streamlit's own font): emoji need a colour-emoji font a projector's browser may lack.
PAGES = {
    "tformer": [st.Page("app_pages/home.py", title="Home", icon=":material/home:", default=True)],
    "Learn": [
        st.Page(
            "app_pages/before_transformers.py",
            title="Attention before Transformers",
            icon=":material/history:",
            url_path="early",
        ),
        st.Page(
            "app_pages/step_by_step.py",
            title="Attention, step by step",
            icon=":material/calculate:",
            url_path="step-by-step",
        ),
        st.Page("app_pages/positional.py", title="Positional encoding", icon=":material/waves:", url_path="positional"),
        st.Page("app_pages/inside_block.py", title="Inside a block", icon=":material/view_agenda:", url_path="block"),
        st.Page("app_pages/why_here.py", title="Why here?", icon=":material/help:", url_path="why-here"),
    ],
    "Explore": [
        st.Page("app_pages/text_attention.py", title="Text attention", icon=":material/text_fields:", url_path="text"),
        st.Page(
            "app_pages/encoder_decoder.py", title="Encoder-decoder", icon=":material/translate:", url_path="seq2seq"
        ),
        st.Page("app_pages/vision.py", title="Vision Transformer", icon=":material/image:", url_path="vision"),
        st.Page(
            "app_pages/attention_distance.py",
            title="Mean attention distance",
            icon=":material/straighten:",
            url_path="distance",
        ),
        st.Page("app_pages/inductive_bias.py", title="Inductive bias", icon=":material/swap_horiz:", url_path="shift"),
        st.Page("app_pages/mae.py", title="Masked autoencoder", icon=":material/extension:", url_path="mae"),
        st.Page("app_pages/detr.py", title="DETR: detection", icon=":material/crop_free:", url_path="detr"),
    ],
    "Interpret": [
        st.Page(
            "app_pages/head_matters.py", title="Does this head matter?", icon=":material/biotech:", url_path="heads"
        )
    ],
    "Train": [
        st.Page("app_pages/train.py", title="Train a Transformer", icon=":material/model_training:", url_path="train")
    ],
}

if admin.served():  # for whoever runs the server: not in the sidebar, and it asks for TFORMER_ADMIN_TOKEN
    PAGES["tformer"].append(
        st.Page(
            "app_pages/server.py",
            title="Memory and caches",
            icon=":material/dns:",
            url_path="server",
            visibility="hidden",
        )
    )

navigation = st.navigation(PAGES, expanded=True)  # every page in sight: no "View more"
BY_PATH = {page.url_path: page for section in PAGES.values() for page in section}
presenter.keys(BY_PATH)  # a slide the keys or a button asked for opens here, before any page runs
# A class session: a join link; the lecturer's change sent; the lecturer's view opened on a student's page.
class_session.before(BY_PATH, navigation.url_path)
count_visit(navigation.url_path)

with st.sidebar:
    presenter.switch()
    class_status = class_session.sidebar()
    st.caption(device_summary())
    models_line = st.empty()  # filled after the page ran, so it lists the model the page just loaded
    slides = st.container()  # after the page ran: a slide is the page's view as its link holds it
presenter.style()
presenter.bar(navigation.url_path, PAGES)  # presenter mode: every page, the slides, the way out
class_box = st.container()  # after the page ran: the class's question and answers, above the page

try:
    navigation.run()
finally:
    models_line.caption(models_summary())
    with slides:
        decks.deck(navigation.url_path, navigation.title, BY_PATH)
    class_session.after(class_box, class_status, navigation.url_path)
    upkeep.run_ended()  # what the page freed as it drew (pictures, charts) goes back beyond memory.SLACK
