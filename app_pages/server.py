"""Server: what this server process holds in memory, for whoever runs it for a class (served only when the
environment sets TFORMER_ADMIN=1 and TFORMER_ADMIN_TOKEN, and shown only to a session that gives that token:
a student's click must not empty everyone's caches, nor see the hub ids others typed)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tformer_app import admin, models, upkeep
from tformer_app.markdown import escape

MB = 2**20


def main() -> None:
    st.title("Server")
    if not admin.granted():
        return
    st.caption(
        "Memory this server process holds, and its caches. Budgets come from TFORMER_CACHE_MB and "
        "TFORMER_MODELS_MB; least recently used entries are dropped first when a budget is full."
    )
    report = upkeep.memory_report()
    rows = [
        (s.name, s.entries, s.used_bytes / MB, s.budget_bytes / MB, s.hits, s.misses, s.evicted)
        for s in (report.results, report.models)
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=["cache", "entries", "MB used", "MB budget", "hits", "misses", "evicted"]),
        hide_index=True,
    )
    rss = "unknown" if report.rss_bytes is None else f"{report.rss_bytes / MB:,.0f} MB"
    st.markdown(f"Resident memory of this process: **{rss}**")
    if report.gpu_bytes is not None:
        held, budget = report.results.device_bytes / MB, (report.results.device_budget_bytes or 0) / MB
        st.markdown(f"On its GPU: **{report.gpu_bytes / MB:,.0f} MB**, cached results {held:,.0f} of {budget:,.0f} MB")
    st.caption(
        f"The sessions' uploads, the pictures they were sent and the sessions themselves (about 1 MB each): "
        f"{report.sessions_bytes / MB:,.1f} MB, counted in the results' budget (a closed tab's are given back "
        "about three minutes later)."
    )
    st.caption(
        f"Freed memory this process could not give back (scattered among live objects): "
        f"{report.kept_bytes / MB:,.1f} MB, counted in the results' budget too."
    )
    if report.session_counts is not None:
        n = report.session_counts
        st.caption(
            f"Sessions: {n.connected} connected, {n.resumable} closed and kept to be resumed, "
            f"{n.ended_in_memory} ended and still in memory (0 unless something keeps them alive)."
        )
    st.caption("Models loaded: " + (", ".join(escape(m) for m in models.loaded_models()) or "none"))
    if st.button("Clear cached results", help="Every session recomputes what it shows next; models stay loaded"):
        freed = upkeep.clear_results()
        st.success(f"Dropped {freed / MB:,.1f} MB of cached results.")


main()
