"""The teamrt command: send, inspect, demo and bench, run as a user would run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes
from teamrt.cli.main import main


def teamrt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        check=False,
    )


async def _create(path: Path) -> None:
    async with FileMailboxes(path, members=["lead", "worker"]):
        pass


async def _receive(path: Path, name: str, count: int) -> list[Envelope]:
    async with FileMailboxes(path) as mail:
        return [await mail.inbox(name).receive(timeout=5) for _ in range(count)]


@pytest.fixture
def team(tmp_path: Path) -> Path:
    path = tmp_path / "demo"
    anyio.run(_create, path)
    return path


def test_send_then_inspect(team: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", str(team), "--from", "lead", "--to", "worker", "--body", '{"x": 1}']) == 0
    envelope_id = capsys.readouterr().out.strip()
    assert (
        main(
            [
                "send",
                str(team),
                "--from",
                "lead",
                "--to",
                "worker",
                "--kind",
                "request",
                "--type",
                "task",
                "--text",
                "plain words",
            ]
        )
        == 0
    )
    request_id = capsys.readouterr().out.strip()
    human = ["send", str(team), "--from", "human", "--as-human", "--kind", "broadcast"]
    assert main([*human, "--text", "hi"]) == 0
    capsys.readouterr()

    first, second, third = anyio.run(_receive, team, "worker", 3)
    assert (first.id, first.body) == (envelope_id, {"x": 1})
    assert (second.id, second.kind, second.type, second.body) == (
        request_id,
        "request",
        "task",
        "plain words",
    )
    assert (third.kind, third.sender, third.recipient) == ("broadcast", "human", "*")

    assert main(["inspect", str(team), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    worker = next(i for i in report["inboxes"] if i["name"] == "worker")
    assert (worker["depth"], worker["lag"], worker["pending_requests"]) == (3, 3, [request_id])
    assert report["agents"][0] == {"name": "lead", "running": None, "last_run": None}
    assert main(["inspect", str(team)]) == 0
    table = capsys.readouterr().out
    assert "worker" in table and f"unanswered request {request_id}" in table


def test_send_errors_are_clear(team: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistake of the caller's exits 2, a failure 1; each says what was wrong on one line."""
    assert main(["send", str(team), "--from", "lead", "--to", "ghost", "--body", "1"]) == 2
    assert "no member 'ghost' in team 'demo'" in capsys.readouterr().err
    assert main(["send", str(team), "--from", "lead", "--to", "../x", "--body", "1"]) == 2
    assert "invalid recipient '../x'" in capsys.readouterr().err
    assert (
        main(["send", str(team.parent / "missing"), "--from", "a", "--to", "b", "--body", "1"]) == 1
    )
    assert "no team directory" in capsys.readouterr().err
    wait = ["--kind", "request", "--wait", "0.05", "--body", "1"]
    assert main(["send", str(team), "--from", "lead", "--to", "worker", *wait]) == 1
    assert "no response from worker" in capsys.readouterr().err
    assert main(["inspect", str(team.parent / "missing")]) == 1
    assert "team.json is missing" in capsys.readouterr().err
    response = ["send", str(team), "--from", "lead", "--to", "worker", "--kind", "response"]
    assert main([*response, "--in-reply-to", "x" * 65, "--body", "1"]) == 2  # not pydantic's
    assert "invalid response: in_reply_to" in capsys.readouterr().err


async def test_response_from_the_command_line(team: Path) -> None:
    """A person answers a request with `teamrt send --kind response`."""
    async with FileMailboxes(team) as mail, anyio.create_task_group() as tg:

        async def answer() -> None:
            request = await mail.inbox("worker").receive(timeout=10)
            code = await anyio.to_thread.run_sync(
                main,
                [
                    "send",
                    str(team),
                    "--from",
                    "worker",
                    "--to",
                    "lead",
                    "--kind",
                    "response",
                    "--in-reply-to",
                    request.id,
                    "--body",
                    '"approved"',
                ],
            )
            assert code == 0

        tg.start_soon(answer)
        response = await mail.request(Envelope.request("lead", "worker", "may I?"), timeout=10)
    assert response.body == "approved"


def test_default_demo_is_research_writer(tmp_path: Path) -> None:
    result = teamrt("demo", "--dir", str(tmp_path / "boxes"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "researcher -> writer" in result.stdout
    assert f"writing in {tmp_path / 'boxes' / 'research-writer'}/" in result.stdout
    assert (tmp_path / "boxes" / "research-writer" / "scratch" / "agent-loop.md").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["boxes"]  # --dir holds everything


def test_demo_runs_two_processes(tmp_path: Path) -> None:
    result = teamrt("demo", "exchange", "--dir", str(tmp_path / "boxes"))
    assert result.returncode == 0, result.stderr
    # both processes write to one pipe: a failure shows all of it
    said = result.stdout + result.stderr
    assert "worker exited with code 0" in result.stdout, said
    assert result.stdout.count("response") == 3, said
    assert "teamrt inspect" in result.stdout, said
    inspected = teamrt("inspect", str(tmp_path / "boxes" / "exchange"), "--json")
    report = json.loads(inspected.stdout)
    assert all(
        inbox["lag"] == 0 and not inbox["pending_requests"] for inbox in report["inboxes"]
    ), report


@pytest.mark.stress
def test_bench_smoke_emits_every_figure(tmp_path: Path) -> None:
    result = teamrt("bench", "--smoke", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    figures = {f["name"]: f for f in json.loads(result.stdout)["figures"]}
    for name in (
        "awaited sends, durability none",
        "batched sends (100 per batch)",
        "fsync, 8 concurrent senders (group commit)",
        "8 processes into one inbox",
        "request -> response across processes, p50",
        "idle receiver in another process wakes, p50",
        "drain a backlog of 1,000",
        "drain a backlog of 1,000 in batches, drain_nowait(256)",
        "agent step, checkpointed, at step 10: the loop's own CPU",
        "20 idle teammates: CPU while idle",
        "replay 3,000 envelopes (timeline, pairing, flags)",
        "ack with 2,000 acks held behind one unacked envelope",
    ):
        assert figures[name]["value"] > 0
    assert figures["awaited sends, durability none"]["baseline_value"] > 0
    assert list(tmp_path.iterdir()) == []  # scratch teams removed


def test_help_describes_every_command() -> None:
    result = teamrt("--help")
    for command in ("send", "inspect", "repair", "bench", "demo"):
        assert command in result.stdout
    assert "--durability" in teamrt("send", "--help").stdout


def test_two_process_demo_runs_the_writer_elsewhere(tmp_path: Path) -> None:
    result = teamrt("demo", "two-process", "--dir", str(tmp_path / "boxes"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    said = result.stdout + result.stderr  # both processes write to one pipe
    assert "the writer's process exited with code 0" in result.stdout, said
    assert "writer: running as incarnation" in result.stdout, said
    assert (tmp_path / "boxes" / "research-writer" / "scratch" / "agent-loop.md").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["boxes"]


def test_run_agent_refuses_a_member_that_already_runs(tmp_path: Path) -> None:
    team_dir = tmp_path / "t"
    anyio.run(_create, team_dir)
    spec = "teamrt.demos.research_writer:writer"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "teamrt",
            "run-agent",
            str(team_dir),
            "--name",
            "worker",
            "--spec",
            spec,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        assert "running as incarnation" in first.stdout.readline()
        second = teamrt("run-agent", str(team_dir), "--name", "worker", "--spec", spec)
        assert second.returncode == 1
        assert "member 'worker' of team 't' is already running (pid" in second.stderr
        assert (
            main(
                [
                    "send",
                    str(team_dir),
                    "--from",
                    "lead",
                    "--to",
                    "worker",
                    "--kind",
                    "request",
                    "--type",
                    "shutdown_request",
                    "--body",
                    "{}",
                ]
            )
            == 0
        )
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
