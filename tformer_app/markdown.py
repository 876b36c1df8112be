"""Text from users (sentences, model ids, file names, URL values, and messages that quote them) made safe
for Streamlit, which renders Markdown (and so links and HTML-like tags) in messages and captions."""

from __future__ import annotations

_MARKDOWN_SPECIAL = set("\\`*_{}[]()<>#+-.!|~$&:")


def escape(text: object) -> str:
    """`text` shown literally inside st.markdown / st.error / st.caption: every Markdown or HTML
    character backslash-escaped (":" too, so "javascript:" and ":emoji:" shortcodes stay plain text)."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in str(text))
