"""Text from users (sentences, model ids, file names, URL values, and messages that quote them) made safe
for Streamlit, which renders Markdown (and so links, images and HTML-like tags) and LaTeX in messages and
captions."""

from __future__ import annotations

import re

_MARKDOWN_SPECIAL = set("\\`*_{}[]()<>#+-.!|~$&:")
# Streamlit's Markdown (GitHub's flavour) turns bare addresses into links even when every character is
# escaped: "http://x.example", "www.x.example" and "name@x.example" become <a href=...>. A zero-width
# space inside the pattern keeps them text; it is invisible, and only text that looks like an address
# gets one.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?=@)", re.IGNORECASE)
_ZWSP = "\u200b"
# Control characters (NUL, escapes, the C1 range) are shown as \xNN: invisible or raw, they would hide what a
# text holds (a NUL in a model id) or reach a terminal. Line breaks and tabs stay what they are.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape(text: object) -> str:
    """`text` shown literally inside st.markdown / st.error / st.caption: every Markdown or HTML
    character backslash-escaped (":" too, so "javascript:" and ":emoji:" shortcodes stay plain text),
    addresses kept from becoming links, and control characters written as \\xNN (a NUL shows as \\x00)."""
    plain = _AUTOLINK.sub(_ZWSP, _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in plain)
