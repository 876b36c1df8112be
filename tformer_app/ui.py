"""The one place where the pages meet Streamlit's caches, the URL and the download buttons.

Pages call these helpers; they never call a model's forward themselves.

- Models are cached once per server process (`cached_model`: one object shared by every
  session; the core's capture is per call, so sharing is safe), loaded with a progress bar
  (`load_model`).
- Traces, translations and pictures are cached per (model, input) (`cached`): changing only the
  view (layer, head, token, step, colours) reads the cached result and runs no model.
  `forward_passes(source)` counts the stack passes each cached model has run, so tests and
  benchmarks can check that. Long work over many inputs gets a progress bar (`computed`).
- Page state lives in the URL query parameters (`UrlState`, `run_page`), so any view can be shared.
- Every chart (Altair, or a Vega-Lite dict from the core) is drawn by `chart`, which puts SVG and
  PNG downloads under it; matrices download as CSV (`matrix_download`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from typing import Any, Callable, Sequence

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
import torch

import tformer_core as tc
from tformer_core.models.layers import Stack
from tformer_views import seq2seq as sv
from tformer_views import vision as vv
from tformer_views.charts.spec import to_png, to_svg, vega_lite_spec

DEFAULT_TEXT_MODEL = "minilm"
TEXT_MODEL_SUGGESTIONS = ("minilm", "bert-base-uncased", "roberta-base", "distilbert-base-uncased", "gpt2")

# ---- models ------------------------------------------------------------------------------------
_passes: Counter[str] = Counter()
_passes_lock = threading.Lock()
_loaded_sources: set[str] = set()


def _count_passes(model: tc.TracedModel, source: str) -> None:
    """Count every run of a stack (encoder / decoder) of this model: one forward pass runs each once."""

    def hook(module: torch.nn.Module, args: Any) -> None:
        with _passes_lock:
            _passes[source] += 1

    for module in model.modules():
        if isinstance(module, Stack):
            module.register_forward_pre_hook(hook)


def forward_passes(source: str | None = None) -> int:
    """Stack passes run so far by the cached model `source` (all models when None)."""
    with _passes_lock:
        return _passes[source] if source is not None else sum(_passes.values())


RETRY_AFTER_S = 300.0  # a failed load is not tried again for this long (an unreachable hub costs seconds a try)


class _ModelSlot:
    """Where one model lives once loaded; the lock makes concurrent sessions load it only once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.model: tc.TracedModel | None = None
        self.error: Exception | None = None
        self.failed_at = 0.0


# The slot, not the model, is what Streamlit caches: loading reports progress to the page that asked,
# and Streamlit replays any element drawn inside a cached function on later hits, where that page's
# progress bar no longer exists. So the cached function draws nothing and loading happens outside it.
@st.cache_resource(show_spinner=False, max_entries=6)
def _model_slot(source: str) -> _ModelSlot:
    return _ModelSlot()


def cached_model(source: str, progress: Callable[[float, str], None] | None = None) -> tc.TracedModel:
    """The model for `source`, loaded once per server process; raises what the loader raises.

    A failed load is tried again after RETRY_AFTER_S (until then the same error comes back at once).
    """
    slot = _model_slot(source)
    with slot.lock:
        if slot.model is None:
            if slot.error is not None and time.monotonic() - slot.failed_at < RETRY_AFTER_S:
                raise slot.error
            try:
                model = tc.load_model(source, progress=progress)
            except (tc.CheckpointError, ValueError, OSError) as error:
                slot.error, slot.failed_at = error, time.monotonic()
                raise
            _count_passes(model, source)
            slot.model, slot.error = model, None
            with _passes_lock:
                _loaded_sources.add(source)
        return slot.model


def load_model(source: str, quiet: bool = False) -> tc.TracedModel | None:
    """The cached model for `source`, loading it with a progress bar on first use.

    On failure, shows the loader's message (unknown id, offline hub, unsupported family...) and
    returns None: the page stops drawing that part, the session keeps working. quiet: no message
    (the page falls back to another model and says so itself).
    """
    bar = st.empty()

    def progress(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=message)

    try:
        return cached_model(source, progress)
    except (tc.CheckpointError, ValueError, OSError) as error:
        if not quiet:
            st.error(f"Could not load **{source}**: {error}")
        return None
    finally:
        bar.empty()


# ---- longer computations with a progress bar ------------------------------------------------------
_computed: OrderedDict[tuple, Any] = OrderedDict()
_computed_lock = threading.Lock()
MAX_COMPUTED = 16


def computed(key: tuple, compute: Callable[[Callable[[float, str], None]], Any], label: str) -> Any:
    """compute(progress) once per `key` for the whole server (the last MAX_COMPUTED results are kept),
    with a progress bar in the page that asked. For work too long to wait for without one (many images).

    Not st.cache_resource: Streamlit replays elements drawn inside a cached function on later hits,
    and the progress bar belongs to the page that asked first.
    """
    with _computed_lock:
        if key in _computed:
            _computed.move_to_end(key)
            return _computed[key]
    bar = st.progress(0.0, text=label)
    try:
        value = compute(lambda fraction, message: bar.progress(min(max(fraction, 0.0), 1.0), text=message))
    finally:
        bar.empty()
    with _computed_lock:
        _computed[key] = value
        while len(_computed) > MAX_COMPUTED:
            _computed.popitem(last=False)
    return value


def device_summary() -> str:
    device = tc.default_device()
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"Device: **{device.type.upper()}** ({label}) · torch {torch.__version__.split('+')[0]}"


def loaded_models() -> list[str]:
    """Sources of the models this server process has loaded (for the sidebar)."""
    with _passes_lock:
        return sorted(_loaded_sources)


# ---- traces ------------------------------------------------------------------------------------
def _trace_text(model: tc.TracedModel, text: str, pair: str | None) -> tc.Trace:
    return model.trace(text, pair=pair) if pair else model.trace(text)


# What a page may ask to compute once per input: kind -> function(model, *args).
COMPUTATIONS: dict[str, Callable[..., Any]] = {
    "text": _trace_text,  # (text, second segment or None) -> Trace
    "translate": sv.translate,  # (source, max new tokens) -> Translation (greedy, every step traced)
    "teacher": sv.teacher_force,  # (source, target) -> Translation (teacher forcing)
    "image": vv.analyse,  # (image file bytes, file name) -> VisionResult
}


@st.cache_resource(show_spinner=False, max_entries=64)
def cached(kind: str, source: str, *args: Any) -> Any:
    """COMPUTATIONS[kind](the model for `source`, *args), computed once per (kind, source, args).

    Results are shared by every session and read-only: pages must not modify them.
    """
    if kind not in COMPUTATIONS:
        raise ValueError(f"unknown cached computation {kind!r}")
    return COMPUTATIONS[kind](cached_model(source), *args)


def run_safely(compute: Callable[[], Any], what: str) -> Any | None:
    """compute(), or None with an inline error message when the input is bad (never a traceback)."""
    try:
        return compute()
    except (ValueError, tc.CheckpointError) as error:
        st.error(f"{what}: {error}")
        return None


def run_page(title: str, intro: str, name: str, draw: Callable[["UrlState"], None]) -> None:
    """A page: its title and introduction, then draw(url) with the page's URL state.

    The URL is written even when drawing stops early (a bad input), so the link still shows what
    the user chose.
    """
    st.title(title)
    st.caption(intro)
    url = UrlState(name)
    try:
        draw(url)
    finally:
        url.publish()


# ---- URL state -----------------------------------------------------------------------------------
class UrlState:
    """Widget values mirrored in the URL's query parameters, so a view can be shared by its link.

        url = UrlState("text")                      # one per page; widget keys become "text.<name>"
        st.text_input("Sentence", key=url.key("q", default="The cat sat."))
        ...
        url.publish()                               # after the widgets: write them into the URL

    On a session's first visit, a value found in the URL (and valid for `cast` / `choices`) seeds
    the widget; afterwards the widget's own state rules and the URL follows it.
    """

    def __init__(self, page: str) -> None:
        self.page = page
        self.names: list[str] = []

    def key(
        self, name: str, default: Any, cast: Callable[[str], Any] | None = None, choices: Sequence[Any] | None = None
    ) -> str:
        widget_key = f"{self.page}.{name}"
        if name not in self.names:
            self.names.append(name)
        if widget_key not in st.session_state:
            value = default
            raw = st.query_params.get(name)
            if raw is not None:
                value = _parse(raw, default, cast)
                if choices is not None and value not in choices:
                    value = default
            st.session_state[widget_key] = value
        elif choices is not None and st.session_state[widget_key] not in choices:
            st.session_state[widget_key] = default  # e.g. a head index beyond a newly loaded model's heads
        return widget_key

    def value(self, name: str) -> Any:
        return st.session_state[f"{self.page}.{name}"]

    def set(self, name: str, value: Any) -> None:
        st.session_state[f"{self.page}.{name}"] = value

    def publish(self) -> None:
        """Write every registered value into the URL (replacing the query string)."""
        params = {name: _format(st.session_state[f"{self.page}.{name}"]) for name in self.names}
        if dict(st.query_params) != params:
            st.query_params.from_dict(params)


def int_key(url: UrlState, name: str, default: int, lo: int, hi: int) -> str:
    """A URL-backed key for a number input limited to lo..hi.

    A value from a link outside lo..hi is clamped, with a warning (a number input given an
    out-of-range value would raise).
    """
    key = url.key(name, default)
    value = st.session_state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        fixed = min(max(int(value), lo), hi) if isinstance(value, (int, float)) else default
        st.warning(f"`{name}` = {value} is outside {lo}..{hi}; using {fixed}.")
        st.session_state[key] = fixed
    return key


def int_list(raw: str) -> list[int]:
    """A URL value "1,4,7" as [1, 4, 7] (UrlState's `cast` for lists of numbers that may start empty)."""
    return [int(s) for s in raw.split(",") if s.strip()]


def _parse(raw: str, default: Any, cast: Callable[[str], Any] | None) -> Any:
    try:
        if cast is not None:
            return cast(raw)
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, (list, tuple)):
            items = [s for s in raw.split(",") if s != ""]
            kind = type(default[0]) if default else str
            return [kind(s) for s in items]
        return raw
    except (TypeError, ValueError):
        return default


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


# ---- drawing and exports -------------------------------------------------------------------------
def chart(spec: alt.TopLevelMixin, key: str, file_name: str | None = None, **selection: Any) -> Any:
    """Draw an Altair chart with SVG and PNG downloads under it; returns st.altair_chart's result.

    Streamlit's own chart toolbar saves PNG only; these buttons render the same chart on the server
    (tformer_core.charts.to_svg / to_png), and only when clicked. `selection`: st.altair_chart's
    on_select / selection_mode, for clickable charts.
    """
    event = st.vega_lite_chart(vega_lite_spec(spec), width="content", key=key, **selection)
    export_buttons(spec, key, file_name or key.rsplit(".", 1)[-1])
    return event


def export_buttons(spec: alt.TopLevelMixin, key: str, file_name: str) -> None:
    """SVG and PNG download buttons for a chart (rendered on click; a click does not rerun the page)."""
    with st.container(horizontal=True, gap="small"):
        for kind, mime, render in (("svg", "image/svg+xml", to_svg), ("png", "image/png", to_png)):
            st.download_button(
                kind.upper(),
                lambda render=render: render(spec),
                file_name=f"{file_name}.{kind}",
                mime=mime,
                key=f"{key}.{kind}",
                on_click="ignore",
                type="tertiary",
                icon=":material/download:",
                help=f"Save this chart as {kind.upper()}",
            )


def table(frame: pd.DataFrame, digits: int = 4, key: str | None = None) -> None:
    """A table whose numbers the browser formats to `digits` decimals.

    Not a pandas Styler: a Styler formats every cell on the server, which for a 512-row table
    takes longer than the rest of a rerun.
    """
    config = {
        str(c): st.column_config.NumberColumn(format=f"%.{digits}f")
        for c in frame.columns
        if pd.api.types.is_float_dtype(frame[c])
    }
    st.dataframe(frame, column_config=config, key=key)


def matrix_download(
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    file_name: str,
    label: str = "Download CSV",
    key: str | None = None,
) -> None:
    """A button that downloads the matrix shown (with its row and column labels) as CSV.

    The CSV is written only when the button is clicked (a 512 x 512 matrix takes longer to format
    than the rest of a rerun), and the click does not rerun the page.
    """

    def csv() -> bytes:
        return pd.DataFrame(np.asarray(matrix), index=list(rows), columns=list(cols)).to_csv().encode("utf-8")

    st.download_button(
        label, csv, file_name=file_name, mime="text/csv", key=key, on_click="ignore", icon=":material/download:"
    )
