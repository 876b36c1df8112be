"""tformer: the Streamlit shell. Page config, the shared sidebar, navigation. Pages live in pages/."""

import streamlit as st
import torch

import tformer_core as tc

# Traces allocate and free hundreds of MB per request; keep that memory for reuse (see runtime.py).
tc.retain_freed_memory()

st.set_page_config(page_title="tformer: inside Transformers", page_icon="🔍", layout="wide")

with st.sidebar:
    device = tc.default_device()
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    st.caption(f"Device: **{device.type.upper()}** ({label}) · torch {torch.__version__.split('+')[0]}")

navigation = st.navigation({"tformer": [st.Page("pages/home.py", title="Home", icon="🏠", default=True)]})
navigation.run()
