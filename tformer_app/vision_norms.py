"""The Vision page's "High-norm tokens (artefacts) and registers": every patch's norm over the picture for a layer,
the verdict (no artefact, with the largest ratio to the median; or the artefact patches boxed), each layer's
longest patch and prefix tokens over the median, and a register model's registers beside the patches. Streamlit
drawing only; the numbers come from tformer_core.artefacts and tformer_views.artefacts.
"""

from __future__ import annotations

import streamlit as st

from tformer_core.artefacts import token_norms
from tformer_views import vision as vv
from tformer_views.artefacts import norm_overlay, prefix_frame, ratio_chart, verdict
from tformer_views.pictures import to_jpeg

from . import downloads
from .markdown import escape
from .url import UrlState

__all__ = ["TITLE", "draw"]

TITLE = "High-norm tokens (artefacts) and registers"
ABOUT = (
    "Darcet et al. (2024, *Vision Transformers Need Registers*) found that large ViTs trained long (DINOv2, "
    "OpenCLIP, DeiT-III) reuse a few background patches to hold global information: from the middle layers on, "
    "those tokens are many times longer than the others and show as bright spots in attention maps. Extra "
    "*register* tokens, which hold no patch, take that job over. Here a patch counts as an artefact when its norm "
    "in the residual stream is more than {threshold:g} times the median patch norm of its layer."
)


def draw(url: UrlState, result: vv.VisionResult) -> None:
    """The section, folded: a layer chooser, the norm map over the picture with the artefacts boxed, the verdict,
    the prefix tokens beside the patches and the per-layer curves."""
    with st.expander(TITLE):
        norms = result.norms if result.norms is not None else token_norms(result.trace)
        st.markdown(ABOUT.format(threshold=norms.threshold))
        L = norms.n_layers
        layer = int(st.selectbox("Layer", list(range(L)), key=url.key("norm_layer", L - 1, choices=range(L))))
        overall = verdict(norms)
        (st.success if norms.artefacts() == [] else st.warning)(escape(overall))
        left, right = st.columns([3, 2])
        left.image(
            to_jpeg(norm_overlay(result.image, norms, layer)),
            caption=f"Layer {layer}: each patch's norm (bright = the longest); artefact patches boxed in cyan.",
        )
        with right:
            st.markdown(escape(verdict(norms, layer)))
            st.dataframe(prefix_frame(norms, layer), hide_index=True)
            registers = [t for t in norms.prefix_tokens if t.startswith("[REG")]
            if registers:
                st.caption(
                    f"This model has {len(registers)} registers ({escape(', '.join(registers))}): tokens without a "
                    "patch, not counted in the median. In a trained model they hold the long norms that "
                    "artefact patches hold in a model without them."
                )
            else:
                prefix = escape(", ".join(norms.prefix_tokens))
                st.caption(f"This model has no registers: before the patches come {prefix} only.")
        downloads.chart(ratio_chart(norms), key=f"{url.page}.norm_ratios", file_name="token_norms")
