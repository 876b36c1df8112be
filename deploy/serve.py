"""Run tformer for a class: K Streamlit replicas (one per core) behind nginx, sessions pinned to a replica.

    .venv/bin/python deploy/serve.py --replicas 2 --port 8500 [--cache-mb 768] [--host 0.0.0.0] [--gpu-mb 4096]
    deploy/run.sh --replicas 2 --port 8500                         # the same, with the checkout's .venv

Before nginx takes anyone, each replica opens the pages of --warm (default: the Text attention and Vision
Transformer pages) once, as a browser does: a fresh replica imports torch, starts the GPU and loads the page's
model on its first visit, 10 s on a GPU host, and every student who arrived meanwhile waited for it (100 students
on 15 cold replicas: p95 of opening a page 10.2 s, then 0.09 s warm).

With --redis, Debian's redis-server too (class sessions shared by the replicas: TFORMER_REDIS_URL).

Starts `streamlit run app.py` K times on loopback ports (`--first-port`, the next K-1 after it), each with
its memory budget (TFORMER_CACHE_MB from --cache-mb, else as the environment has it; TFORMER_MODELS_MB
and TFORMER_PASSES pass through), torch threads set to cores / K (OMP_NUM_THREADS, unless set) and one
cookie secret for all. On a machine with an NVIDIA GPU (nvidia-smi answers) the replicas share it: each gets
TFORMER_GPU_MB from --gpu-mb, else 90 % of the GPU's memory / K (unless the environment sets it), and
TFORMER_PASSES counts the passes of all of them together on that GPU (tformer_app.gpu). Then Debian's nginx
with a config generated from deploy/nginx.conf.template in
a temporary prefix (its own pid file, logs and temporary files: no system configuration is read or
written). Waits until every replica answers /_stcore/health, and nginx too; stops everything on Ctrl-C,
SIGTERM or exit, and if any of them dies. The children also get SIGTERM if this process is killed.

As a library (the deploy test, benchmarks/load.py --start):

    with Deployment(replicas=2, warm=("/text",)) as d:       # free ports unless given; no warm-up unless asked
        d.url, d.replica_urls, d.pids(), d.access_log(), d.warmed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import grp
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: deploy.redis_server beside this file

from deploy.redis_server import RedisServer  # noqa: E402

TEMPLATE = Path(__file__).resolve().with_name("nginx.conf.template")
UPLOAD_MB = 25  # the app's server.maxUploadSize (.streamlit/config.toml)
ROUTE_COOKIE = "tformer_route"
NGINX_CANDIDATES = ("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx")


def find_nginx() -> str | None:
    """The nginx binary (Debian puts it in /usr/sbin, often not on a user's PATH), or None."""
    for candidate in NGINX_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


GPU_SHARE = 0.9  # of a GPU's memory, what the replicas divide between them (the rest: CUDA contexts, slack)


def gpu_memory_mb() -> float | None:
    """The first NVIDIA GPU's memory in MB, from nvidia-smi (no torch import here); None without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_config(prefix: Path, listen: str, ports: list[int], user: str | None, upload_mb: int = UPLOAD_MB) -> str:
    """The nginx configuration for replicas on these loopback ports (replica i is route "r<i>").

    Replica i's backup is replica i+1: while replica i is down, its sessions' requests go there (a
    browser's reconnection starts a new session on it).
    """
    route_map, served_map, upstreams = [], [], []
    # Idle connections to a replica are closed by nginx after 4 s, before uvicorn closes them (5 s): a request
    # sent on a connection the replica is closing fails, and nginx would retry it on another replica.
    keepalive = "        keepalive 16;\n        keepalive_timeout 4s;\n    }"
    # A replica counts as down after 3 failures in 10 s, not 1: one slow moment must not send requests away.
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=3;" for p in ports)
    upstreams.append(f"    upstream tformer_any {{  # new sessions: in turn\n{servers}\n{keepalive}")
    for i, port in enumerate(ports):
        route_map.append(f"        r{i} tformer_r{i};")
        # $upstream_addr lists every address tried ("a, b" after a failover): the last one answered.
        served_map.append(f'        "~(^|, )127\\.0\\.0\\.1:{port}$" r{i};')
        backup = f"\n        server 127.0.0.1:{ports[(i + 1) % len(ports)]} backup;" if len(ports) > 1 else ""
        primary = f"        server 127.0.0.1:{port} max_fails=3;"
        upstreams.append(f"    upstream tformer_r{i} {{\n{primary}{backup}\n{keepalive}")
    fields = {
        "@USER@": f"user {user};" if user else "# (not root: the workers run as this user)",
        "@PREFIX@": str(prefix),
        "@ROUTE_MAP@": "\n".join(route_map),
        "@SERVED_MAP@": "\n".join(served_map),
        "@UPSTREAMS@": "\n".join(upstreams),
        "@LISTEN@": listen,
        "@UPLOAD_MB@": str(upload_mb),
        "@BODY_MB@": str(upload_mb + 1),
    }
    text = TEMPLATE.read_text()
    for name, value in fields.items():
        text = text.replace(name, value)
    return text


def _die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the process that started it dies (Linux), so none is left over."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


WARM_PAGES = ("/text", "/vision")  # what a class opens first: the CLI's default --warm


@dataclass(frozen=True)
class Warmed:
    """One page's first visit on one replica, before nginx took anyone: how long it took, what it drew."""

    replica: str  # its address
    page: str
    seconds: float
    finished: bool
    errors: tuple[str, ...]
    headings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.finished and not self.errors


def warm_replicas(urls: Sequence[str], pages: Sequence[str], timeout_s: float) -> list[Warmed]:
    """Open each page once on each replica, as a browser does (every replica at once, its pages in turn), so that
    the replica has imported what the pages need, started the device and loaded their models before any student
    comes. A page that fails is reported, not raised: the class can still use the others."""
    # benchmarks/stclient.py speaks Streamlit's browser protocol (tested by the deploy and load tests); imported
    # here only when warming, as the CLI does by default.
    from benchmarks.stclient import ProtocolError, Session, run_sync

    async def visit(url: str, page: str) -> Warmed:
        started = time.perf_counter()
        try:
            async with await Session.open(url, page, timeout_s=timeout_s, fetch_media=False) as session:
                run = session.last
                seconds = time.perf_counter() - started
                if run is None:
                    return Warmed(url, page, seconds, False, ("no script run",), ())
                return Warmed(url, page, seconds, run.finished, tuple(run.errors), tuple(run.headings()))
        except (OSError, ProtocolError, TimeoutError) as error:
            return Warmed(url, page, time.perf_counter() - started, False, (f"{type(error).__name__}: {error}",), ())

    async def replica(url: str) -> list[Warmed]:
        return [await visit(url, page) for page in pages]

    async def every_replica() -> list[list[Warmed]]:
        return await asyncio.gather(*(replica(url) for url in urls))

    return [w for found in run_sync(every_replica()) for w in found]


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(f"{url}/_stcore/health", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Deployment:
    """K replicas of the app and nginx in front of them; a context manager that starts and stops them all.

    port / first_port: nginx's and the first replica's port (0: free ports). cache_mb: each replica's
    TFORMER_CACHE_MB (None: the environment's). threads: each replica's OMP_NUM_THREADS (None: cores / K,
    unless the environment sets it). gpu_mb: each replica's TFORMER_GPU_MB (None: the environment's, else
    GPU_SHARE of the GPU's memory / K when there is a GPU). env: more environment for the replicas. host:
    where nginx listens. redis: start Debian's redis-server for class sessions (loopback, no persistence) and
    give the replicas its TFORMER_REDIS_URL, unless the environment names a Redis already; without one a class
    session lives in the replica that started it, and students sent to another replica cannot join it. warm:
    pages (paths with their query strings, e.g. "/text?model=...") each replica opens once before nginx starts
    (`warm_replicas`); what they drew is in `warmed`.
    """

    def __init__(
        self,
        replicas: int = 2,
        port: int = 0,
        first_port: int = 0,
        host: str = "127.0.0.1",
        app: Path = ROOT / "app.py",
        cache_mb: float | None = None,
        threads: int | None = None,
        gpu_mb: float | None = None,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        keep: bool = False,
        redis: bool = False,
        warm: Sequence[str] = (),
    ) -> None:
        if not 1 <= replicas <= 64:
            raise ValueError(f"replicas must be 1..64, not {replicas}")
        if any(not page.startswith("/") for page in warm):
            raise ValueError(f"pages to warm are paths beginning with '/', not {list(warm)}")
        self.warm, self.warmed = tuple(warm), list[Warmed]()
        self.nginx = find_nginx()
        if self.nginx is None:
            raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx)")
        self.app = Path(app).resolve()
        self.port = port or free_port()
        self.ports = [first_port + i for i in range(replicas)] if first_port else [free_port() for _ in range(replicas)]
        self.host = host
        self.python = python
        self.keep = keep
        self.env = dict(env or {})
        if cache_mb is not None:
            self.env["TFORMER_CACHE_MB"] = f"{cache_mb:g}"
        if threads is None and "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.env:
            threads = max(1, (os.cpu_count() or 1) // replicas)
        if threads is not None:
            self.env["OMP_NUM_THREADS"] = str(threads)
        if gpu_mb is None and "TFORMER_GPU_MB" not in os.environ and "TFORMER_GPU_MB" not in self.env:
            total = gpu_memory_mb()
            gpu_mb = None if total is None else GPU_SHARE * total / replicas
        if gpu_mb is not None:
            self.env["TFORMER_GPU_MB"] = f"{gpu_mb:.0f}"
        # One secret for all: a signed cookie one replica sets (st.login) must read the same on another.
        self.env.setdefault("STREAMLIT_SERVER_COOKIE_SECRET", secrets.token_hex(32))
        self.want_redis = redis and not (self.env.get("TFORMER_REDIS_URL") or os.environ.get("TFORMER_REDIS_URL"))
        self.redis: RedisServer | None = None
        self.prefix: Path | None = None
        self.replicas: list[subprocess.Popen] = []
        self.nginx_process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """nginx's address, as a browser on this machine uses it."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def replica_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def pids(self) -> dict[str, list[int]]:
        """{"replicas": their pids, "nginx": master and workers}."""
        nginx = []
        if self.nginx_process is not None and self.nginx_process.poll() is None:
            nginx = [self.nginx_process.pid, *_children(self.nginx_process.pid)]
        return {"replicas": [p.pid for p in self.replicas if p.poll() is None], "nginx": nginx}

    def access_log(self) -> str:
        """nginx's access log so far: one line per request with its route cookie and the replica that answered."""
        assert self.prefix is not None
        path = self.prefix / "logs" / "access.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log(self, name: str) -> str:
        """A log of this deployment: "error.log" (nginx) or "replica-<i>.log"."""
        assert self.prefix is not None
        path = self.prefix / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""

    # -- starting and stopping
    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 300.0) -> None:
        """Start the replicas, wait until they answer, then nginx; raises RuntimeError with the logs if one fails."""
        self.prefix = Path(tempfile.mkdtemp(prefix="tformer-nginx-"))
        (self.prefix / "logs").mkdir()
        (self.prefix / "tmp").mkdir()
        if self.want_redis:
            self.redis = RedisServer()
            self.redis.start()
            self.env["TFORMER_REDIS_URL"] = self.redis.url
        for i, port in enumerate(self.ports):
            self.replicas.append(self._start_replica(i, port))
        self._wait(lambda: all(_healthy(u) for u in self.replica_urls), timeout_s, "the replicas")
        if self.warm:
            self.warmed = warm_replicas(self.replica_urls, self.warm, timeout_s)
        self._start_nginx()
        self._wait(lambda: _healthy(self.url), 30.0, "nginx")

    def _start_replica(self, index: int, port: int) -> subprocess.Popen:
        assert self.prefix is not None
        command = [
            self.python,
            "-m",
            "streamlit",
            "run",
            str(self.app),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ]
        with open(self.prefix / "logs" / f"replica-{index}.log", "w") as log:
            return subprocess.Popen(
                command,
                cwd=self.app.parent,  # its .streamlit/config.toml: upload cap, no file watcher
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches this script, which stops the replicas in order
                preexec_fn=_die_with_parent,
            )

    def _start_nginx(self) -> None:
        assert self.prefix is not None and self.nginx is not None
        user = None
        if os.geteuid() == 0:
            # As root the workers drop to nobody: they need to reach the temporary folders (nginx makes the
            # folders inside tmp/ and gives them to the workers itself); logs stay with the master.
            nobody = pwd.getpwnam("nobody")
            user = f"nobody {grp.getgrgid(nobody.pw_gid).gr_name}"
            os.chmod(self.prefix, 0o711)
            os.chmod(self.prefix / "tmp", 0o711)
        config = self.prefix / "nginx.conf"
        config.write_text(nginx_config(self.prefix, f"{self.host}:{self.port}", self.ports, user))
        base = [self.nginx, "-p", str(self.prefix), "-c", str(config), "-e", str(self.prefix / "logs" / "error.log")]
        check = subprocess.run([*base, "-t"], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx refused the generated config {config}:\n{check.stderr}")
        with open(self.prefix / "logs" / "nginx.stderr", "w") as err:
            self.nginx_process = subprocess.Popen(
                base,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [i for i, p in enumerate(self.replicas) if p.poll() is not None]
            if self.nginx_process is not None and self.nginx_process.poll() is not None:
                raise RuntimeError(f"nginx exited:\n{self.log('error.log')[-3000:]}")
            if dead:
                raise RuntimeError(f"replica {dead[0]} exited:\n{self.log(f'replica-{dead[0]}.log')[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer /_stcore/health within {timeout_s:.0f} s")
            time.sleep(0.25)  # polling interval of the condition above

    def stop(self) -> None:
        """Stop nginx, then the replicas (SIGTERM, SIGKILL after 15 s); remove the prefix unless keep."""
        processes = ([self.nginx_process] if self.nginx_process else []) + self.replicas
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.replicas, self.nginx_process = [], None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.prefix is not None and not self.keep:
            shutil.rmtree(self.prefix, ignore_errors=True)

    def dead(self) -> list[str]:
        """Which of the processes have exited (the CLI stops everything when one does)."""
        out = [f"replica {i} (exit {p.returncode})" for i, p in enumerate(self.replicas) if p.poll() is not None]
        if self.nginx_process is not None and self.nginx_process.poll() is not None:
            out.append(f"nginx (exit {self.nginx_process.returncode})")
        return out


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (nginx's workers), read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def print_warmed(warmed: Sequence[Warmed]) -> None:
    """One line per page warmed: the slowest replica's time, and any replica whose visit failed, with why."""
    for page in dict.fromkeys(w.page for w in warmed):
        visits = [w for w in warmed if w.page == page]
        failed = [w for w in visits if not w.ok]
        print(
            f"  warmed {page} on {len(visits) - len(failed)} of {len(visits)} replicas "
            f"(slowest {max(w.seconds for w in visits):.1f} s)"
        )
        for w in failed:
            why = "; ".join(w.errors) or "the page's run did not finish"
            print(f"  warming {page} failed on {w.replica}: {why[:300]}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=os.cpu_count() or 1, help="one per core (default)")
    parser.add_argument("--port", type=int, default=8500, help="where nginx listens (default 8500)")
    parser.add_argument("--host", default="127.0.0.1", help="nginx's address: 0.0.0.0 for a class's network")
    parser.add_argument("--first-port", type=int, default=8501, help="the first replica's port (loopback)")
    parser.add_argument("--cache-mb", type=float, help="TFORMER_CACHE_MB of each replica")
    parser.add_argument("--threads", type=int, help="torch threads per replica (default cores / replicas)")
    parser.add_argument("--gpu-mb", type=float, help="TFORMER_GPU_MB of each replica (default: 90%% of the GPU / K)")
    parser.add_argument("--keep", action="store_true", help="keep the prefix (config, logs) after stopping")
    parser.add_argument(
        "--warm",
        action="append",
        metavar="PAGE",
        help=f"a page each replica opens before nginx starts, e.g. '/text?model=...' (repeatable; default "
        f"{' '.join(WARM_PAGES)}; --warm '' for none)",
    )
    parser.add_argument(
        "--redis",
        action="store_true",
        help="start redis-server for class sessions shared by the replicas (TFORMER_REDIS_URL, unless set)",
    )
    args = parser.parse_args()

    def stop_on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGHUP, stop_on_signal)
    deployment = Deployment(
        args.replicas,
        args.port,
        args.first_port,
        args.host,
        cache_mb=args.cache_mb,
        threads=args.threads,
        gpu_mb=args.gpu_mb,
        keep=args.keep,
        redis=args.redis,
        warm=[page for page in (WARM_PAGES if args.warm is None else args.warm) if page],
    )
    try:
        with deployment:
            print(f"tformer: {deployment.url} -> {len(deployment.ports)} replicas on ports {deployment.ports}")
            print_warmed(deployment.warmed)
            print(f"  pids {deployment.pids()}; config and logs in {deployment.prefix}")
            if "TFORMER_GPU_MB" in deployment.env:
                print(f"  each replica may use {deployment.env['TFORMER_GPU_MB']} MB of the GPU (TFORMER_GPU_MB)")
            if deployment.redis is not None:
                print(f"  class sessions in {deployment.redis.url} (redis-server, pid {deployment.redis.process.pid})")
            print("  Ctrl-C stops them all.", flush=True)
            while not deployment.dead():
                time.sleep(1.0)  # watching for a child that exits
            print(f"tformer: {', '.join(deployment.dead())} exited; stopping the rest", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("\ntformer: stopped", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
