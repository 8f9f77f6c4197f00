"""A private redis-server on this machine, for `teamrt demo two-hosts` and `teamrt bench --store
redis`: a free port of 127.0.0.1, a temporary directory holding its append-only file, stopped
when the block ends. Never the system's service."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from teamrt.errors import TeamrtError, UsageError


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers(port: int) -> bool:
    """Whether a Redis server on `port` of 127.0.0.1 answers PING."""
    with (
        contextlib.suppress(OSError),
        socket.create_connection(("127.0.0.1", port), timeout=0.5) as probe,
    ):
        probe.sendall(b"PING\r\n")
        return probe.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def private_redis_server(*, appendfsync: str = "everysec", user: str) -> Iterator[str]:
    """Start redis-server (append-only file on) and yield its URL (`redis://127.0.0.1:PORT/0`);
    `user` names the command, for the error when no redis-server is installed."""
    program = shutil.which("redis-server")
    if program is None:
        raise UsageError(
            f"{user} needs a Redis server: install redis-server (a private one is then "
            "started), or give one: --store redis://HOST:PORT/DB"
        )
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="teamrt-redis-") as directory:
        options = {"port": str(port), "bind": "127.0.0.1", "dir": directory,
                   "appendonly": "yes", "appendfsync": appendfsync, "save": "",
                   "daemonize": "no"}  # fmt: skip
        process = subprocess.Popen(
            [program, *(part for key, value in options.items() for part in (f"--{key}", value))],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while not answers(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise TeamrtError(f"redis-server did not start on port {port}")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
