"""Debian's redis-server for class sessions, in a temporary folder of its own, on loopback.

    with RedisServer() as r:            # a free port unless given
        r.url                           # redis://127.0.0.1:<port>/0, for TFORMER_REDIS_URL

No persistence (a class session lives a few hours; nothing is written to disk), no system configuration read
or changed; stopped with the deployment (deploy/serve.py --redis), the tests or the benchmark that started it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")


def find_redis() -> str | None:
    for candidate in CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process; a context manager. maxmemory bounds it in bytes (least recently used keys go)."""

    def __init__(self, port: int = 0, maxmemory_mb: int = 256) -> None:
        self.binary = find_redis()
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port = port or _free_port()
        self.maxmemory_mb = maxmemory_mb
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 20.0) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tformer-redis-"))
        command = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
            "--save", "", "--appendonly", "no", "--maxmemory", f"{self.maxmemory_mb}mb",
            "--maxmemory-policy", "volatile-lru", "--protected-mode", "yes",
        ]  # fmt: skip
        log = open(self.folder / "redis.log", "w")  # noqa: SIM115 - kept open for the process's life
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)  # polling interval of the condition above

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
