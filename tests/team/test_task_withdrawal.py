"""A task refused to its caller (`TeammateGone` after a kill, a `TeammateCrashed` answer) is
withdrawn: the member's next incarnation, in another process, never runs it (on files and on
Redis), and answers it `cancelled` for the lead to see."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from teamrt import RemoteError
from teamrt.errors import TeammateGone
from teamrt.mail.locator import open_mailboxes
from teamrt.mail.mailboxes import Mailboxes
from teamrt.team import TaskResult, Team
from tests.support.redis_server import RedisServer, needs_redis, redis_server
from tests.support.remote import TESTS, exit_code
from tests.team.helpers import lead_mail_so_far

__all__ = ["redis_server"]  # the fixture


@pytest.fixture(params=["files", pytest.param("redis", marks=needs_redis)])
def team_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the team lives: a team directory, or a team on a private Redis server."""
    if request.param == "files":
        return str(tmp_path / "t")
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url("withdrawal")


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """What the children's models and tools worked on, as "PID TASK" lines."""
    path = tmp_path / "record"
    path.touch()
    monkeypatch.setenv("TEAMRT_TEST_RECORD", str(path))
    monkeypatch.chdir(tmp_path)  # a Redis team's children keep their journals in ./agents
    return lambda: path.read_text().splitlines()


async def _until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 -- polled: another process decides
            await anyio.sleep(0.02)


def _run_agent(team_at: str, spec: str) -> subprocess.Popen[bytes]:
    """`teamrt run-agent` on a spec of withdrawal_specs (a team directory or a store URL)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt", "run-agent", team_at, "--name", "w",
         "--spec", f"withdrawal_specs:{spec}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )  # fmt: skip


async def _started(team_at: str, spec: str) -> subprocess.Popen[bytes]:
    proc = _run_agent(team_at, spec)
    assert proc.stdout is not None and proc.stderr is not None
    # its first line says it runs (a dead predecessor's lease may look alive for a while)
    with anyio.fail_after(30):
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
    assert b"running as incarnation" in line, proc.stderr.read().decode()
    return proc


async def _gone(mail: Mailboxes) -> None:
    """Wait until the member's dead holder lost its lease (a Redis lease expires)."""
    with anyio.fail_after(30):
        while await mail.store.member_alive("w") is not False:  # noqa: ASYNC110 -- polled
            await anyio.sleep(0.05)


async def _late(lead: Team, task_id: str) -> TaskResult:
    """The answer to a task its ask no longer waits for, from the lead's mail."""
    await _until(lambda: any(e.in_reply_to == task_id for e in lead_mail_so_far(lead)))
    answer = next(e for e in lead_mail_so_far(lead) if e.in_reply_to == task_id)
    return TaskResult.model_validate(answer.body)


async def test_tasks_refused_with_teammate_gone_after_a_kill_never_run_again(
    team_at: str, record: Callable[[], list[str]]
) -> None:
    async with open_mailboxes(team_at, members=["lead", "w"]) as mail:
        await _refused_after_a_kill(mail, team_at, record)


async def _refused_after_a_kill(
    mail: Mailboxes, team_at: str, record: Callable[[], list[str]]
) -> None:
    first = await _started(team_at, "holder")
    async with Team(mail, [], remote=["w"]) as lead:
        refused: dict[str, TeammateGone] = {}

        async def ask(text: str) -> None:
            with pytest.raises(TeammateGone) as info:
                await lead.ask("w", text, timeout=120)
            refused[text] = info.value

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "hold A")
            await _until(lambda: f"{first.pid} hold" in record())  # A is in its tool
            tg.start_soon(ask, "B")  # queued behind A
            await anyio.sleep(0.2)  # (B is in w's inbox either way; most likely read too)
            os.kill(first.pid, signal.SIGKILL)
        await exit_code(first)
        await _gone(mail)
        assert "withdrawn" in str(refused["B"]) and refused["B"].task_id is not None
        second = await _started(team_at, "holder")
        try:
            answer = await lead.ask("w", "C", timeout=60)
            assert answer.answer == "done: C"
            late_a = await _late(lead, str(refused["hold A"].task_id))
            late_b = await _late(lead, str(refused["B"].task_id))
        finally:
            second.send_signal(signal.SIGTERM)
            await exit_code(second)
    assert late_a.stop_reason == late_b.stop_reason == "cancelled"
    assert "not resumed" in late_a.detail and "never ran" in late_b.detail
    ran = record()
    assert ran == [f"{first.pid} hold A", f"{first.pid} hold", f"{second.pid} C"]


async def test_a_task_refused_with_teammate_crashed_never_runs_again(
    team_at: str, record: Callable[[], list[str]]
) -> None:
    async with open_mailboxes(team_at, members=["lead", "w"]) as mail:
        await _refused_with_a_crash(mail, team_at, record)


async def _refused_with_a_crash(
    mail: Mailboxes, team_at: str, record: Callable[[], list[str]]
) -> None:
    first = await _started(team_at, "crash_then_die")
    async with Team(mail, [], remote=["w"]) as lead:
        with anyio.fail_after(30), pytest.raises(RemoteError, match="TeammateCrashed") as info:
            await lead.ask("w", "X", timeout=120)
        code, _ = await exit_code(first)
        assert code == 9  # it died before acking X: X is delivered to the next incarnation
        await _gone(mail)
        second = await _started(team_at, "holder")
        try:
            # X, delivered again (its ack never committed), is dropped before Y is served
            assert (await lead.ask("w", "Y", timeout=60)).answer == "done: Y"
        finally:
            second.send_signal(signal.SIGTERM)
            await exit_code(second)
    assert info.value.error_type == "TeammateCrashed"
    assert record() == [f"{first.pid} X", f"{second.pid} Y"]
