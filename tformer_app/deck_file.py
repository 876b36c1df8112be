"""Reading a deck file a user uploads (an exported deck of slides), with limits checked before it is parsed.

    slides = read_deck(data, pages={"text", "vision", ...})   # DeckError (an InputError) with a message

A deck is small: at most MAX_SLIDES slides of a page, a title and a link's query string. A file larger than
MAX_DECK_BYTES, or nested deeper than MAX_DEPTH (a deck is 3 levels: {"slides": [{...}]}), is refused
before json.loads sees it: Python's parser recurses once per level, and 100,000 "[" took the page down
with a RecursionError.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from tformer_core.errors import InputError

DECK_FORMAT = "tformer-deck"
MAX_SLIDES = 50
# Characters of a slide's query string: what a link carries (tformer_app.url.MAX_LINK; a test checks they agree),
# written here so that the deck store reads decks without importing Streamlit.
MAX_QUERY = 6000
MAX_TITLE = 80
MAX_DECK_BYTES = MAX_SLIDES * (MAX_QUERY + 400) + 1000
MAX_DEPTH = 8


class DeckError(InputError):
    """A file that cannot be opened as a deck; the message says why."""


def nesting_depth(text: str, limit: int) -> int:
    """How deeply JSON text nests its arrays and objects (brackets inside strings do not count); stops counting
    past `limit` (returns limit + 1). Linear, no recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return limit + 1
        elif ch in "]}":
            depth -= 1
    return deepest


def read_deck(data: bytes, pages: Collection[str], allow_empty: bool = False) -> list[dict[str, str]]:
    """The slides of an exported deck, each {"page", "title", "query"}, every one checked: a page of this app
    (`pages`: their URL paths), a query short enough for a link, a short title. DeckError otherwise.
    allow_empty: a deck without slides is one too (a saved deck its lecturer emptied; a file to open is not)."""
    if len(data) > MAX_DECK_BYTES:
        raise DeckError(
            f"the file is {len(data) / 1e3:,.0f} kB; a deck of {MAX_SLIDES} slides takes at most "
            f"{MAX_DECK_BYTES / 1e3:,.0f} kB"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DeckError("it is not a text file (an exported deck is JSON)") from None
    if nesting_depth(text, MAX_DEPTH) > MAX_DEPTH:
        raise DeckError(f"it nests more than {MAX_DEPTH} levels deep; an exported deck has 3")
    try:
        loaded = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise DeckError(f"it is not valid JSON ({getattr(error, 'msg', 'nested too deeply')})") from None
    slides = loaded.get("slides") if isinstance(loaded, dict) and loaded.get("format") == DECK_FORMAT else None
    if not isinstance(slides, list) or not (slides or allow_empty):
        raise DeckError("it is not a tformer deck (an exported deck names its format and lists its slides)")
    if len(slides) > MAX_SLIDES:
        raise DeckError(f"it has {len(slides)} slides; a deck holds at most {MAX_SLIDES}")
    checked = [_slide(i, s) for i, s in enumerate(slides)]
    unknown = [s["page"] for s in checked if s["page"] not in pages]
    if unknown:
        raise DeckError(f"slides for pages this app does not have: {', '.join(p[:40] for p in unknown[:3])}")
    return checked


def _slide(i: int, slide: object) -> dict[str, str]:
    if not isinstance(slide, dict) or not isinstance(slide.get("page"), str) or not isinstance(slide.get("query"), str):
        raise DeckError(f"slide {i + 1} is not a page and a link's query")
    if len(slide["query"]) > MAX_QUERY:
        raise DeckError(f"slide {i + 1}'s link is {len(slide['query']):,} characters; a link holds {MAX_QUERY:,}")
    title = slide.get("title", slide["page"])
    return {"page": slide["page"], "title": str(title)[:MAX_TITLE], "query": slide["query"]}
