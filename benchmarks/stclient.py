"""A Streamlit client that speaks the browser's protocol: one simulated user per `Session`, no browser.

    async with await Session.open("http://127.0.0.1:8501", "/text?head=5") as s:
        run = s.last                                     # what the first script run drew
        run.widget("Head", "selectbox").options          # ["0", "1", ...]
        run = await s.set_value("Head", "3")             # choose as a user would; the page reruns
        run.headings(), run.count("vega_lite_chart"), run.errors, run.elapsed_s
        await s.switch_page("vision")                    # the sidebar's link: same session
        await s.set_value("Picture", "Upload")
        await s.upload("An image", "cat.png", png_bytes, "image/png")
        await s.select("vit.picker", "patch", [{"patch": 17}])   # a click on a Vega-Lite point selection

Written for Streamlit 1.67 (starlette / uvicorn server). What a browser does, and so this client:

1. GET the page (`/text?...`: the HTML shell; through a load balancer this sets its route cookie), then
   `/_stcore/health` (sets the `_streamlit_xsrf` cookie) and `/_stcore/host-config`. Cookies are kept
   per session in a cookie jar and sent with every request and the websocket handshake.
2. Open the websocket `/_stcore/stream` with subprotocols `["streamlit", <xsrf cookie value>]` and an
   `Origin` header. Messages are binary protobufs: `BackMsg` up, `ForwardMsg` down.
3. Send `BackMsg.rerun_script` (a `ClientState`): `query_string` (without "?"), `page_name` (the URL
   path, first load only; later `page_script_hash` of the current page), `widget_states` (every
   widget's current value), `cached_message_hashes` and `context_info` (timezone, locale, URL).
4. Each script run begins with `ForwardMsg.new_session` (session id, `config.max_cached_message_age`)
   and ends with `script_finished` (FINISHED_EARLY_FOR_RERUN: another run follows). Between them:
   `delta`s addressed by `metadata.delta_path` (root 0 = main area, 1 = sidebar), `navigation`
   (the pages and their hashes), `page_info_changed` (the new query string, after st.query_params).
5. Large element messages are `metadata.cacheable`: the client keeps them (by `hash`) and lists their
   hashes in the next `rerun_script`; the server then sends `ref_hash` in their place. Entries expire
   after `max_cached_message_age` runs without use, as in the browser.
6. Widget values (`WidgetState`, keyed by the element's `id`): each widget takes its default when it
   first appears, or the server's value when the element has `set_value`; a user's change replaces
   one value and the whole set is sent; widgets absent from a finished run are forgotten. Value
   fields: selectbox / radio `string_value` (the option's text), multiselect `string_array_value`,
   number input `int_value` or `double_value` (by `data_type`), slider `double_array_value`,
   checkbox / toggle `bool_value`, text area / input `string_value`, file uploader
   `file_uploader_state_value`, Vega-Lite chart selection `string_value` = JSON
   `{"selection": {<param>: [<point fields>...]}}` (vega's `vlPoint.or` list).
7. Uploads: `BackMsg.file_urls_request` -> `ForwardMsg.file_urls_response` (upload URL per file), a
   multipart PUT of the file (form field named after the file) with header `X-Xsrftoken` = the xsrf
   cookie, then the uploader's `FileUploaderState` (file id, URLs, name, size) and a rerun.
8. Media (`st.image`) are fetched from their `/media/...` URLs after the run, once per session.
9. Fragments with `run_every`: the server sends `ForwardMsg.auto_rerun` (interval, fragment id) and the browser
   sends `rerun_script` with that `fragment_id` and `is_auto_rerun` on its timer (`fragment_rerun`); such a run
   ends with FINISHED_FRAGMENT_RUN_SUCCESSFULLY, or, when the fragment calls st.rerun(), the app's full run
   follows it.

Times: `Run.elapsed_s` is from the first byte an action sends (the upload's first request, for an
upload) to `script_finished`, in seconds; `Run.media_s` is the media fetches after it.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.Common_pb2 import FileURLsResponse
from streamlit.proto.Element_pb2 import Element
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

FINISHED = ForwardMsg.ScriptFinishedStatus
XSRF_COOKIE = "_streamlit_xsrf"
ID_PREFIX = "$$ID-"  # Streamlit's element ids: "$$ID-<hash>-<user key or None>"
WIDGET_KINDS = (
    "selectbox",
    "radio",
    "multiselect",
    "number_input",
    "slider",
    "checkbox",
    "text_area",
    "text_input",
    "file_uploader",
    "vega_lite_chart",
    "button",
    "button_group",
)
DEFAULT_TIMEOUT_S = 180.0
# HTTP (pages, uploads, media) runs in threads: urllib is blocking. Shared by every session of a process.
_http_pool: ThreadPoolExecutor | None = None


def run_sync(coroutine: Any) -> Any:
    """Run a coroutine to its end from synchronous code, in a thread with its own event loop (a caller's
    thread may already run one, e.g. a session-wide Playwright in the browser tests)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class ProtocolError(RuntimeError):
    """The server answered something a browser could not use (a missed cache entry, a closed socket...)."""


def _pool() -> ThreadPoolExecutor:
    global _http_pool
    if _http_pool is None:
        _http_pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="stclient-http")
    return _http_pool


# ---- what a run drew ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Widget:
    """A widget as the run drew it: `kind` is the element type ("selectbox", "toggle", ...), `proto` its message."""

    kind: str
    id: str
    label: str
    proto: Any
    path: tuple[int, ...]

    @property
    def key(self) -> str | None:
        """The user key the page gave it (e.g. "text.head"), read from the id; None without one."""
        if not self.id.startswith(ID_PREFIX):
            return None
        key = self.id[len(ID_PREFIX) :].partition("-")[2]
        return None if key in ("", "None") else key

    @property
    def options(self) -> list[str]:
        """The choices as the user reads them (select boxes, radios, multiselects, select sliders, pills)."""
        return [getattr(o, "content", o) for o in getattr(self.proto, "options", [])]  # pills: ButtonGroup.Option


@dataclass
class Run:
    """What one script run sent: its elements by delta path (main area under 0, sidebar under 1), and times."""

    elements: dict[tuple[int, ...], Element] = field(default_factory=dict)
    scripts: dict[tuple[int, ...], str] = field(default_factory=dict)  # delta path -> the script that drew it
    fragments: dict[tuple[int, ...], str] = field(default_factory=dict)  # delta path -> its fragment ("": none)
    status: int | None = None
    page_script_hash: str = ""
    query_string: str = ""
    problems: list[str] = field(default_factory=list)  # page not found, compile errors, media failures
    elapsed_s: float = 0.0  # from the action's first byte sent to script_finished
    finished_at: float = 0.0  # time.perf_counter() when its script_finished came (a run the server started too)
    media_s: float = 0.0  # media fetched after the run
    n_messages: int = 0
    n_bytes: int = 0  # websocket payload bytes received during the run (after decompression)
    n_refs: int = 0  # elements the server sent as a reference to the client's cache
    media_bytes: int = 0

    def items(self, kind: str | None = None, area: int | None = 0) -> list[tuple[tuple[int, ...], Element]]:
        """(path, element) in page order; `kind`: the element type; `area`: 0 main, 1 sidebar, None both."""
        out = []
        for path in sorted(self.elements):
            element = self.elements[path]
            if (area is None or path[0] == area) and (kind is None or element.WhichOneof("type") == kind):
                out.append((path, element))
        return out

    def count(self, kind: str, area: int | None = 0) -> int:
        """How many elements of one type ("vega_lite_chart", "imgs", "dataframe", ...) the run drew."""
        return len(self.items(kind, area))

    def widgets(self, area: int | None = None) -> list[Widget]:
        out = []
        for path, element in self.items(None, area):
            kind = element.WhichOneof("type")
            proto = getattr(element, kind)
            if kind in WIDGET_KINDS and getattr(proto, "id", ""):
                if kind == "checkbox" and proto.type == proto.StyleType.TOGGLE:
                    kind = "toggle"
                out.append(Widget(kind, proto.id, getattr(proto, "label", ""), proto, path))
        return out

    def widget(self, label: str | None = None, kind: str | None = None, key: str | None = None) -> Widget:
        """The one widget with this label (and kind, or user key); LookupError listing the widgets otherwise."""

        def matches(w: Widget) -> bool:
            return (label is None or w.label == label) and (kind is None or w.kind == kind) and (key in (None, w.key))

        found = [w for w in self.widgets() if matches(w)]
        if len(found) != 1:
            listing = ", ".join(f"{w.kind} {w.label!r} ({w.key})" for w in self.widgets())
            raise LookupError(f"{len(found)} widgets match {label=} {kind=} {key=}; the page has: {listing}")
        return found[0]

    def headings(self) -> list[str]:
        return [e.heading.body for _, e in self.items("heading")]

    def captions(self) -> list[str]:
        return [e.markdown.body for _, e in self.items("markdown") if e.markdown.element_type == e.markdown.CAPTION]

    def texts(self) -> list[str]:
        """Every text the page shows in its main area: headings, Markdown, captions, alerts."""
        out = []
        for _, element in self.items():
            kind = element.WhichOneof("type")
            if kind in ("heading", "markdown", "alert", "text"):
                out.append(getattr(element, kind).body)
        return out

    def charts(self) -> list[dict]:
        """The Vega-Lite specs drawn (data sets travel beside the spec, as Arrow)."""
        return [json.loads(e.vega_lite_chart.spec) for _, e in self.items("vega_lite_chart")]

    def images(self) -> list[str]:
        """The URLs of every picture of every st.image."""
        return [img.url for _, e in self.items("imgs", None) for img in e.imgs.imgs]

    @property
    def exceptions(self) -> list[str]:
        """Tracebacks shown in the page (uncaught exceptions, st.exception): "Type: message"."""
        return [f"{e.exception.type}: {e.exception.message}" for _, e in self.items("exception", None)]

    @property
    def errors(self) -> list[str]:
        """Exceptions, st.error messages and protocol problems of this run (empty when all went well)."""
        alerts = [e.alert.body for _, e in self.items("alert", None) if e.alert.format == e.alert.ERROR]
        return self.exceptions + alerts + self.problems

    @property
    def finished(self) -> bool:
        return self.status in (FINISHED.FINISHED_SUCCESSFULLY, FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY)


# ---- widget values as the browser keeps them ------------------------------------------------------------
def _option_value(proto: Any, default_index: int | None) -> str | None:
    """The text of a select box's / radio's current option: the server's raw value if it set one."""
    if proto.set_value:
        return proto.raw_value if proto.HasField("raw_value") else None
    if default_index is None or not proto.options:
        return None
    return proto.options[default_index]


def mounted_state(widget: Widget) -> WidgetState | None:
    """The value a browser's widget reports when it appears (its default, or the server's set value)."""
    p, state = widget.proto, WidgetState(id=widget.id)
    kind = widget.kind
    if kind in ("selectbox", "radio"):
        value = _option_value(p, p.default if p.HasField("default") else None)
        if value is None:
            return None
        state.string_value = value
    elif kind == "multiselect":
        values = list(p.raw_values) if p.set_value else [p.options[i] for i in p.default]
        state.string_array_value.data.extend(values)
    elif kind == "number_input":
        if p.set_value and p.HasField("value"):
            value = p.value
        elif p.HasField("default"):
            value = p.default
        else:
            return None
        if p.data_type == p.DataType.INT:
            state.int_value = int(value)
        else:
            state.double_value = value
    elif kind == "slider":
        if p.options:  # a select slider: option texts
            values = list(p.raw_value) if p.set_value and p.raw_value else [p.options[int(i)] for i in p.default]
            state.string_array_value.data.extend(values)
        else:
            state.double_array_value.data.extend(list(p.value) if p.set_value else list(p.default))
    elif kind in ("checkbox", "toggle"):
        state.bool_value = p.value if p.set_value else p.default
    elif kind in ("text_area", "text_input"):
        if p.set_value:
            if not p.HasField("value"):
                return None
            state.string_value = p.value
        elif p.HasField("default"):
            state.string_value = p.default
        else:
            return None
    elif kind == "file_uploader":
        state.file_uploader_state_value.SetInParent()  # no files yet: the browser reports an empty list
    else:  # charts report a selection only once the user made one
        return None
    return state


def user_state(widget: Widget, value: Any) -> WidgetState:
    """The WidgetState a user's choice gives: `value` as the user reads it (an option's text, a number...)."""
    p, state, kind = widget.proto, WidgetState(id=widget.id), widget.kind
    if kind in ("selectbox", "radio"):
        if str(value) not in p.options and not getattr(p, "accept_new_options", False):
            raise ValueError(f"{value!r} is not an option of {widget.label!r}: {list(p.options)}")
        state.string_value = str(value)
    elif kind == "multiselect":
        values = [str(v) for v in value]
        missing = [v for v in values if v not in p.options]
        if missing:
            raise ValueError(f"{missing} are not options of {widget.label!r}")
        state.string_array_value.data.extend(values)
    elif kind == "number_input":
        if p.data_type == p.DataType.INT:
            state.int_value = int(value)
        else:
            state.double_value = float(value)
    elif kind == "slider":
        values = list(value) if isinstance(value, list | tuple) else [value]
        if p.options:
            state.string_array_value.data.extend(str(v) for v in values)
        else:
            state.double_array_value.data.extend(float(v) for v in values)
    elif kind in ("checkbox", "toggle"):
        state.bool_value = bool(value)
    elif kind in ("text_area", "text_input"):
        state.string_value = str(value)
    elif kind == "button_group":  # st.pills / st.segmented_control: the chosen options' texts
        values = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
        state.string_array_value.data.extend(values)
    else:
        raise ValueError(f"set_value does not handle {kind} widgets (use upload() or select())")
    return state


# ---- HTTP with a cookie jar --------------------------------------------------------------------------------
class _HandshakeCookies:
    """The websocket handshake's response headers, shaped as CookieJar.extract_cookies reads a response."""

    def __init__(self, headers: Any) -> None:
        self._headers = headers

    def info(self) -> _HandshakeCookies:
        return self

    def get_all(self, name: str, default: Any = None) -> Any:
        return self._headers.get_all(name) or default


@dataclass(frozen=True)
class HttpResult:
    status: int
    body: bytes
    seconds: float


class _Http:
    """Blocking HTTP for one session (its own cookies; never a proxy: loopback only)."""

    def __init__(self) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(self.jar)
        )

    def request(
        self, url: str, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> HttpResult:
        start = time.perf_counter()
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with self.opener.open(req, timeout=DEFAULT_TIMEOUT_S) as response:
                body, status = response.read(), response.status
        except urllib.error.HTTPError as error:
            body, status = error.read(), error.code
        return HttpResult(status, body, time.perf_counter() - start)

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def cookie_header(self, url: str) -> str | None:
        req = urllib.request.Request(url)
        self.jar.add_cookie_header(req)
        return req.get_header("Cookie") or req.unredirected_hdrs.get("Cookie")


def _multipart(field_name: str, file_name: str, data: bytes, mime: str) -> tuple[bytes, str]:
    """A multipart/form-data body with one file, as a browser's FormData sends it; (body, content type)."""
    boundary = f"----stclient{uuid.uuid4().hex}"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field_name}"; filename="{file_name}"\r\n'
        f"Content-Type: {mime}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


# ---- one browser session -------------------------------------------------------------------------------------
class Session:
    """One simulated browser tab: a websocket session with its cookies, widget values and message cache.

    Actions (open, set_value, upload, select, switch_page, rerun) run one at a time and return the Run
    they caused, once its script run has finished; they raise TimeoutError after `timeout_s` seconds
    and ProtocolError when the connection breaks.
    """

    def __init__(self, base_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, fetch_media: bool = True) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.fetch_media = fetch_media
        self.http = _Http()
        self.session_id = ""
        self.main_script_hash = ""
        self.page_script_hash = ""
        self.page_path = ""  # the URL path of the page shown ("text", "" for the default page)
        self.query_string = ""
        self.pages: dict[str, Any] = {}  # URL path -> AppPage (from the navigation message)
        self.last: Run | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task | None = None
        self._states: dict[str, WidgetState] = {}
        self.last_part: Run | None = None  # the last run of a fragment alone (after `last`), if any
        self._cache: dict[str, list[Any]] = {}  # hash -> [encoded ForwardMsg, run count when last used]
        self._run_count = 0
        self._max_age = 2
        self._building: Run | None = None
        self._waiter: asyncio.Future[Run] | None = None
        self._started = 0.0
        self._url_waiters: dict[str, asyncio.Future[FileURLsResponse]] = {}
        self._media_seen: set[str] = set()
        self._closed_reason = ""
        self.auto_reruns: dict[str, float] = {}  # fragment id -> its run_every interval (s), from the last full run
        self._run_watchers: list[asyncio.Future[Run]] = []  # `next_run`: whoever waits for the next run to finish

    # -- opening and closing
    @classmethod
    async def open(cls, base_url: str, page: str = "/", **options: Any) -> Session:
        """A new session on `page` (a path with its query string, e.g. "/text?head=5"), its first run done."""
        session = cls(base_url, **options)
        try:
            await session.connect(page)
        except BaseException:
            await session.close()
            raise
        return session

    async def connect(self, page: str = "/") -> Run:
        """Load `page` as a browser does (HTML, health, host config, websocket) and wait for the first run."""
        path, _, query = page.partition("?")
        self.page_path, self.query_string = path.strip("/"), query
        self._started = time.perf_counter()
        for url in (self.base_url + page, self.base_url + "/_stcore/health", self.base_url + "/_stcore/host-config"):
            result = await self._http(url)
            if result.status != 200:
                raise ProtocolError(f"GET {url}: HTTP {result.status} {result.body[:200]!r}")
        await self._open_socket()
        return await self._rerun(page_name=self.page_path, started=self._started)

    async def resume(self, within_s: float) -> Run | None:
        """Reconnect this tab after its connection dropped, as a browser does: the same session id (Streamlit
        resumes the session within server.disconnectedSessionTTL) and no rerun asked for (a browser whose page was
        drawn asks for none). Returns the run the server starts by itself within `within_s` seconds, else None."""
        self._closed_reason = ""
        self._waiter = asyncio.get_running_loop().create_future()
        self._started = time.perf_counter()
        await self._open_socket(resume=True)
        try:
            run = await asyncio.wait_for(asyncio.shield(self._waiter), within_s)
        except TimeoutError:
            self._waiter = None
            return None
        if self.fetch_media:
            await self._fetch_media(run)
        return run

    async def next_run(self, timeout_s: float) -> Run | None:
        """The next run of this session to finish, whoever started it (an action of this client, or the server by
        itself: a class session's students are woken by the server when the lecturer moves); None after
        timeout_s without one."""
        future: asyncio.Future[Run] = asyncio.get_running_loop().create_future()
        self._run_watchers.append(future)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return None
        finally:
            if future in self._run_watchers:
                self._run_watchers.remove(future)

    async def follow(
        self, fragment: str, interval: float, next_poll: float, most_s: float = float("inf")
    ) -> tuple[Run | None, float]:
        """A page whose `fragment` runs on the browser's timer every `interval` s (a class's poll) and whenever the
        server starts it: the next run the server starts by itself, or at `next_poll` (time.perf_counter()) the
        fragment's run the timer sends; waits at most most_s. Returns (that run, or None; when the next poll is
        due)."""
        run = await self.next_run(max(0.0, min(next_poll - time.perf_counter(), most_s)))
        if run is None and time.perf_counter() >= next_poll:
            run = await self.fragment_rerun(fragment)
            next_poll = time.perf_counter() + interval
        return run, next_poll

    async def _open_socket(self, resume: bool = False) -> None:
        xsrf = self.http.cookie(XSRF_COOKIE) or "PLACEHOLDER_AUTH_TOKEN"  # what the browser sends without one
        ws_url = "ws" + self.base_url[len("http") :] + "/_stcore/stream"
        cookie = self.http.cookie_header(self.base_url + "/_stcore/stream")
        self._ws = await connect(
            ws_url,
            subprotocols=["streamlit", xsrf, self.session_id] if resume else ["streamlit", xsrf],
            origin=self.base_url,
            additional_headers={"Cookie": cookie} if cookie else None,
            proxy=None,
            max_size=None,  # a page's messages reach megabytes (charts with their data, pictures in specs)
            open_timeout=self.timeout_s,
            ping_interval=None,  # the server pings; the library answers
        )
        if self._ws.response is not None:  # a load balancer may set its cookie on the upgrade response
            request = urllib.request.Request(self.base_url + "/_stcore/stream")
            self.http.jar.extract_cookies(_HandshakeCookies(self._ws.response.headers), request)
        self._reader = asyncio.create_task(self._read(), name="stclient-read")

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 10)
            except (TimeoutError, asyncio.CancelledError):
                self._reader.cancel()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- user actions
    async def rerun(self) -> Run:
        """Rerun the page with the widget values as they are (the browser's "Rerun")."""
        return await self._rerun()

    async def fragment_rerun(self, fragment_id: str) -> Run:
        """Run one fragment again, as the browser's timer does for `st.fragment(run_every=...)`; returns the
        fragment's run, or the app's full run when the fragment asked for one (st.rerun)."""
        return await self._rerun(fragment_id=fragment_id)

    async def set_value(
        self, label: str | None, value: Any, kind: str | None = None, key: str | None = None, in_fragment: bool = False
    ) -> Run:
        """Change one widget as a user would (found by label, kind or user key in the last run) and rerun.

        value: an option's text for select boxes and radios (a list of them for multiselects), a
        number, a bool for checkboxes and toggles, a string for text areas and inputs, a number or
        list of numbers for sliders. in_fragment: as a browser sends a change of a widget drawn in a fragment
        (`st.fragment`): that fragment's run alone (FINISHED_FRAGMENT_RUN_SUCCESSFULLY; the page's other
        elements stay as the last full run drew them); else the whole page's run.
        """
        if not in_fragment:
            widget = self._last().widget(label, kind, key)
            self._states[widget.id] = user_state(widget, value)
            return await self._rerun()
        drawn = self._last()
        if self.last_part is not None and any(w.key == key for w in self.last_part.widgets()):
            drawn = self.last_part  # a widget its fragment's last run drew (the last full run may not have)
        widget = drawn.widget(label, kind, key)
        fragment = drawn.fragments.get(widget.path, "")
        if not fragment:
            raise ValueError(f"{widget.label or widget.key!r} was not drawn in a fragment")
        self._states[widget.id] = user_state(widget, value)
        return await self._rerun(fragment_id=fragment, is_auto_rerun=False)

    async def click(self, label: str | None, key: str | None = None) -> Run:
        """Click the button with this label (or user key): its trigger is sent with one rerun, then forgotten (as a
        browser)."""
        widget = self._last().widget(label, "button", key)
        self._states[widget.id] = WidgetState(id=widget.id, trigger_value=True)
        try:
            return await self._rerun()
        finally:
            self._states.pop(widget.id, None)

    async def select(self, chart_key: str, param: str, points: Sequence[dict[str, Any]]) -> Run:
        """Set a Vega-Lite chart's selection (a click on a point of `param`) and rerun, as the browser does.

        chart_key: the user key the page gave the chart (e.g. "vit.picker"); points: the selected
        points' field values, e.g. [{"patch": 17}].
        """
        widget = self._last().widget(kind="vega_lite_chart", key=chart_key)
        if param not in widget.proto.selection_mode:
            raise ValueError(f"{chart_key} selects {list(widget.proto.selection_mode)}, not {param!r}")
        current = self._states.get(widget.id)
        selection = json.loads(current.string_value).get("selection", {}) if current is not None else {}
        selection[param] = list(points)
        value = json.dumps({"selection": selection}, separators=(",", ":"))  # as JSON.stringify writes it
        self._states[widget.id] = WidgetState(id=widget.id, string_value=value)
        return await self._rerun()

    async def upload(self, label: str, file_name: str, data: bytes, mime: str = "application/octet-stream") -> Run:
        """Upload one file to the file uploader with this label (replacing its files) and rerun."""
        return await self.upload_files(label, [(file_name, data, mime)])

    async def upload_files(self, label: str, files: Sequence[tuple[str, bytes, str]]) -> Run:
        """Upload several files (name, bytes, MIME type) to the file uploader with this label at once, as a
        browser does when several are dropped on a multi-file uploader (replacing its files), and rerun."""
        widget = self._last().widget(label, "file_uploader")
        started = time.perf_counter()
        request_id = uuid.uuid4().hex
        waiter = asyncio.get_running_loop().create_future()
        self._url_waiters[request_id] = waiter
        msg = BackMsg()
        msg.file_urls_request.request_id = request_id
        msg.file_urls_request.file_names.extend(name for name, _, _ in files)
        msg.file_urls_request.session_id = self.session_id
        await self._send(msg)
        response = await asyncio.wait_for(waiter, self.timeout_s)
        if response.error_msg:
            raise ProtocolError(f"file URLs refused: {response.error_msg}")
        state = WidgetState(id=widget.id)
        xsrf = self.http.cookie(XSRF_COOKIE)
        for (file_name, data, mime), urls in zip(files, response.file_urls):
            body, content_type = _multipart(file_name, file_name, data, mime)
            headers = {"Content-Type": content_type, "Origin": self.base_url}
            if xsrf:
                headers["X-Xsrftoken"] = xsrf
            put = await self._http(self._absolute(urls.upload_url), "PUT", body, headers)
            if put.status not in (200, 204):
                raise ProtocolError(f"upload PUT {urls.upload_url}: HTTP {put.status} {put.body[:300]!r}")
            info = state.file_uploader_state_value.uploaded_file_info.add()
            info.file_id, info.name, info.size = urls.file_id, file_name, len(data)
            info.file_urls.CopyFrom(urls)
        self._states[widget.id] = state
        return await self._rerun(started=started)

    async def switch_page(self, url_path: str, query: str = "") -> Run:
        """Go to another page of the app in this session (the sidebar's link), e.g. "vision".

        query: a query string for the new page (a link that carries one); the sidebar's links carry none.
        Widgets of the page left are forgotten; those the main script drew (outside the page) are kept.
        """
        page = self.pages.get(url_path.strip("/"))
        if page is None:
            raise LookupError(f"no page {url_path!r}; the app has {sorted(self.pages)}")
        self._states = {
            wid: s for wid, s in self._states.items() if self._script_of_widget.get(wid) == self.main_script_hash
        }
        self.query_string = query
        run = await self._rerun(page_script_hash=page.page_script_hash)
        self.page_path = page.url_pathname  # after: the browser's rerun message still carries the old address
        return run

    # -- internals
    def _last(self) -> Run:
        if self.last is None:
            raise ProtocolError("no run yet: open the session first")
        return self.last

    @property
    def _script_of_widget(self) -> dict[str, str]:
        last = self._last()
        return {w.id: last.scripts.get(w.path, "") for w in last.widgets(area=None)}

    def _absolute(self, url: str) -> str:
        return self.base_url + url if url.startswith("/") else url

    async def _http(
        self, url: str, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> HttpResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_pool(), self.http.request, url, method, data, headers)

    async def _send(self, msg: BackMsg) -> None:
        if self._ws is None:
            raise ProtocolError("not connected")
        try:
            await self._ws.send(msg.SerializeToString())
        except ConnectionClosed as error:
            raise ProtocolError(f"connection closed: {error}") from error

    def _client_state(
        self,
        msg: BackMsg,
        page_name: str,
        page_script_hash: str | None,
        fragment_id: str = "",
        is_auto_rerun: bool = True,
    ) -> None:
        rerun = msg.rerun_script
        if fragment_id:
            rerun.fragment_id, rerun.is_auto_rerun = fragment_id, is_auto_rerun
        rerun.query_string = self.query_string
        rerun.page_script_hash = self.page_script_hash if page_script_hash is None else page_script_hash
        rerun.page_name = page_name
        rerun.widget_states.widgets.extend(self._states.values())
        rerun.cached_message_hashes.extend(self._cache)
        context = rerun.context_info
        context.timezone, context.timezone_offset, context.locale = "UTC", 0, "en-US"
        context.url = f"{self.base_url}/{self.page_path}"  # the browser sends its address without the query
        context.is_embedded, context.color_scheme = False, "light"

    async def _rerun(
        self,
        page_name: str = "",
        page_script_hash: str | None = None,
        started: float = 0.0,
        fragment_id: str = "",
        is_auto_rerun: bool = True,
    ) -> Run:
        if self._waiter is not None and not self._waiter.done():
            raise ProtocolError("an action is still running in this session")
        if self._closed_reason:
            raise ProtocolError(self._closed_reason)
        msg = BackMsg()
        self._client_state(
            msg, page_name if not self.page_script_hash else "", page_script_hash, fragment_id, is_auto_rerun
        )
        self._waiter = asyncio.get_running_loop().create_future()
        self._started = started or time.perf_counter()
        await self._send(msg)
        try:
            run = await asyncio.wait_for(asyncio.shield(self._waiter), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no script_finished within {self.timeout_s:.0f} s") from None
        if self.fetch_media:
            await self._fetch_media(run)
        return run

    async def _fetch_media(self, run: Run) -> None:
        new = [url for url in dict.fromkeys(run.images()) if url.startswith("/media/") and url not in self._media_seen]
        if not new:
            return
        start = time.perf_counter()
        results = await asyncio.gather(*(self._http(self._absolute(url)) for url in new))
        run.media_s = time.perf_counter() - start
        for url, result in zip(new, results):
            run.media_bytes += len(result.body)
            if result.status == 200:
                self._media_seen.add(url)
            else:
                run.problems.append(f"media {url}: HTTP {result.status}")

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for data in self._ws:
                if isinstance(data, bytes):
                    self._on_message(data)
            self._closed_reason = "the server closed the connection"
        except ConnectionClosed as error:
            self._closed_reason = f"connection closed: {error}"
        except Exception as error:  # a bad message: fail the action that waits, not silently
            self._closed_reason = f"{type(error).__name__}: {error}"
        for future in [self._waiter, *self._url_waiters.values()]:
            if future is not None and not future.done():
                future.set_exception(ProtocolError(self._closed_reason))

    def _resolve(self, data: bytes) -> ForwardMsg:
        """The message, with a cache reference replaced by the cached message (keeping the reference's metadata)."""
        msg = ForwardMsg()
        msg.ParseFromString(data)
        if msg.metadata.cacheable:
            self._cache[msg.hash] = [data, self._run_count]
        if msg.WhichOneof("type") != "ref_hash":
            return msg
        entry = self._cache.get(msg.ref_hash)
        if entry is None:
            raise ProtocolError(f"cached ForwardMsg missing: {msg.ref_hash}")
        entry[1] = self._run_count
        full = ForwardMsg()
        full.ParseFromString(entry[0])
        full.metadata.CopyFrom(msg.metadata)
        if self._building is not None:
            self._building.n_refs += 1
        return full

    def _on_message(self, data: bytes) -> None:
        msg = self._resolve(data)
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self._on_new_session(msg)
        building = self._building
        if building is not None:
            building.n_messages += 1
            building.n_bytes += len(data)
        if kind == "delta" and building is not None:
            path = tuple(msg.metadata.delta_path)
            if msg.delta.WhichOneof("type") == "new_element":
                building.elements[path] = msg.delta.new_element
                building.scripts[path] = msg.metadata.active_script_hash
                building.fragments[path] = msg.delta.fragment_id
        elif kind == "navigation":
            self.pages = {p.url_pathname: p for p in msg.navigation.app_pages}
            if msg.navigation.page_script_hash:
                self.page_script_hash = msg.navigation.page_script_hash
        elif kind == "page_info_changed":
            self.query_string = msg.page_info_changed.query_string
        elif kind == "page_not_found" and building is not None:
            building.problems.append(f"page not found: {msg.page_not_found.page_name!r}")
        elif kind == "session_event" and building is not None:
            event = msg.session_event
            if event.WhichOneof("type") == "script_compilation_exception":
                building.problems.append(f"compile error: {event.script_compilation_exception.message}")
        elif kind == "auto_rerun":
            self.auto_reruns[msg.auto_rerun.fragment_id] = msg.auto_rerun.interval
        elif kind == "file_urls_response":
            waiter = self._url_waiters.pop(msg.file_urls_response.response_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg.file_urls_response)
        elif kind == "script_finished":
            self._on_script_finished(msg.script_finished)

    def _on_new_session(self, msg: ForwardMsg) -> None:
        new = msg.new_session
        self.session_id = new.initialize.session_id or self.session_id
        self.main_script_hash = new.main_script_hash
        self._max_age = new.config.max_cached_message_age
        self._building = Run(query_string=self.query_string)

    def _on_script_finished(self, status: int) -> None:
        run = self._building
        if status == FINISHED.FINISHED_EARLY_FOR_RERUN or run is None:
            return  # another run follows (its new_session starts a fresh Run)
        self._building = None
        run.status = status
        run.finished_at = time.perf_counter()
        if status == FINISHED.FINISHED_FRAGMENT_RUN_SUCCESSFULLY:  # a part of the page: the page's state stays
            run.elapsed_s = time.perf_counter() - self._started
            self.last_part = run
            for widget in run.widgets(area=None):  # a widget the part drew anew (a slider once its toggle is on)
                if widget.id not in self._states and (state := mounted_state(widget)) is not None:
                    self._states[widget.id] = state
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(run)
            self._tell_watchers(run)
            return
        run.page_script_hash = self.page_script_hash
        run.query_string = self.query_string
        run.elapsed_s = time.perf_counter() - self._started
        self._age_cache()
        self._mount_widgets(run)
        self.last, self.last_part = run, None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(run)
        self._tell_watchers(run)

    def _tell_watchers(self, run: Run) -> None:
        watchers, self._run_watchers = self._run_watchers, []
        for future in watchers:
            if not future.done():
                future.set_result(run)

    def _age_cache(self) -> None:
        self._run_count += 1
        for digest in [d for d, (_, used) in self._cache.items() if self._run_count - used > self._max_age]:
            del self._cache[digest]

    def _mount_widgets(self, run: Run) -> None:
        """Widget values after a run: new widgets take their default, set_value the server's; absent ones go."""
        states = {}
        for widget in run.widgets(area=None):
            server_set = bool(getattr(widget.proto, "set_value", False))
            if widget.id in self._states and not server_set:
                states[widget.id] = self._states[widget.id]
                continue
            state = mounted_state(widget)
            if state is not None:
                states[widget.id] = state
        self._states = states

    def widget_values(self) -> Iterator[tuple[str, WidgetState]]:
        """(widget id, the value this session would send) for every widget it holds a value for."""
        yield from self._states.items()

    def value(self, label: str | None = None, kind: str | None = None, key: str | None = None) -> Any:
        """A widget's current value as the user sees it (an option's text, a number, a list...); None if unset."""
        state = self._states.get(self._last().widget(label, kind, key).id)
        if state is None or state.WhichOneof("value") is None:
            return None
        value = getattr(state, state.WhichOneof("value"))
        return list(value.data) if hasattr(value, "data") else value
