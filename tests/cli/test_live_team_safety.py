"""Nothing deletes a live team: a second `teamrt demo` in the folder of one that is running is
refused with `MemberBusy` naming the running one, and leaves its files alone; so is a demo
whose directory holds a team with a running member (a `run-agent` started by hand). Once the
directory is free, the demo starts over there. Real processes: the first demo is held on its
first model call by a server that never answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from teamrt.demos.workspace import claim
from teamrt.errors import MemberBusy


def teamrt(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *argv],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=50,
    )


class SilentServer:
    """Accepts connections and reads requests, never answers: `asked` is set at the first
    request (the demo's first model call, made once its team is running)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.asked = threading.Event()
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            if conn.recv(4096).startswith(b"POST"):
                self.asked.set()
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def _files(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_ino for p in directory.rglob("*")}


def test_a_second_demo_in_the_folder_of_a_running_one_is_refused(
    tmp_path: Path, silent_server: SilentServer
) -> None:
    env = {
        "OPENAI_BASE_URL": f"http://127.0.0.1:{silent_server.port}/v1",
        "OPENAI_MODEL": "never-answers",
        "TEAMRT_ALLOW_MODEL_REQUESTS": "1",
    }
    env.pop("TEAMRT_DEMO_SCRATCH", None)
    first = subprocess.Popen(
        [sys.executable, "-m", "teamrt", "demo", "--model", "openai", "--dir", "boxes"],
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if "PROXY" not in k}, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert silent_server.asked.wait(45), "the first demo never called its model"
        team = tmp_path / "boxes" / "research-writer"
        before = _files(team)
        assert "team.json" in before and "inboxes/researcher.jsonl" in before
        for name in ("research-writer", "two-process"):  # both use that directory
            second = teamrt(tmp_path, "demo", name, "--dir", "boxes")
            assert second.returncode == 1, second.stdout + second.stderr
            assert second.stderr.count("\n") == 1, second.stderr  # one line, no traceback
            assert f"in use by the research-writer demo (process {first.pid}" in second.stderr
            assert "--dir" in second.stderr
            assert _files(team) == before  # nothing removed, nothing replaced
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    again = teamrt(tmp_path, "demo", "--dir", "boxes")  # free again: it starts over
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "boxes" / "research-writer" / "scratch" / "agent-loop.md").is_file()


HOLD_A_LEASE = """
import sys, anyio
from teamrt.mail import open_mailboxes

async def main():
    async with open_mailboxes(sys.argv[1], create=False) as mail:
        await mail.open_inbox("writer")
        print("holding", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)

anyio.run(main)
"""


def test_a_demo_never_removes_a_team_whose_member_runs(tmp_path: Path) -> None:
    assert teamrt(tmp_path, "demo", "--dir", "boxes").returncode == 0
    team = tmp_path / "boxes" / "research-writer"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_LEASE, str(team)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        before = _files(team)
        refused = teamrt(tmp_path, "demo", "--dir", "boxes")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "member 'writer' of the team in boxes/research-writer is running" in refused.stderr
        assert str(holder.pid) in refused.stderr
        assert _files(team) == before
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()


def test_a_directory_held_by_a_run_is_busy_in_this_process_too(tmp_path: Path) -> None:
    with (
        claim(tmp_path / "d", "conductor", what="x"),
        pytest.raises(MemberBusy, match="in use by the conductor demo"),
        claim(tmp_path / "d", "conductor", what="x"),
    ):
        pass  # pragma: no cover - refused
    with claim(tmp_path / "d", "conductor", what="x"):  # released with the first
        pass
