"""A live class session in the app: the lecturer's view followed by the students, questions, the class's answers.

    class_session.before(pages)            # the shell, before the page: join from a link, open the lecturer's view
    class_session.sidebar()                # the sidebar's "Class" panel: start / join, code, link, QR, follow / fork
    class_session.offer(questions)         # a page: the questions its view can ask (tformer_views.class_questions)
    class_session.offer(questions, Intervention(ablate, clean))   # and what a head question's reveal ablates
    class_session.after(where, page_path)  # the shell, after the page: publish the lecturer's view; questions, answers

State lives in the store (tformer_app.class_store: this process, or Redis shared by the replicas). A student's
page polls one number, the session's version (a fragment), and opens the lecturer's view when it moved, unless
they forked (explored on their own; one click follows again). The poll runs the moment the class moves (the store
tells every server process, which wakes its students' polls: tformer_app.class_wake), and every POLL_S besides,
for a wake that was missed; the lecturer's change is sent as their run starts, not after their page drew it.
The lecturer's secret stays in the lecturer's session: students cannot change the view, ask, reveal or export.
A student's own input never reaches the store: only the answer they click or type, checked, once per question.

A student is one per browser, not per tab: the token the store signs when they join is kept in a cookie (`COOKIE`,
written by a small element of the page), so a reload takes them back into the class as the same student, and a
second join is the same student too. The end of a class (its lecturer's, its expiry, a store that lost it) is
found by the same poll (woken by the end), and said on the page at once, with what to do next.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import streamlit as st
import streamlit.components.v2 as components

from tformer_core.errors import InputError
from tformer_views import class_questions
from tformer_views.class_questions import (
    ClassError,
    Deferred,
    Question,
    ablation_effect,
    answer_chart,
    effect_chart,
    patch_answer_picker,
)

from . import class_wake, presenter
from .class_store import PRESENT_S, ClassEnded, ClassStore, Seat, View, open_store
from .events import clicked_patch
from .markdown import escape
from .url import PRESENT_PARAM, WRITTEN, foreseen_link, forget_pages

log = logging.getLogger("tformer_app")

SID = "_tformer.class.sid"
SECRET = "_tformer.class.secret"  # the lecturer's; never in a student's session
STUDENT = "_tformer.class.student"
FOLLOWING = "_tformer.class.following"
APPLIED = "_tformer.class.applied"  # the lecturer's view a following student's page opened last (a View)
FRESH = "_tformer.class.fresh"  # this run opened the lecturer's view (its own params are not a fork)
SEEN = "_tformer.class.seen"  # the session's version this page last drew
SENT = "_tformer.class.sent"  # the lecturer's view last published
OFFER = "_tformer.class.offer"  # the questions this run's page offered
ANSWERED = "_tformer.class.answered"  # (question id, round) -> the student's answer (their own screen only)
ASKING = "_tformer.class.asking"  # the lecturer's Ask click: (row, kind), asked when the panel is drawn
INTERVENTION = "_tformer.class.intervention"  # the offered questions' Intervention (the page's, this run)
INTERVENTIONS = "_tformer.class.interventions"  # the lecturer's: question id -> the Intervention its reveal runs
MESSAGE = "_tformer.class.message"  # a refusal to say: (text, when first shown) (a code that expired, a second answer)
SAY_S = 3.0  # how long a refusal stays said over the runs that follow the one that said it (`sidebar`)
PAGE_FILES = "_tformer.class.pages"  # url path -> the page's file (st.switch_page takes it from a fragment)
SHOW_CODE = "_tformer.class.show_code"  # the lecturer's: the join code and QR above the page, for the projector
TOKEN = "_tformer.class.token"  # the student's signed token in this tab (kept when they leave: a rejoin is them)
COOKIE_VALUE = "_tformer.class.cookie"  # what the browser's cookie is to hold ("" to forget it); absent: leave it
ENDED = "_tformer.class.ended"  # the notice of a class that ended under this student, until they dismiss it
OPENED = "_tformer.class.opened"  # this session ran `before` once: a link's ?class= joins on the first run only
FORESEEABLE = "_tformer.class.foreseeable"  # the lecturer's page whose link the last run wrote (url path)
STAMPED = "_tformer.class.stamped"  # when this student's presence was last told to the store (time.monotonic)
DRAWN = "_tformer.class.drawn"  # (page hash, url path, query) of the page the last whole run of this session drew
CLASS_PARAM = "class"  # a join link: /?class=K7M2QX
LECTURE_PARAM = "lecture"  # the lecturer's own link, for another device of theirs: /?lecture=<sid>.<secret>
SHOW_LECTURER_LINK = "_tformer.class.show_lecturer_link"
POLL_S = 2.0  # how often a student's page asks whether the class moved, should a wake be missed (class_wake)
COOKIE = "tformer_class"  # the browser's: "<token>" in a class, "<token>.away" after leaving it
AWAY = ".away"
NEXT = "Your page stays as it is; explore on your own or join another class."
NOTICES = {
    "ended": "The lecturer ended the class session. " + NEXT,
    "expired": "The class session has expired (its lecturer made no change for hours). " + NEXT,
    "lost": "The class session is no longer on the server (its store was restarted): ask your lecturer to start a "
    "new one and join it. " + NEXT,
}


def store() -> ClassStore:
    opened = open_store()
    opened.on_move(class_wake.wake)  # a move runs this process's students' polls at once (idempotent)
    return opened


def lecturing() -> bool:
    return SECRET in st.session_state and SID in st.session_state


def attending() -> bool:
    return STUDENT in st.session_state and SID in st.session_state


def _say(text: str) -> None:
    st.session_state[MESSAGE] = (text, None)


UNREACHABLE = "The class session cannot be reached just now (the server's store); the page goes on and tries again."


def guarded(action: Callable[..., Any]) -> Callable[..., Any]:
    """`action`, which asks the store, as one that cannot take the page down: a store that fails (Redis restarting,
    the network) is logged with its cause and said in one line, and the next run tries again."""

    @functools.wraps(action)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return action(*args, **kwargs)
        except ClassError:
            raise
        except Exception:
            log.exception("class session: %s failed", action.__name__)
            st.warning(UNREACHABLE)  # where the page is (a callback's: at the top of the next drawing)
            return None

    return run


def _leave_class() -> None:
    class_wake.forget()
    if attending() and TOKEN in st.session_state:  # a reload does not rejoin; a join by code is them again
        st.session_state[COOKIE_VALUE] = st.session_state[TOKEN] + AWAY
    if attending():
        try:  # the projector's count drops them now, not PRESENT_S later
            store().left(st.session_state[SID], st.session_state[STUDENT])
        except Exception as error:  # a class that is over, a store away a moment: nothing to count then
            log.debug("class session: a student's leaving was not stamped: %s", error)
    for key in (SID, SECRET, STUDENT, FOLLOWING, APPLIED, FRESH, SEEN, SENT, ANSWERED, PAGE_FILES, STAMPED):
        st.session_state.pop(key, None)


def _ended(error: ClassEnded) -> None:
    """The class is over under this student: say so above the page (until they dismiss it), forget the class, and
    the browser's token with it (the sidebar offers to join another)."""
    log.info("a student's class session is over (%s)", error.how)
    _leave_class()
    st.session_state[ENDED] = NOTICES[error.how]
    st.session_state[COOKIE_VALUE] = ""
    st.session_state.pop(TOKEN, None)


def client_address() -> str | None:
    """The address of this session's browser, as the server sees it; None for this machine (loopback). Behind the
    project's nginx (deploy/) that is the student's: Streamlit's server (uvicorn) takes X-Forwarded-For from a
    proxy on loopback, and only from there."""
    address = st.context.ip_address
    return address if isinstance(address, str) and address else None  # (AppTest's context is a stand-in)


def _browser_token() -> str:
    """The class token this browser kept (its cookie, as the page was opened), or ""."""
    token = st.context.cookies.get(COOKIE)
    return token if isinstance(token, str) else ""


# ---- before the page ----------------------------------------------------------------------------------------
@guarded
def before(pages: dict[str, Any], page_path: str = "") -> None:
    """Join from a link's ?class=CODE, open the lecturer's view on a following student's page when it moved, and
    send the lecturer's change to the class before their page draws it. Call it in the shell after st.navigation
    and before the page runs. pages: url path -> st.Page; page_path: the page this run shows."""
    st.session_state.pop(OFFER, None)
    st.session_state[DRAWN] = (_page_hash(), page_path, st.query_params.to_dict())
    first = OPENED not in st.session_state
    st.session_state[OPENED] = True
    lecture = st.query_params.get(LECTURE_PARAM)
    if lecture is not None:
        del st.query_params[LECTURE_PARAM]  # the secret leaves the address bar (and a reload does not use it again)
        if first:
            _take_over(lecture, pages)
    code = st.query_params.get(CLASS_PARAM)
    if code is not None:
        del st.query_params[CLASS_PARAM]  # a reload must not join again
        # Only a link the browser opened joins (a session's first run): a slide or a lecturer's view that carries
        # ?class= must never make a presenter or a student join that class.
        if first and not lecturing():
            _join(code, "")
    elif first and not lecturing() and not attending():
        _rejoin()
    if lecturing():
        _publish_early(page_path)
    if not attending():
        return
    try:
        # Read before the view: a move made meanwhile leaves the version ahead, and the next poll catches it.
        st.session_state[SEEN] = store().poll(st.session_state[SID])
        view = store().view(st.session_state[SID])
    except ClassEnded as error:
        _ended(error)
        return
    except ClassError as error:
        _say(str(error))
        _leave_class()
        return
    # The pages' files, for the poll to open the lecturer's page from its fragment (a path names a page there).
    st.session_state[PAGE_FILES] = {
        path: str(page._page) for path, page in pages.items() if isinstance(getattr(page, "_page", None), (str, Path))
    }
    if st.session_state.get(FOLLOWING, False) and view is not None and view.page in pages and _newer(view):
        _open(view, pages[view.page])
    applied = st.session_state.get(APPLIED)
    if st.session_state.get(FRESH) and applied is not None and applied.page in pages:
        # The run meant to draw the lecturer's view was cut short by a request the browser sent from the view it
        # showed before (the page's width, measured after each run; a widget's value): that page, or the same page
        # with its old link, ran instead, and the student stayed on it, "following", until the lecturer's next
        # change. Not their choice: they never saw the new view. With the same page, the address bar already
        # showed the new link (the CI run's student at head=5 in the address, its heatmap still head 1).
        query = st.query_params.to_dict()
        stale = [k for k, v in applied.params.items() if k != PRESENT_PARAM and query.get(k) != v]
        if page_path != applied.page or stale:
            log.info(
                "a student's old view ran before the lecturer's (page %r for %r, settings %s): opened again",
                page_path,
                applied.page,
                stale,
            )
            _open(applied, pages[applied.page])


def _page_hash() -> str:
    """The page this run is for, as Streamlit names it (the hash of its script)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return str(ctx.page_script_hash) if ctx is not None else ""


def _newer(view: View) -> bool:
    applied = st.session_state.get(APPLIED)
    return applied is None or view.version > applied.version


def _open(view: View, page: Any) -> None:
    """Open the lecturer's view on this student's page (`page`: an st.Page, or its file)."""
    st.session_state[APPLIED] = view
    st.session_state[FRESH] = True
    forget_pages()  # the lecturer's link rules the page, as a deck's slide does
    params = dict(view.params) | ({PRESENT_PARAM: "1"} if presenter.presenting() else {})
    st.switch_page(page, query_params=params)


@guarded
def _take_over(link: str, pages: dict[str, Any]) -> None:
    """The lecturer opened their own link on another device (the projector's laptop, a tablet): this session
    lectures the same class, from the class's current view; the first device keeps lecturing too."""
    sid, _, secret = str(link).partition(".")
    try:
        store().lecturer(sid, secret)
        view = store().view(sid)
    except ClassError as error:
        _say(f"This lecturer link does not open a class: {error}.")
        return
    _leave_class()
    st.session_state.update({SID: sid, SECRET: secret})
    log.info("class %s: its lecturer continues on another device", sid)
    if view is not None and view.page in pages:
        st.session_state[SENT] = View(page=view.page, params=view.params, slide=view.slide)  # no second publish
        st.switch_page(pages[view.page], query_params=dict(view.params))


@guarded
def _join(code: str, name: str) -> None:
    token = st.session_state.get(TOKEN) or _browser_token().removesuffix(AWAY)
    try:
        seat = store().join(code, name, client=client_address(), token=token)
    except ClassError as error:  # a wrong code is logged by the store, once per burst (tformer_app.throttle)
        _say(str(error))
        return
    _seated(seat)


@guarded
def _rejoin() -> None:
    """A reload (a new session of this browser): back in the class the browser's token names, as the same student,
    unless they left it. A token of a class that is over, or one no class signed, is forgotten."""
    token = _browser_token()
    if not token or token.endswith(AWAY):
        return
    try:
        seat = store().rejoin(token, client=client_address())
    except ClassError as error:
        log.info("a browser's class token was not taken back: %s", error)
        st.session_state[COOKIE_VALUE] = ""
        if isinstance(error, ClassEnded) and error.how != "lost":
            _say(str(error))
        return
    _seated(seat)


def _seated(seat: Seat) -> None:
    _leave_class()
    st.session_state.pop(ENDED, None)
    st.session_state.update(
        {SID: seat.sid, STUDENT: seat.student, TOKEN: seat.token, COOKIE_VALUE: seat.token, FOLLOWING: True}
    )
    st.session_state[ANSWERED] = {}  # read back from the store as questions come (a returning student's answers)


# ---- the sidebar ------------------------------------------------------------------------------------------
def sidebar() -> Any:
    """The sidebar's Class panel: start a session (lecturer) or join one (student); then the session's state.
    Returns where a student's state goes (`after` fills it once the page ran: a change of theirs forks)."""
    # Open while a class is on, a message is said, or a class ended under this student: the join it offers next is
    # in view (closed, its form is hidden from the student, and from a browser test's role query).
    opened = lecturing() or attending() or MESSAGE in st.session_state or ENDED in st.session_state
    with st.expander("Class session", expanded=opened):
        if lecturing():
            _lecturer_sidebar()  # a session that is over is left here, and said below
        message = _message()
        if message:
            st.warning(escape(message))
        if not lecturing() and not attending():
            _start_or_join()
        return st.container()


def _message() -> str | None:
    """The refusal to say in this run. Said in every run of its first SAY_S seconds, not only in the run that made
    it: that run is often cut short by the next one (the browser measures the page it opened, and the run that
    follows draws the sidebar again), and a wrong link's message was gone before anyone saw it."""
    said = st.session_state.get(MESSAGE)
    if said is None:
        return None
    text, since = said
    now = time.monotonic()
    if since is None:
        st.session_state[MESSAGE] = (text, now)
    elif now - since > SAY_S:
        del st.session_state[MESSAGE]
        return None
    return str(text)


def _start_or_join() -> None:
    with st.form("_tformer.class.join", border=False):
        st.text_input("Join code", key="_tformer.class.code", max_chars=16, placeholder="e.g. K7M2QX")
        st.text_input(
            "Your name (optional: only the lecturer's export shows it)", key="_tformer.class.name", max_chars=40
        )
        st.form_submit_button("Join the class", on_click=_join_clicked)
    st.button(
        "Start a class session",
        key="_tformer.class.start",
        on_click=_start,
        help="A join code and a QR code for the projector; the class's pages follow yours.",
    )


def _join_clicked() -> None:
    _join(str(st.session_state.get("_tformer.class.code", "")), str(st.session_state.get("_tformer.class.name", "")))


@guarded
def _start() -> None:
    try:
        lecture = store().create()
    except Exception as error:  # the store (Redis) failed: the lecturer is told, the app goes on single-user
        log.exception("a class session could not be started")
        _say(f"A class session could not be started ({type(error).__name__}); the app works on without one.")
        return
    _leave_class()
    st.session_state.update({SID: lecture.sid, SECRET: lecture.secret})


def _server_link(query: str) -> str:
    """This server's address (as the browser opened it) with `query`; a relative link when it is not known."""
    parts = urlsplit(str(st.context.url or ""))
    base = f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else ""
    return f"{base}/?{query}"


def join_link(code: str) -> str:
    """The address students open: this server's, with ?class=CODE (the QR code holds it)."""
    return _server_link(f"{CLASS_PARAM}={code}")


def lecturer_link(sid: str, secret: str) -> str:
    """The address that makes another device of the lecturer's lecture this class (`_take_over`)."""
    return _server_link(f"{LECTURE_PARAM}={sid}.{secret}")


def qr_svg(text: str, scale: int = 5) -> str:
    """The QR code of `text` as inline SVG (segno: nothing but the modules, no text or script in it)."""
    import segno

    return segno.make(text, error="m").svg_inline(scale=scale, border=2, dark="#000", light="#fff")


@guarded
def _lecturer_sidebar() -> None:
    sid, secret = st.session_state[SID], st.session_state[SECRET]
    try:
        code, students = store().code(sid), present_count(sid)
    except ClassError as error:
        _say(str(error))
        _leave_class()
        return
    st.markdown(f"Join code **{escape(code)}** · {students} student{'s' if students != 1 else ''}")
    link = join_link(code)
    st.code(link, language=None)
    st.image(qr_svg(link, 4), caption="Scan to join")
    # Its value in session state only (Asking a question hides the code from the panel): a default given here too
    # made Streamlit warn on every run after a question.
    st.session_state.setdefault(SHOW_CODE, True)
    st.checkbox("Show the join code above the page", key=SHOW_CODE)
    if st.checkbox("Lecture from another device", key=SHOW_LECTURER_LINK):
        st.caption("Open this link on your other device: it drives the class too. Whoever has it can, so keep it "
                   "off the projector and untick the box once it is open.")  # fmt: skip
        st.code(lecturer_link(sid, secret), language=None)
    st.caption("Your page and view are the class's. Questions and answers appear above your page.")
    names = st.checkbox("Students' chosen names in the export", key="_tformer.class.names")
    st.download_button(
        "Export answers (CSV)",
        lambda: store().export_csv(sid, secret, names=names),
        file_name=f"tformer-class-{code}.csv",
        mime="text/csv",
        key="_tformer.class.export",
        on_click="ignore",
    )
    with st.container(horizontal=True, gap="small"):
        st.button("Let students in again", key="_tformer.class.renew", on_click=_renew, help="Renews the join code")
        st.button("End the session", key="_tformer.class.end", on_click=_end)


@guarded
def _renew() -> None:
    try:
        store().renew_code(st.session_state[SID], st.session_state[SECRET])
    except ClassError as error:
        _say(str(error))


@guarded
def _end() -> None:
    try:
        store().end(st.session_state[SID], st.session_state[SECRET])
    except ClassError as error:
        log.info("ending a class session: %s", error)
    _leave_class()


def _student_status() -> None:
    following = st.session_state.get(FOLLOWING, False)
    st.markdown("**Following the lecturer**" if following else "**Exploring on your own**")
    if following:
        st.button(
            "Explore on my own", key="_tformer.class.fork", on_click=_fork, help="Your own input; the class goes on"
        )
    else:
        st.button("Follow the lecturer", key="_tformer.class.follow", on_click=_follow, type="primary")
    st.button("Leave the class", key="_tformer.class.leave", on_click=_leave_class)
    _watch()


def _fork() -> None:
    st.session_state[FOLLOWING] = False


def _follow() -> None:
    st.session_state[FOLLOWING] = True
    st.session_state[APPLIED] = None  # open the lecturer's view now, whatever was seen


@st.fragment(run_every=POLL_S)
def _watch() -> None:
    """Once every POLL_S: has the session moved (a view, a question, a reveal)? A new view of the lecturer's opens at
    once from here (one run of the page, not the shell's run first); anything else runs the whole page again."""
    _redraw_if_stale()
    try:
        sid = st.session_state[SID]
        class_wake.watch(sid)
        _here(sid, st.session_state[STUDENT])
        version = store().poll(sid)
        if version == st.session_state.get(SEEN):
            return
        view = store().view(sid) if st.session_state.get(FOLLOWING) else None
    except ClassEnded as error:  # said on the page at once: no student goes on reading "Following the lecturer"
        _ended(error)
        st.rerun(scope="app")
    except (ClassError, KeyError):
        return
    except Exception as error:  # the store is unreachable a moment: the page stays, the next poll tries again
        log.warning("class session poll failed: %s", error)
        return
    path = st.session_state.get(PAGE_FILES, {}).get(view.page) if view is not None else None
    if view is not None and path is not None and _newer(view):
        st.session_state[SEEN] = version
        _open(view, path)
    st.rerun(scope="app")


def _redraw_if_stale() -> None:
    """A poll asked for with another page than the one on screen draws that page again. A browser's request
    carries the page it showed when it sent it: a poll sent before the lecturer's page opened here (the page's run
    is long, a Vision Transformer's: the poll waits for it) ran for the old page, and Streamlit's browser then
    cleared the page's area for it, which a poll does not draw: students following the lecturer to the Vision
    Transformer saw an empty page until the lecturer's next change (7 of 16 arrivals)."""
    drawn = st.session_state.get(DRAWN)
    if drawn is None or _page_hash() == drawn[0]:
        return
    path = st.session_state.get(PAGE_FILES, {}).get(drawn[1])
    if path is None:
        return
    log.info("a student's poll came for a page no longer on screen: %r drawn again", drawn[1])
    st.switch_page(path, query_params=drawn[2])


# ---- the page offers questions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Intervention:
    """What a head question's reveal runs, once for the whole class: ablate(layer, head) -> the page's ablation of
    that head (tformer_views.head_matters.Ablation, cached for the server: results.head_ablation), and the number
    it changes, unablated (`clean`). Kept in the lecturer's session only: the store keeps what it showed."""

    ablate: Callable[[int, int], Any]
    clean: float
    grid: Any = None  # every head's drop [layers, heads] of the question's stack (the page's study), or None


def offer(questions: Callable[[], Sequence[Question | Deferred]], intervention: Intervention | None = None) -> None:
    """A page's questions about its view, computed only when a lecturer is in a session (they need every head);
    a page may offer twice in a run (its attention view's, then its interventions'). `intervention`: what the
    reveal of its head question ("which head, removed, ...") ablates. A Deferred question is made when asked."""
    if lecturing():
        st.session_state[OFFER] = [*st.session_state.get(OFFER, []), *questions()]
        if intervention is not None:
            st.session_state[INTERVENTION] = intervention


def offer_interventions(
    source: str, kind: str, inputs: tuple, trace: Any, head: tuple[str, int, int], page: str
) -> None:
    """A view's predict-then-intervene questions about its head (stack, layer, head): what the model predicts with
    it removed, and from which layer the lens ranks the answer first. Made when asked (one ablation, one lens
    pass), as requests of "Does this head matter?" for the same input (`head_matters.study(kind, model,
    *inputs)`): cached for the server and shared with that page."""
    if not lecturing():
        return
    from . import results  # the pages' computations (this module is imported before them, by the shell)

    output = int(trace.ranked(1)[0][0])
    stack, layer, index = head
    ablate = results.view_ablation(source, kind, inputs, output, stack, int(layer), int(index))
    lens = results.view_lens(source, kind, inputs, output)
    offer(
        lambda: class_questions.view_questions(
            trace.predictions(10),
            f"{stack} L{layer} H{index}",
            lambda: results.result(ablate),
            lambda: results.result(lens),
            page,
        )
    )


# ---- after the page -------------------------------------------------------------------------------------------
@guarded
def after(where: Any, status: Any, page_path: str) -> None:
    """The shell, after the page ran: the lecturer's view goes to the class, and the question panel is drawn in
    `where` (a container above the page): the lecturer's (ask, live answers, reveal) or a student's (answer).
    status: what `sidebar` returned (a student's follow / fork state, and the poll)."""
    if lecturing():
        written = st.session_state.get(WRITTEN)  # this page's, if it wrote its link in this run (else an older page's)
        mine = written is not None and _current_view(page_path).params == {
            k: v for k, v in written["params"].items() if k != PRESENT_PARAM
        }
        st.session_state[FORESEEABLE] = page_path if mine else None
        _publish(page_path)
        with where:
            _lecturer_panel()
    elif attending():
        _notice_fork(page_path)
        with status:
            _student_status()
        with where:
            _exploring_notice()
            _student_panel()
    with where:
        if ENDED in st.session_state:
            _ended_notice()
        _keep_cookie()


@guarded
def after_part(page_path: str) -> None:
    """After a part of the page ran alone (tformer_app.page.part: a fragment, without the shell around it): a
    lecturer's change in it goes to the class, and a following student's own change makes them explore, as
    `after` does for a whole run."""
    if lecturing():
        _publish(page_path)
    elif attending():
        _notice_fork(page_path)


def _exploring_notice() -> None:
    """A student who left the lecturer's view (a click, a key: ← → change the head) is told so on the page, with
    the way back: the sidebar that says it is hidden on a phone."""
    if st.session_state.get(FOLLOWING, False):
        return
    with st.container(key="tformer-class-exploring", horizontal=True, vertical_alignment="center"):
        st.info("You are exploring on your own: the lecturer's changes no longer reach your page.", icon="🧭")
        st.button("Follow the lecturer", key="_tformer.class.follow.page", on_click=_follow, type="primary")


def _ended_notice() -> None:
    with st.container(key="tformer-class-ended", horizontal=True, vertical_alignment="center"):
        st.warning(st.session_state[ENDED], icon="🔔")
        st.button("OK", key="_tformer.class.ended.ok", on_click=_dismiss)


def _dismiss() -> None:
    st.session_state.pop(ENDED, None)


# The browser keeps the student's token in a cookie (read by the server from the next page load on, as
# st.context.cookies): written by this element, which draws nothing, only when it differs ("" deletes it).
COOKIE_JS = """
export default function (component) {
  const d = component.data;
  if (!d || !d.name) return;
  const now = document.cookie.split("; ").find((c) => c.startsWith(d.name + "="));
  const want = d.value ? `${d.name}=${d.value}` : "";
  if (d.value ? now === want : !now) return;
  const secure = location.protocol === "https:" ? "; Secure" : "";
  document.cookie = d.value
    ? `${want}; path=/; max-age=${d.maxAge}; SameSite=Lax${secure}`
    : `${d.name}=; path=/; max-age=0; SameSite=Lax${secure}`;
}
"""
_cookie_component = components.component("tformer_class_cookie", js=COOKIE_JS)
COOKIE_CSS = "<style>.st-key-tformer-class-cookie { display: none; }</style>"


def _keep_cookie() -> None:
    value = st.session_state.get(COOKIE_VALUE)
    if value is None:
        return
    data = {"name": COOKIE, "value": value, "maxAge": store().settings.session_ttl_s}
    with st.container(key="tformer-class-cookie"):
        st.html(COOKIE_CSS)
        _cookie_component(key="_tformer.class.cookie_element", data=data, height=0)


def _current_view(page_path: str) -> View:
    params = {k: v for k, v in st.query_params.to_dict().items() if k != PRESENT_PARAM}
    return View(page=page_path, params=params, slide=st.session_state.get(presenter.SHOWING))


def _publish_early(page_path: str) -> None:
    """The lecturer's change (a head, a layer) sent to the class as this run starts, from the widget the click
    changed (`foreseen_link`): the students' pages draw it beside the lecturer's own, not after it (a follow took
    the lecturer's whole run more). What the page then writes is sent too, only if it differs (`_publish`)."""
    sent = st.session_state.get(SENT)
    if sent is None or sent.page != page_path or st.session_state.get(FORESEEABLE) != page_path:
        return  # another page, or one that wrote no link last time: its settings are known once it ran
    params = foreseen_link()
    if params is None:
        return
    params.pop(PRESENT_PARAM, None)  # each student's own presenter mode stays theirs (as `_current_view`)
    _publish(page_path, View(page=page_path, params=params, slide=st.session_state.get(presenter.SHOWING)))


def _publish(page_path: str, view: View | None = None) -> None:
    view = view or _current_view(page_path)
    if st.session_state.get(SENT) == view:
        return
    try:
        store().set_view(st.session_state[SID], st.session_state[SECRET], view)
        st.session_state[SENT] = view
    except ClassError as error:
        log.warning("the lecturer's view was not published: %s", error)
        _say(str(error))


def _notice_fork(page_path: str) -> None:
    """A following student who changed the page or a setting explores on their own from now on (the next move of
    the lecturer must not undo it); the sidebar's button follows again."""
    if presenter.measure_run():  # the browser measured the page it shows (perhaps the one it is leaving): no choice
        return
    if st.session_state.pop(FRESH, False) or not st.session_state.get(FOLLOWING):
        return
    applied = st.session_state.get(APPLIED)
    if applied is None:
        return
    mine = _current_view(page_path)
    # Only what the lecturer's link set counts: a setting the link leaves out may have a default of this session's.
    changed = [k for k, v in applied.params.items() if k in mine.params and mine.params[k] != v]
    if mine.page != applied.page or changed:
        log.info("a student forked: page %r -> %r, settings changed: %s", applied.page, mine.page, changed)
        st.session_state[FOLLOWING] = False


def _lecturer_panel() -> None:
    sid = st.session_state[SID]
    offered: list[Question | Deferred] = st.session_state.get(OFFER, [])
    intervention = st.session_state.pop(INTERVENTION, None)  # this run's page's, never a page before it
    asking = st.session_state.pop(ASKING, None)
    if asking is not None:
        index, kind = asking
        _ask_of_this_view(offered, index, kind, intervention)
    try:
        current = store().current(sid)
    except ClassError:
        return
    if st.session_state.get(SHOW_CODE, True):
        _join_banner(sid)
    else:
        with st.container(horizontal=True, gap="small", vertical_alignment="center"):
            _count(sid)
            st.button("Show the join code", key="_tformer.class.show", on_click=_show_code, args=(True,))
    if current is not None:
        _projector(sid, current.qid)
    if not offered:
        st.caption("Class session on: this page has no questions to ask the class; the text and vision pages and "
                   "“Does this head matter?” do.")  # fmt: skip
        return
    # Collapsed once a question was asked, and on the projector: the view, not the list, takes the first screen.
    with st.expander("Ask the class about this view", expanded=current is None and not presenter.presenting()):
        for i, q in enumerate(offered):
            with st.container(horizontal=True, gap="small", vertical_alignment="center"):
                st.markdown(f"**{q.kind}** · {escape(q.prompt)}")
                st.button("Ask", key=f"_tformer.class.ask.{i}", on_click=_ask_clicked, args=(i, q.kind))


def _show_code(show: bool) -> None:
    st.session_state[SHOW_CODE] = show


def _join_banner(sid: str) -> None:
    """The join code for the class to read off the projector, in one line with a small QR code and the live
    count, so that the view stays in the first screen (1280 x 720); *Hide* needs no sidebar."""
    try:
        code = store().code(sid)
    except ClassError:
        return
    link = join_link(code)
    with st.container(key="tformer-class-banner", horizontal=True, gap="small", vertical_alignment="center"):
        st.image(qr_svg(link, 2), width=72)
        st.markdown(f"**Join the class: code {escape(code)}** · {escape(link)}", width="content")
        _count(sid)
        st.button("Hide", key="_tformer.class.hide", on_click=_show_code, args=(False,), help="Hide the join code")


def present_count(sid: str) -> int:
    """The students whose page is open now (`ClassStore.present`)."""
    return len(store().present(sid))


@st.fragment(run_every=2.0)
@guarded
def _count(sid: str) -> None:
    """How many students are in the class now, live on the projector (students who left drop out)."""
    try:
        n = present_count(sid)
    except ClassError:
        return
    st.markdown(f"**{n} student{'s' if n != 1 else ''}**", width="content")


def _ask_clicked(index: int, kind: str) -> None:
    """An Ask click is asked at the end of the run it starts, of the view that run drew (`_ask_of_this_view`): a
    lecturer who changes the layer and clicks Ask before the page has redrawn clicks the button of the old view,
    whose question (about layer 2 while the class already follows to layer 3) no one sees any more."""
    st.session_state[SHOW_CODE] = False  # the question takes the projector's first screen (the box brings it back)
    st.session_state[ASKING] = (index, kind)


def _ask_of_this_view(
    offered: Sequence[Question | Deferred], index: int, kind: str, intervention: Intervention | None
) -> None:
    """Ask this run's question of the kind clicked (the same row when it is that kind); said when this view offers
    none (the lecturer left the page meanwhile)."""
    same = [q for q in offered if q.kind == kind]
    if not same:
        log.info("class session: an Ask of %r came for a view that offers none", kind)
        _say(f"This view asks no “{kind}” question: nothing was asked.")
    else:
        _ask(offered[index] if index < len(offered) and offered[index].kind == kind else same[0], intervention)
    said = st.session_state.get(MESSAGE)
    if said is not None and said[1] is None:  # this click's refusal: at the panel now, in the sidebar from the next run
        st.warning(escape(said[0]))


@guarded
def _ask(asked: Question | Deferred, intervention: Intervention | None = None) -> None:
    try:
        q = asked.make() if isinstance(asked, Deferred) else asked  # its model answer: an ablation, a lens (cached)
    except (InputError, ValueError) as error:
        _say(f"This question could not be made: {error}")
        return
    except Exception as error:  # not the store's: said as what it is, not as an unreachable class session
        log.exception("class session: a question's model answer failed")
        _say(f"This question could not be made ({type(error).__name__}); the server's log says why.")
        return
    try:
        qid = store().ask(st.session_state[SID], st.session_state[SECRET], q)
    except ClassError as error:
        _say(str(error))
        return
    if q.action == "ablate" and intervention is not None:
        st.session_state.setdefault(INTERVENTIONS, {})[qid] = intervention


def _answered_line(q: Question, votes: dict[str, float | int], present: set[str]) -> str:
    """ "3 of 40 answered": of the students present now (one who answered and left counts in neither)."""
    answered = len(votes.keys() & present)
    return f"{answered} of {len(present)} answered"


@st.fragment(run_every=1.0)
@guarded
def _projector(sid: str, qid: int) -> None:
    """The question and the class's answers, live: a histogram over the choices, or a heat over the patches or
    heads; after *Vote again*, the first vote beside the second. Once revealed: the model's answer outlined, and
    what the reveal ran (the class's head ablated beside the model's)."""
    try:
        q = store().question(sid, qid)
        first = store().answers(sid, qid, 1)
        second = store().answers(sid, qid, 2) if q.round == 2 else {}
        present = store().present(sid)
    except ClassError:
        return
    votes = second if q.round == 2 else first
    counts = [n for _, n in _histogram(q, votes)]
    total = sum(counts)
    st.subheader(f"Q{q.qid}. {escape(q.prompt)}")
    state = "revealed" if q.revealed else "closed" if q.closed else "open"
    vote = " (second vote)" if q.round == 2 else ""
    line = f"{_answered_line(q, votes, present)}{vote} · {state}"
    if q.revealed and q.answer is not None:
        right = counts[int(q.answer)] if q.kind != "number" else None
        line += f" · the model: **{escape(q.label(q.answer))}**"
        line += f" ({right} of {total} chose it)" if right is not None else ""
    st.markdown(line)
    if q.round == 2:
        shift = store().shift(sid, qid)
        if q.revealed and q.kind != "number":
            st.markdown(
                f"Right: {shift['first_right']} in the first vote, {shift['second_right']} in the second · "
                f"**{shift['moved']} moved to the model's answer**, {shift['left']} away from it"
            )
        left, right_column = st.columns(2)
        with left:
            _chart(q, [n for _, n in _histogram(q, first)], "First vote", f"{qid}.1")
        with right_column:
            _chart(q, counts, "Second vote", f"{qid}.2")
    else:
        model = effect_chart(q, presenter.scale()) if q.revealed else None
        if model is None:
            _chart(q, counts, "Class answers", str(qid))
        else:  # the class's votes beside the model's own grid or lens
            left, right_column = st.columns(2)
            with left:
                _chart(q, counts, "Class answers", str(qid))
            with right_column:
                st.vega_lite_chart(presenter.chart_fonts(model), key=f"_tformer.class.model.{qid}", width="content")
    if q.revealed:
        for text in q.effect.get("lines", []):
            st.markdown(f"- {escape(str(text))}")
    with st.container(horizontal=True, gap="small"):
        if not q.revealed:
            what = "Reveal: remove the class's head" if q.action == "ablate" else "Reveal the model's answer"
            st.button(what, key=f"_tformer.class.reveal.{qid}", on_click=_reveal, args=(qid,), type="primary")
        if q.round == 1 and q.kind != "number":
            st.button("Vote again", key=f"_tformer.class.again.{qid}", on_click=_vote_again, args=(qid,),
                      help="After the class has talked: a second vote, shown beside the first")  # fmt: skip
        if not q.closed:
            st.button("Close answers", key=f"_tformer.class.close.{qid}", on_click=_close, args=(qid,))


def _histogram(q: Question, votes: dict[str, float | int]) -> list[tuple[str, int]]:
    from tformer_views.class_questions import histogram

    return histogram(q, list(votes.values()))


def _chart(q: Question, counts: list[int], title: str, key: str) -> None:
    spec = answer_chart(q, counts, q.revealed, presenter.scale(), title=title)
    # A grid at its cells' size; bars across the column.
    width: Literal["content", "stretch"] = "content" if q.kind in ("patch", "head") else "stretch"
    st.vega_lite_chart(presenter.chart_fonts(spec), key=f"_tformer.class.chart.{key}", width=width)


@guarded
def _reveal(qid: int) -> None:
    """The model's answer to the class; a head question's reveal first ablates the head the class chose most (the
    current vote's), one intervention for the whole class, and keeps what it changed beside the model's head."""
    sid, secret = st.session_state[SID], st.session_state[SECRET]
    try:
        q = store().question(sid, qid)
        effect = None
        intervention = st.session_state.get(INTERVENTIONS, {}).get(qid)
        if q.action == "ablate" and intervention is not None:
            counts = [n for _, n in store().histogram(sid, qid, q.round)]
            try:
                effect = ablation_effect(q, counts, intervention.clean, intervention.ablate, intervention.grid)
            except InputError as error:  # the work refused (too long), the model gone: the answer is revealed
                effect = {"lines": [f"The ablation could not run: {error}"]}
            except Exception as error:  # a bug or the machine (out of memory): logged, and the answer revealed
                log.exception("class session: the reveal's ablation failed")
                effect = {"lines": [f"The ablation could not run ({type(error).__name__}); the server's log says why."]}
        elif q.action == "ablate":  # asked before this session (a reload of the lecturer's page lost it)
            effect = {"lines": ["The ablation is run by the lecturer's page that asked: ask again to run it."]}
        store().reveal(sid, secret, qid, effect=effect)
    except ClassError as error:
        _say(str(error))


@guarded
def _vote_again(qid: int) -> None:
    try:
        store().vote_again(st.session_state[SID], st.session_state[SECRET], qid)
    except ClassError as error:
        _say(str(error))


@guarded
def _close(qid: int) -> None:
    try:
        store().close(st.session_state[SID], st.session_state[SECRET], qid)
    except ClassError as error:
        _say(str(error))


def _student_panel() -> None:
    sid = st.session_state[SID]
    _here(sid, st.session_state[STUDENT])
    try:
        q = store().current(sid)
    except ClassError as error:
        _say(str(error))
        _leave_class()
        return
    if q is None:
        return
    with st.container(border=True, key="tformer-class-question"):
        again = " (vote again)" if q.round == 2 else ""
        st.markdown(f"**Q{q.qid}{again}. {escape(q.prompt)}**")
        answered = st.session_state.setdefault(ANSWERED, {})
        for vote in range(1, q.round + 1):
            if (q.qid, vote) not in answered:  # answered before a reload, or in another tab of this browser
                mine = store().answer_of(sid, q.qid, st.session_state[STUDENT], round=vote)
                if mine is not None:
                    answered[(q.qid, vote)] = mine
        first, mine = answered.get((q.qid, 1)), answered.get((q.qid, q.round))
        if q.round == 2 and first is not None:
            st.markdown(f"Your first answer: **{escape(q.label(first))}**")
        if mine is not None:
            st.markdown(f"Your {'second ' if q.round == 2 else ''}answer: **{escape(q.label(mine))}**")
        elif q.closed:
            st.caption("Answers are closed.")
        else:
            _answer_widget(q)
        if q.revealed and q.answer is not None:
            verdict = "" if mine is None else (" · you chose it too" if _same(q, mine) else "")
            st.markdown(f"The model's answer: **{escape(q.label(q.answer))}**{verdict}")
            for text in q.effect.get("lines", []):
                st.markdown(f"- {escape(str(text))}")


def _here(sid: str, student: str) -> None:
    """This student is present (the projector's count; PRESENT_S): said by their page's runs and its poll, at most
    every PRESENT_S / 3 (the poll runs every POLL_S anyway: no timer of its own for this)."""
    now = time.monotonic()
    if now - st.session_state.get(STAMPED, -PRESENT_S) < PRESENT_S / 3:
        return
    try:
        store().here(sid, student)
        st.session_state[STAMPED] = now
    except Exception as error:  # the count is the lecturer's: a store that fails a moment only loses a stamp
        log.debug("class session: a student's presence was not stamped: %s", error)


def _same(q: Question, value: float | int) -> bool:
    if q.answer is None:
        return False
    if q.kind == "number":
        return abs(float(value) - float(q.answer)) <= 0.05 * (q.hi - q.lo)
    return int(value) == int(q.answer)


def _answer_widget(q: Question) -> None:
    key = f"_tformer.class.answer.{q.qid}.{q.round}"
    if q.kind == "number":
        with st.form(key, border=False):
            st.number_input(
                "Your answer", min_value=q.lo, max_value=q.hi, value=None, step=0.01, key=f"{key}.n", format="%.4f"
            )
            st.form_submit_button("Answer", on_click=_submit_number, args=(q, f"{key}.n"))
        return
    if q.kind in ("patch", "head") and q.grid:
        where = "the picture's patches" if q.kind == "patch" else "the grid: layers down, heads across"
        st.caption(f"Click a cell of {where}.")
        st.vega_lite_chart(
            patch_answer_picker(q),
            key=key,
            width="content",  # its own cells' size, which fits a phone (not stretched over a laptop's column)
            on_select=lambda: _submit_patch(q, key),
            selection_mode="patch",
        )
        return
    options = list(range(len(q.choices)))
    labels = {"token": "Click a token", "patch": "Click a patch", "head": "Click a head"}
    labels |= {"output": "Click an output", "layer": "Click a layer"}
    shown = [escape(c) for c in q.choices]  # a pill's label is Markdown: a token such as "**" or "[x](y)" stays text
    st.pills(labels[q.kind], options, key=key, format_func=shown.__getitem__, on_change=_submit_choice, args=(q, key))


@guarded
def _submit_choice(q: Question, key: str) -> None:
    value = st.session_state.get(key)
    if value is not None:
        _submit(q, str(value))


@guarded
def _submit_patch(q: Question, key: str) -> None:
    patch = clicked_patch(st.session_state.get(key))
    if patch is not None:
        _submit(q, str(patch))


@guarded
def _submit_number(q: Question, key: str) -> None:
    value = st.session_state.get(key)
    if value is None:
        _say("Type a number first.")
        return
    _submit(q, repr(float(value)))


@guarded
def _submit(q: Question, raw: str) -> None:
    if (q.qid, q.round) in st.session_state.get(ANSWERED, {}):
        # The same click told twice: a poll of the fragment that ran while the click's own run was under way carries
        # the widget's new value too. The answer is in; a second "already answered" would only puzzle the student.
        return
    try:
        value = store().answer(st.session_state[SID], q.qid, st.session_state[STUDENT], raw, client_address())
    except ClassError as error:
        _say(str(error))
        return
    st.session_state.setdefault(ANSWERED, {})[(q.qid, q.round)] = value
