"""Forking a team at an envelope: the cut (inboxes, cursors, journals), re-driving the fork to
the same end or, with a changed script, to another; bad input; and team-wide reruns."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import FileMailboxes
from teamrt.agents.journal import Journal
from teamrt.cli.main import main
from teamrt.demos import research_writer as demo
from teamrt.envelopes import Envelope, Request, Response
from teamrt.errors import StoreError, UsageError
from teamrt.fork import fork_team, wait_for_answers
from teamrt.mail import open_view
from teamrt.mail.log import Record, decode_entry
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.rerun import rerun_team
from teamrt.team import TaskResult, Team, Teammate
from tests.support.redis_server import RedisServer, needs_redis, redis_server

__all__ = ["redis_server"]  # the fixture


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The writer's files go under the test's directory."""
    where = tmp_path / "scratch"
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(where))
    return where


def _terse_writer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """A changed script: the writer writes one line, whatever the findings."""
    if messages[-1].role == "tool":
        return f"Done tersely: {messages[-1].content}"
    return call("write_file", name="agent-loop.md", content="# The agent loop\n\nIt loops.\n")


def _team(writer_brain: object = None) -> list[Teammate]:
    researcher, writer = demo.teammates("offline")
    if writer_brain is not None:
        writer = dataclasses.replace(writer, model=FunctionModel(_terse_writer))
    return [researcher, writer]


async def _run(directory: Path) -> TaskResult:
    async with (
        FileMailboxes(directory) as mail,
        Team(mail, _team(), agent_dir=directory / "agents") as team,
    ):
        return await team.ask("researcher", demo.TASK, timeout=30)


async def _redrive(directory: Path, teammates: list[Teammate], requests: list[str]) -> Response:
    async with (
        FileMailboxes(directory) as mail,
        Team(mail, teammates, agent_dir=directory / "agents", lead_here=False),
    ):
        answers = await wait_for_answers(mail, requests, timeout=30)
    (answer,) = answers.values()
    return answer


def _envelopes(directory: Path, inbox: str) -> list[Envelope]:
    with open_view(directory) as view:
        decoded = [decode_entry(e) for e in view.scan(inbox)]
    return [d.envelope for d in decoded if isinstance(d, Record)]


def _findings_request(directory: Path) -> Request:
    """The researcher's request to the writer: mid-run, after the notes were read."""
    return next(
        e
        for e in _envelopes(directory, "writer")
        if isinstance(e, Request) and e.sender == "researcher"
    )


async def test_a_fork_at_a_mid_run_envelope_reruns_to_the_same_end(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    original = await _run(source)
    assert original.stop_reason == "answer"
    at = _findings_request(source)
    dest = tmp_path / "forks" / "try-1"
    summary = fork_team(source, at.id, dest)

    # the cut: the lead's task is open, the researcher was waiting on the writer, who had not
    # started; nothing sent after the findings request is in the fork
    task = next(r for r in summary.open_requests if r.sender == "lead")
    assert task.recipient == "researcher" and task.type == "task"
    assert all(e.ts <= at.ts for name in ("lead", "researcher", "writer")
               for e in _envelopes(dest, name))  # fmt: skip
    assert not any(e.type == "task_result" for e in _envelopes(dest, "lead"))
    researcher = summary.agents["researcher"]
    assert researcher.in_progress and researcher.task_id == task.id
    assert researcher.dropped > 0 and researcher.calls == 3
    assert summary.agents["writer"].journal is None
    assert not (dest / "agents" / "writer.state.jsonl").exists()
    state = Journal(dest / "agents" / "researcher.state.jsonl").load()
    assert state is not None and state.open_step is not None
    assert [c.name for c in state.open_step.reply.tool_calls] == ["request"]
    assert not state.open_step.results  # the request's answer came after the cut
    # cursors: the researcher's task is not handled (it resumes it); the findings request
    # is, because the researcher sends it again when it resumes
    assert summary.inboxes["researcher"].handled < summary.inboxes["researcher"].kept
    assert summary.inboxes["writer"].handled == summary.inboxes["writer"].kept
    assert json.loads((dest / "export.json").read_text())["forked_at"] == at.id
    # verifiable from the files: every journal line was written by the cut, and each cursor
    # covers as many records as the summary says were handled
    for line in (dest / "agents" / "researcher.state.jsonl").read_text().splitlines():
        assert json.loads(line)["ts"] <= at.ts
    with open_view(dest) as view:
        for name, inbox in summary.inboxes.items():
            cursor = view.committed(name)
            covered = [
                e.end <= cursor.position
                or any((a, b) < e.end <= (c, d) for a, b, c, d in cursor.ahead)
                for e in view.scan(name)
            ]
            assert (len(covered), sum(covered)) == (inbox.kept, inbox.handled), name

    answer = await _redrive(dest, _team(), [task.id])
    assert answer.in_reply_to == task.id
    assert TaskResult.model_validate(answer.body).answer == original.answer


async def test_a_fork_with_a_changed_script_reaches_a_different_end(
    tmp_path: Path, scratch: Path
) -> None:
    source = tmp_path / "research-writer"
    original = await _run(source)
    summary = fork_team(source, _findings_request(source).id, tmp_path / "try-2")
    task = next(r.id for r in summary.open_requests if r.sender == "lead")
    answer = await _redrive(tmp_path / "try-2", _team(writer_brain=_terse_writer), [task])
    result = TaskResult.model_validate(answer.body)
    assert result.stop_reason == "answer" and result.answer != original.answer
    assert "Done tersely" in (result.answer or "")
    assert (scratch / "agent-loop.md").read_text() == "# The agent loop\n\nIt loops.\n"


async def test_a_fork_at_the_first_task_has_no_journals(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    await _run(source)
    first = next(e for e in _envelopes(source, "researcher") if e.type == "task")
    summary = fork_team(source, first.id, tmp_path / "at-start")
    assert all(a.journal is None for a in summary.agents.values())
    assert [r.id for r in summary.open_requests] == [first.id]
    assert summary.inboxes["writer"].kept == len(
        [e for e in _envelopes(source, "writer") if e.ts <= first.ts]
    )


async def test_bad_input_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    await _run(source)
    at = _findings_request(source).id
    with pytest.raises(UsageError, match="no envelope"):
        fork_team(source, "0" * 30, tmp_path / "a")
    with pytest.raises(UsageError, match="no team at"):
        fork_team(tmp_path / "missing", at, tmp_path / "b")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(UsageError, match="not empty"):
        fork_team(source, at, tmp_path / "busy")


def test_the_fork_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    source = tmp_path / "research-writer"
    anyio.run(_run, source)
    at = _findings_request(source).id
    assert main(["fork", str(source), "--at", at, str(tmp_path / "f1")]) == 0
    out = capsys.readouterr().out
    assert f"at {at}" in out and "open request" in out
    assert main(["fork", str(source), "--at", at, str(tmp_path / "f2"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["at"] == at
    assert main(["fork", str(source), "--at", "nope", str(tmp_path / "f3")]) == 2
    assert "no envelope 'nope'" in capsys.readouterr().err


async def test_team_rerun_finds_the_agent_that_diverged(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    await _run(source)
    same = await rerun_team(source / "agents", _team())
    assert [(r.name, r.divergence) for r in same] == [("researcher", None), ("writer", None)]
    changed = await rerun_team(source / "agents", _team(writer_brain=_terse_writer))
    by_name = {r.name: r for r in changed}
    assert by_name["researcher"].divergence is None
    divergence = by_name["writer"].divergence
    assert divergence is not None and divergence.step == 1
    assert "recorded assistant" in str(divergence) and "now assistant" in str(divergence)


async def test_open_requests_lose_their_deadline_in_the_fork(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    await _run(source)
    at = _findings_request(source)
    fork_team(source, at.id, tmp_path / "f")
    (task,) = [e for e in _envelopes(tmp_path / "f", "researcher") if e.type == "task"]
    (before,) = [e for e in _envelopes(source, "researcher") if e.type == "task"]
    assert before.deadline is not None and task.deadline is None
    assert task.model_copy(update={"deadline": None, "team": "x"}) == before.model_copy(
        update={"deadline": None, "team": "x"}
    )


async def _run_tasks(directory: Path, count: int) -> list[TaskResult]:
    async with (
        FileMailboxes(directory) as mail,
        Team(mail, _team(), agent_dir=directory / "agents") as team,
    ):
        return [await team.ask("researcher", demo.TASK, timeout=30) for _ in range(count)]


async def test_a_fork_goes_back_into_the_previous_task_s_journal(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    results = await _run_tasks(source, 2)
    tasks = [e for e in _envelopes(source, "researcher") if e.type == "task"]
    findings = [e for e in _envelopes(source, "writer") if e.sender == "researcher"]
    assert len(tasks) == len(findings) == 2
    # at the second task's request the researcher had finished the first: its previous journal
    summary = fork_team(source, tasks[1].id, tmp_path / "between")
    researcher = summary.agents["researcher"]
    assert researcher.journal == "previous" and researcher.dropped == 0
    assert researcher.task_id == tasks[0].id and not researcher.in_progress
    assert [r.id for r in summary.open_requests] == [tasks[1].id]
    answer = await _redrive(tmp_path / "between", _team(), [tasks[1].id])
    assert TaskResult.model_validate(answer.body).answer == results[1].answer
    # in the middle of the first task
    summary = fork_team(source, findings[0].id, tmp_path / "first")
    assert summary.agents["researcher"].journal == "previous"
    assert summary.agents["researcher"].in_progress
    # two tasks on, the first task's journal is gone: refused, saying so
    await _run_tasks(source, 1)
    with pytest.raises(UsageError, match="journals begin after the cut"):
        fork_team(source, findings[0].id, tmp_path / "too-far")


async def test_journals_of_an_older_teamrt_are_cut_by_their_transcript(tmp_path: Path) -> None:
    """Journal lines without `ts` are placed by the transcript's calls and the lines after
    them, so the cut lands where it does with times."""
    source = tmp_path / "research-writer"
    await _run(source)
    at = _findings_request(source)
    timed = fork_team(source, at.id, tmp_path / "timed").agents["researcher"]
    journal = source / "agents" / "researcher.state.jsonl"
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "ts" or r["t"]
                       in ("stop", "crash", "cancel")}) + "\n" for r in lines))  # fmt: skip
    untimed = fork_team(source, at.id, tmp_path / "untimed").agents["researcher"]
    assert (untimed.lines, untimed.in_progress) == (timed.lines, True)


def test_rerun_team_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    source = tmp_path / "research-writer"
    anyio.run(_run, source)
    spec = "teamrt.demos.research_writer:teammates"
    assert main(["rerun", str(source), "--team", "--spec", spec]) == 0
    out = capsys.readouterr().out
    assert "researcher: 4 recorded steps, the same again" in out
    assert "writer: 2 recorded steps, the same again" in out
    assert main(["rerun", str(source), "--team"]) == 2
    assert "needs --spec" in capsys.readouterr().err
    assert (
        main(["rerun", str(source), "--team", "--spec", "teamrt.demos.research_writer:TASK"]) == 2
    )
    assert "not a list of Teammates" in capsys.readouterr().err


@needs_redis
async def test_a_team_in_redis_forks_into_a_team_directory(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    from teamrt.mail import open_mailboxes

    url = redis_server.url("research-writer")
    agents = tmp_path / "agents"
    async with (
        open_mailboxes(url) as mail,
        Team(mail, _team(), agent_dir=agents) as team,
    ):
        original = await team.ask("researcher", demo.TASK, timeout=30)
    with open_view(url) as view:
        decoded = [decode_entry(e) for e in view.scan("writer")]
    at = next(d.envelope for d in decoded if isinstance(d, Record) and d.envelope.kind == "request")
    summary = fork_team(url, at.id, tmp_path / "on-files", agent_dir=agents)
    assert summary.agents["researcher"].in_progress
    task = next(r.id for r in summary.open_requests if r.sender == "lead")
    answer = await _redrive(tmp_path / "on-files", _team(), [task])
    assert TaskResult.model_validate(answer.body).answer == original.answer


async def test_an_empty_directory_can_take_a_fork(tmp_path: Path) -> None:
    source = tmp_path / "research-writer"
    await _run(source)
    (tmp_path / "empty").mkdir()
    summary = fork_team(source, _findings_request(source).id, tmp_path / "empty")
    assert summary.inboxes["writer"].kept == 1
    assert (tmp_path / "empty" / "team.json").is_file()


async def test_a_fork_at_an_answer_the_requester_had_not_taken_in(tmp_path: Path) -> None:
    """At the writer's answer the researcher still waited in its request tool: the fork runs
    that call again, with the same request id, and the writer, whose journal holds the
    finished task, answers it from there without asking its model again."""
    source = tmp_path / "research-writer"
    original = await _run(source)
    answer_ = next(e for e in _envelopes(source, "researcher") if e.type == "task_result")
    dest = tmp_path / "at-answer"
    summary = fork_team(source, answer_.id, dest)
    writer = summary.agents["writer"]
    assert writer.journal == "current" and not writer.in_progress and writer.calls == 2
    assert summary.agents["researcher"].in_progress
    task = next(r.id for r in summary.open_requests if r.sender == "lead")
    answer = await _redrive(dest, _team(), [task])
    assert TaskResult.model_validate(answer.body).answer == original.answer
    transcript = (dest / "agents" / "writer.transcript.jsonl").read_text().splitlines()
    assert len(transcript) == 2  # the writer's model was not asked again


async def test_a_fork_that_fails_half_way_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import teamrt.fork

    source = tmp_path / "research-writer"
    await _run(source)

    def broken(*args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(teamrt.fork, "_cut_transcript", broken)
    with pytest.raises(StoreError, match="No space left"):
        fork_team(source, _findings_request(source).id, tmp_path / "half")
    assert not (tmp_path / "half").exists()


# --- what users and models may well give ---


def test_a_fork_with_an_agent_dir_that_is_not_there_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt `--agent-dir` would fork the team without any journal or transcript, so that
    every agent starts its task afresh: it is refused, and nothing is written."""
    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    team_dir = tmp_path / "team"

    async def run() -> None:
        async with (
            FileMailboxes(team_dir) as mail,
            Team(mail, demo.teammates("offline"), agent_dir=team_dir / "agents") as team,
        ):
            await team.ask("researcher", demo.TASK, timeout=30)

    anyio.run(run)
    task = json.loads((team_dir / "inboxes" / "researcher.jsonl").read_text().splitlines()[0])
    with pytest.raises(UsageError, match=r"no agents' folder at .*agnets"):
        fork_team(team_dir, task["id"], tmp_path / "fork", agent_dir=tmp_path / "agnets")
    assert not (tmp_path / "fork").exists()
