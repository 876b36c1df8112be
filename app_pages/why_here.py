"""Why here? The lecture's sentence, "it" -> "animal", walked through the sources of its score
(tformer_views.lessons.why_here: every number from tformer_core.score_sources)."""

from __future__ import annotations

import streamlit as st

from tformer_app import downloads, results
from tformer_app.markdown import escape
from tformer_app.page import DEFAULT_TEXT_MODEL, run_page, run_safely
from tformer_app.url import UrlState
from tformer_views import why_sources as ws

INTRO = (
    "Why does “it” look at “animal”? The score behind that weight, split exactly into the parts of the residual "
    "stream that wrote the query and the key, then one of them taken out of a real pass."
)


def page(url: UrlState) -> None:
    lesson = run_safely(lambda: results.result(results.why_here(DEFAULT_TEXT_MODEL), "Tracing"), "Lesson")
    if lesson is None:
        return
    st.caption(f"{escape(DEFAULT_TEXT_MODEL)} on “{escape(lesson.sentence)}”")
    for number, (title, text) in enumerate(lesson.steps, 1):
        st.subheader(f"{number}. {title}")
        st.markdown(text)  # the lesson's own words and numbers on its fixed sentence: no user text
        if title == "The query side":
            downloads.table(ws.ranked_sources(lesson.sources, "query"), key="why_here_q")
        elif title == "The key side":
            downloads.table(ws.ranked_sources(lesson.sources, "key"), key="why_here_k")
    link = f"text?views=heatmap,why&layer={lesson.cell.layer}&head={lesson.cell.head}&query={lesson.cell.query}"
    st.markdown(f"Open this cell on [Text attention]({link}&key={lesson.cell.key}) and click any other.")


def main() -> None:
    run_page("Why here?", INTRO, "why_here", page)


main()
