"""deploy/: two replicas of the app behind nginx, driven through the proxy by sessions that speak the browser's
protocol (benchmarks/stclient.py): each session gets its page, changes a widget, uploads a picture to the
Vision Transformer page and gets the pictures drawn from it, all through nginx. That only works when the
websocket, the upload and the media requests of a session reach the same replica (the route cookie).

Needs Debian's nginx (`apt-get install nginx`); skips and says so without it. Offline, on the CPU, with
the bundled models (MiniLM, vit-tiny).
"""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from deploy.redis_server import find_redis
from deploy.serve import ROUTE_COOKIE, Deployment, find_nginx

pytestmark = pytest.mark.slow  # two replicas and nginx started, models loaded in each
stclient = pytest.importorskip("benchmarks.stclient", reason="benchmarks/stclient.py needs Streamlit's websockets")

SESSIONS = 4
TIMEOUT_S = 240.0  # per action: a busy 2-core machine, two replicas importing torch and loading models at once
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TFORMER_DEVICE": "cpu"}
PER_ADDRESS = {"TFORMER_CLASS_PER_ADDRESS": "1"}  # one new student a minute per address (loopback: not counted)
WARM_PAGE = "/text?layer=1&head=2"


@pytest.fixture(scope="module")
def deployment(smollm2_if_installed):
    """Two replicas behind nginx; smollm2 converted first (tests/conftest.py), which each replica would otherwise
    start converting in the background as it starts."""
    if find_nginx() is None:
        pytest.skip("nginx is not installed: apt-get install nginx (Debian's package) to test the deployment")
    env = OFFLINE | PER_ADDRESS
    # Class sessions in Redis; each replica opens the Text attention page once before nginx starts, as the CLI does.
    with Deployment(replicas=2, env=env, redis=find_redis() is not None, warm=(WARM_PAGE,)) as d:
        yield d


def picture(n: int) -> bytes:
    """A PNG of its own for session n: its pictures' media URLs (content hashes) are on its replica only."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), (30, 30, 30))
    ImageDraw.Draw(image).ellipse((12, 12, 52, 52), fill=(250, 200 - 40 * n, 40 * n))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


async def one_user(url: str, head: str, png: bytes) -> tuple[str, list[str]]:
    """A student: the Text attention page, a head change, then the Vision page with an upload.

    Returns (the route cookie the session was given, the media URLs of the uploaded picture's pictures).
    """
    async with await stclient.Session.open(url, "/text?layer=0&head=0", timeout_s=TIMEOUT_S) as s:
        assert s.last.finished and not s.last.errors, s.last.errors
        assert "Heatmap · layer 0, head 0" in s.last.headings()
        run = await s.set_value("Head", head)
        assert not run.errors and f"Heatmap · layer 0, head {head}" in run.headings()

        run = await s.switch_page("vision", "model=vit-tiny&from=upload")  # a link to the upload view
        assert not run.errors, run.errors
        uploader = run.widget(kind="file_uploader", key="vit.upload")
        run = await s.upload(uploader.label, "circle.png", png, "image/png")
        assert run.finished and not run.errors, run.errors
        assert "What the model sees: top 5" in run.headings() and "Patches" in run.headings()
        media = [u for u in run.images() if u.startswith("/media/")]
        assert media and run.media_bytes > 0 and not run.problems, run.problems  # served by the same replica
        return s.http.cookie(ROUTE_COOKIE) or "", media


def test_each_replica_drew_the_warm_page_before_nginx_took_anyone(deployment):
    """A fresh replica imports torch, starts the device and loads the page's model on its first visit (10 s on a
    GPU host; every student who arrived meanwhile waited): each one has drawn the page already, directly, not
    through nginx."""
    assert sorted(w.replica for w in deployment.warmed) == sorted(deployment.replica_urls)
    for warmed in deployment.warmed:
        assert warmed.page == WARM_PAGE and warmed.ok, warmed
        assert "Heatmap · layer 1, head 2" in warmed.headings, warmed.headings  # the page, with its model's heads
    assert "layer=1&head=2" not in deployment.access_log()  # nginx took nobody before: not even the warm-up


def test_a_page_to_warm_is_a_path():
    with pytest.raises(ValueError, match="paths beginning with '/'"):
        Deployment(replicas=1, warm=("text",))


def test_sessions_work_end_to_end_through_nginx_on_both_replicas(deployment):
    async def class_of(n: int):
        return await asyncio.gather(*(one_user(deployment.url, str(1 + i % 5), picture(i)) for i in range(n)))

    results = stclient.run_sync(class_of(SESSIONS))
    routes = sorted(route for route, _ in results)
    assert set(routes) == {"r0", "r1"}, routes  # new sessions are spread over both replicas

    # Each replica took websockets of its own (nginx's log: the upgrade's status and the replica that answered).
    log = deployment.access_log()
    upgrades = re.findall(r'"GET /_stcore/stream HTTP/1.1" 101 .* upstream="127\.0\.0\.1:(\d+)"', log)
    assert sorted(set(map(int, upgrades))) == sorted(deployment.ports), upgrades
    assert "PUT /_stcore/upload_file/" in log
    # Every request that carried a route cookie was answered by that replica (no failover moved a session).
    for route, port in re.findall(r'route="r(\d)" upstream="127\.0\.0\.1:(\d+)"', log):
        assert deployment.ports[int(route)] == int(port), (route, port)

    # The control: a session's picture asked of the other replica is not there. Stickiness is what made it work.
    route, media = results[0]
    other = "r1" if route == "r0" else "r0"
    stray = stclient._Http()
    stray.opener.addheaders = [("Cookie", f"{ROUTE_COOKIE}={other}")]
    assert stray.request(deployment.url + media[0]).status == 404


def test_replicas_on_a_gpu_machine_share_its_memory(monkeypatch):
    """With a GPU (nvidia-smi answers), each of K replicas gets 90 % of its memory / K as TFORMER_GPU_MB, unless
    --gpu-mb or the environment says otherwise; without one, no GPU budget is set."""
    if find_nginx() is None:
        pytest.skip("nginx is not installed: apt-get install nginx (Debian's package) to test the deployment")
    import deploy.serve as serve

    monkeypatch.delenv("TFORMER_GPU_MB", raising=False)
    monkeypatch.setattr(serve, "gpu_memory_mb", lambda: 81559.0)  # an H100's 80 GB, as nvidia-smi gives it
    assert Deployment(replicas=4).env["TFORMER_GPU_MB"] == "18351"  # 0.9 * 81559 / 4
    assert Deployment(replicas=4, gpu_mb=5000).env["TFORMER_GPU_MB"] == "5000"
    assert Deployment(replicas=4, env={"TFORMER_GPU_MB": "7000"}).env["TFORMER_GPU_MB"] == "7000"
    monkeypatch.setattr(serve, "gpu_memory_mb", lambda: None)  # no GPU
    assert "TFORMER_GPU_MB" not in Deployment(replicas=4).env


async def poll_until(session, fragment: str, condition, timeout_s: float = TIMEOUT_S):
    """The browser's timer for a fragment's run_every: run it again until `condition(run)` holds for the page's last
    full run or the fragment's own run (the projector's counts are drawn by its fragment alone)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    run = session.last
    while not (condition(session.last) or condition(run)):
        assert asyncio.get_running_loop().time() < deadline, "the page never showed what was expected"
        run = await session.fragment_rerun(fragment)
        await asyncio.sleep(0.2)  # pacing only: the app's own poll is every 2 s (and woken by each move)


def test_a_class_session_follows_across_replicas(deployment):
    """A lecturer and two students through nginx: the students land on both replicas, and every one of them
    follows the lecturer's head and answers a question the lecturer's projector counts (the store is Redis)."""
    if deployment.redis is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server): class sessions across "
                    "replicas not tested")  # fmt: skip

    async def lesson():
        url = deployment.url
        lecturer = await stclient.Session.open(url, "/text?layer=2&head=1", timeout_s=TIMEOUT_S, fetch_media=False)
        run = await lecturer.click("Start a class session")
        code = next(m.group(1) for t in run.texts() if (m := re.search(r"code \**([A-Z0-9]{6})\*\*", t)))
        students = [
            await stclient.Session.open(url, f"/?class={code}", timeout_s=TIMEOUT_S, fetch_media=False)
            for _ in range(2)
        ]
        routes = {s.http.cookie(ROUTE_COOKIE) for s in students}
        assert routes | {lecturer.http.cookie(ROUTE_COOKIE)} == {"r0", "r1"}  # someone is on the other replica
        for s in students:
            assert "head=1" in s.query_string and "layer=2" in s.query_string  # the join opened the lecturer's view
        await lecturer.set_value("Head", "5")
        for s in students:
            watch = next(iter(s.auto_reruns))
            await poll_until(s, watch, lambda run: "Heatmap · layer 2, head 5" in run.headings())
        await lecturer.click("Ask", key="_tformer.class.ask.0")
        for s, token in zip(students, ("animal", "it")):
            await poll_until(
                s, next(iter(s.auto_reruns)), lambda run: any(w.label == "Click a token" for w in run.widgets())
            )
            run = await s.set_value("Click a token", token, kind="button_group")
            assert f"Your answer: **{token}**" in run.texts()
        # The projector's answers, once a second in a browser (the banner's count of students: every 2 s).
        projector = min(lecturer.auto_reruns, key=lecturer.auto_reruns.__getitem__)
        await poll_until(lecturer, projector, lambda run: any("2 of 2 answered" in t for t in run.texts()))
        for s in [lecturer, *students]:
            await s.close()

    stclient.run_sync(lesson())


def test_class_limits_count_the_students_address_behind_nginx(deployment, monkeypatch):
    """Behind the project's nginx every connection comes from loopback; the replica counts the address nginx puts in
    X-Forwarded-For (its last entry: the one nginx saw). Two students from 10.9.8.7 with no cookie are two new
    students from one address: the second is refused (TFORMER_CLASS_PER_ADDRESS=1); 10.9.8.6 and the deployment's
    own machine are not held back by it."""
    real_connect = stclient.connect

    def from_address(address: str | None):
        def connect(*args, additional_headers=None, **kwargs):
            headers = dict(additional_headers or {}) | ({"X-Forwarded-For": address} if address else {})
            return real_connect(*args, additional_headers=headers, **kwargs)

        return connect

    async def joins() -> list[tuple[str | None, bool, list[str]]]:
        url = deployment.url
        lecturer = await stclient.Session.open(url, "/", timeout_s=TIMEOUT_S, fetch_media=False)
        run = await lecturer.click("Start a class session")
        code = next(m.group(1) for t in run.texts() if (m := re.search(r"code \**([A-Z0-9]{6})\*\*", t)))
        seen = []
        for address in ("10.9.8.7", "10.9.8.7", "10.9.8.6", None, None):
            monkeypatch.setattr(stclient, "connect", from_address(address))
            s = await stclient.Session.open(url, f"/?class={code}", timeout_s=TIMEOUT_S, fetch_media=False)
            sidebar = [e.markdown.body for _, e in s.last.items("markdown", 1)]
            refusals = [e.alert.body for _, e in s.last.items("alert", 1) if "too many" in e.alert.body]
            seen.append((address, "**Following the lecturer**" in sidebar, refusals))
            await s.close()
        await lecturer.close()
        return seen

    assert stclient.run_sync(joins()) == [
        ("10.9.8.7", True, []),
        ("10.9.8.7", False, ["too many students joined from your address just now; try again in a minute"]),
        ("10.9.8.6", True, []),
        (None, True, []),
        (None, True, []),
    ]
