"""`teamrt run-agent` children for the multi-process tests: start one on a spec of
tests/support/remote_specs.py (or another module of this directory), wait until it runs, collect
it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio

from teamrt import FileMailboxes
from tests.support.paths import ROOT, SUPPORT

TESTS = str(SUPPORT)


def run_agent(
    team: Path, spec: str, *extra: str, module: str = "remote_specs"
) -> subprocess.Popen[bytes]:
    """`teamrt run-agent TEAM --name w --spec MODULE:SPEC`, with this directory importable."""
    path = [TESTS, str(ROOT), os.environ.get("PYTHONPATH", "")]  # ROOT: `tests.*` modules too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt", "run-agent", str(team), "--name", "w",
         "--spec", f"{module}:{spec}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )  # fmt: skip


async def until_running(mail: FileMailboxes, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the child holds member w's lease (or fail with what it printed)."""
    with anyio.fail_after(30):
        while await mail.store.member_alive("w") is not True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            await anyio.sleep(0.02)


async def exit_code(proc: subprocess.Popen[bytes], timeout: float = 20) -> tuple[int, str]:
    """Wait for the child to exit on its own; its exit code and what it wrote to stderr."""
    try:
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=timeout))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stdout is not None and proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    return code, err
