"""Members run by other processes (`teamrt run-agent`) get the guarantees of local ones: a crash
is reported and exits non-zero, a dead member fails requests fast, the team budget and the
shutdown deadline hold, leases keep two consumers off one inbox, a misspelt name is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, RemoteError
from teamrt.errors import MemberBusy, TeammateGone
from teamrt.team import CRASHED, Team, TeamBudget
from tests.support.remote import TESTS, exit_code, run_agent, until_running


async def test_a_remote_teammate_that_crashes_answers_reports_and_exits_non_zero(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "crasher")
        await until_running(mail, proc)
        async with Team(mail, [], remote=["w"]) as lead:
            with anyio.fail_after(10), pytest.raises(RemoteError, match="TeammateCrashed"):
                await lead.ask("w", "do something", timeout=30)
            code, err = await exit_code(proc)
            await anyio.sleep(0.1)  # the lead's server takes the crash report
            assert [e.type for e in lead.notices if e.type == CRASHED] == [CRASHED]
    assert code == 1 and "RuntimeError: a bug in the remote teammate" in err


async def test_a_request_to_a_killed_member_fails_fast_from_another_process(
    tmp_path: Path,
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "echo")
        await until_running(mail, proc)
        os.kill(proc.pid, signal.SIGKILL)
        await exit_code(proc)
        request = Envelope.request("lead", "w", "anyone there?", type="task")
        with anyio.fail_after(10), pytest.raises(TeammateGone, match="w is not running"):
            await mail.request(request, timeout=120)  # fails in about 2 s, not 120


async def test_a_stopped_process_is_found_by_its_missing_heartbeat(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "echo")
        await until_running(mail, proc)
        os.kill(proc.pid, signal.SIGSTOP)  # alive, holding its lease, but not running
        try:
            request = Envelope.request("lead", "w", "are you there?", type="task")
            with anyio.fail_after(20), pytest.raises(TeammateGone):
                await mail.request(request, timeout=120)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            await exit_code(proc)


async def test_a_remote_teammate_draws_on_the_team_budget(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "spender")
        await until_running(mail, proc)
        budget = TeamBudget(max_tokens=1_000)
        async with Team(mail, [], remote=["w"], budget=budget) as lead:
            with anyio.fail_after(20):
                result = await lead.ask("w", "think", timeout=60)
        code, _ = await exit_code(proc)
    assert result.stop_reason == "limit" and "team_max_tokens=1000" in result.detail
    assert 1_000 <= budget.usage.total_tokens < 1_000 + 200  # it stopped at the team's line
    assert code == 0


async def test_a_remote_teammate_enforces_the_shutdown_deadline_itself(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "stuck")
        await until_running(mail, proc)
        async with Team(mail, [], remote=["w"], shutdown_deadline=0.5):
            await mail.send(Envelope.request("lead", "w", "dig", type="task"))
            await anyio.sleep(0.2)  # stuck in its tool now
        code, _ = await exit_code(proc, timeout=15)  # not for ever
    assert code == 0


async def test_a_misspelt_member_name_is_refused(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "writer"]):
        pass
    proc = await anyio.run_process(
        [sys.executable, "-m", "teamrt", "run-agent", str(team), "--name", "wirter",
         "--spec", "remote_specs:echo"],
        check=False, env={**os.environ, "PYTHONPATH": TESTS},
    )  # fmt: skip
    assert proc.returncode == 2
    assert b"'wirter' is not a member" in proc.stderr and b"lead, writer" in proc.stderr


async def test_two_processes_cannot_consume_the_leads_inbox(tmp_path: Path) -> None:
    team = tmp_path / "t"
    code = (
        "import anyio, sys\n"
        "from teamrt import FileMailboxes\n"
        "async def main():\n"
        "    async with FileMailboxes(sys.argv[1]) as mail:\n"
        "        mail.inbox('lead')\n"
        "        print('holding', flush=True)\n"
        "        await anyio.sleep(60)\n"
        "anyio.run(main)\n"
    )
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = subprocess.Popen(  # noqa: ASYNC220 -- started once, read in a thread
            [sys.executable, "-c", code, str(team)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None
            assert (await anyio.to_thread.run_sync(proc.stdout.readline)).strip() == b"holding"
            with pytest.raises(MemberBusy, match="'lead'"):
                mail.inbox("lead")
            with pytest.raises(MemberBusy, match="'lead'"):
                async with Team(mail, [], remote=["w"]):
                    pass
        finally:
            proc.kill()
            await exit_code(proc)
