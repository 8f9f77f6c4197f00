"""Teams: the task protocol, shutdown, incarnations, mid-run delivery, leases, crashes,
restarts and the team budget."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.agents import tool
from teamrt.errors import MemberBusy, TeammateGone
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    ScriptedModel,
    ToolSpec,
    Usage,
    call,
)
from teamrt.team import (
    CRASHED,
    IDLE,
    SHUTDOWN,
    SHUTDOWN_ACK,
    RestartPolicy,
    ShutdownBody,
    Team,
    TeamBudget,
    Teammate,
)


async def lead_mail(mail: MemoryMailboxes, team: Team | None = None) -> list[Envelope]:
    """Everything the lead got: what the team's lead server took in, then what is left."""
    inbox = mail.inbox("lead")
    out = [*team.notices, *team.lead_mail_nowait()] if team is not None else []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            return out


def newest_task(messages: Sequence[ChatMessage]) -> str:
    """A teammate keeps its context: its current task is the newest user message."""
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


async def test_task_result_idle_and_shutdown_handshake() -> None:
    async with MemoryMailboxes() as mail:
        writer = Teammate("writer", lambda: ScriptedModel(["drafted"]))
        async with Team(mail, [writer]) as team:
            assert team.status["writer"].state == "idle"
            result = await team.ask("writer", "draft it", timeout=5)
            assert (result.answer, result.stop_reason, result.steps) == ("drafted", "answer", 1)
        final = team.status["writer"]
        assert final.state == "stopped"
        types = [e.type for e in await lead_mail(mail, team)]
        assert types == [IDLE, IDLE, SHUTDOWN_ACK]  # announced, idle after the task, acked


async def test_a_teammate_that_ignores_shutdown_is_cancelled_at_the_deadline() -> None:
    @tool
    async def dig(depth: int) -> str:
        """Never finishes."""
        await anyio.sleep(60)
        return "done"

    async with MemoryMailboxes() as mail:
        stubborn = Teammate("stubborn", ScriptedModel([call("dig", depth=1), "never"]), tools=[dig])
        team = Team(mail, [stubborn], shutdown_deadline=0.2)
        with anyio.fail_after(5):
            async with team:
                await mail.send(Envelope.request("lead", "stubborn", "dig", type="task"))
                await anyio.sleep(0.05)
                assert team.status["stubborn"].state == "working"
        assert team.status["stubborn"].last == "cancelled at the shutdown deadline"


async def test_stale_shutdown_cannot_stop_a_new_incarnation() -> None:
    async with MemoryMailboxes() as mail:
        writer = Teammate("writer", lambda: ScriptedModel(["still here"]))
        async with Team(mail, [writer]) as team:
            stale = Envelope.request(
                "lead", "writer", ShutdownBody(incarnation="0" * 30), type=SHUTDOWN
            )
            with pytest.raises(RemoteError, match="StaleShutdown") as info:
                await mail.request(stale, timeout=5)
            assert team.status["writer"].incarnation in info.value.remote_message
            assert (await team.ask("writer", "still there?", timeout=5)).answer == "still here"


async def test_message_arriving_mid_run_reaches_the_model_at_the_next_step() -> None:
    started, seen = anyio.Event(), list[str | None]()

    @tool
    async def work(step: int) -> str:
        """Some work that takes a moment."""
        started.set()
        await anyio.sleep(0.1)
        return f"worked {step}"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if len(messages) == 1:
            return call("work", step=1)
        seen.extend(m.content for m in messages if m.role == "user")
        return "finished"

    async with MemoryMailboxes() as mail:
        worker = Teammate("worker", FunctionModel(brain), tools=[work])
        async with Team(mail, [worker]) as team, anyio.create_task_group() as tg:

            async def interrupt() -> None:
                await started.wait()
                await mail.send(Envelope.message("lead", "worker", "also check the cables"))

            tg.start_soon(interrupt)
            result = await team.ask("worker", "do the work", timeout=5)
    assert result.answer == "finished"
    assert any("also check the cables" in (text or "") for text in seen)


async def test_mail_sent_before_a_teammate_starts_is_delivered(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "worker"]) as mail:
        await mail.send(Envelope.message("lead", "worker", "note left before you started"))
        seen: list[str] = []

        def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
            seen.extend(m.content or "" for m in messages)
            return "ok"

        async with Team(mail, [Teammate("worker", FunctionModel(brain))]) as team:
            await team.ask("worker", "go", timeout=5)
    assert any("note left before you started" in text for text in seen)


async def test_a_second_start_of_a_running_member_is_refused(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t") as mail_a, FileMailboxes(tmp_path / "t") as mail_b:
        writer = Teammate("writer", lambda: ScriptedModel([]))
        async with Team(mail_a, [writer]) as team:
            with pytest.raises(MemberBusy, match=r"'lead' .* already running \(pid \d+"):
                async with Team(mail_b, [writer]):  # one lead per team, too
                    pass
            with pytest.raises(MemberBusy, match=r"'writer' .* already running \(pid \d+"):
                async with Team(mail_b, [writer], lead="lead2"):
                    pass
            assert team.status["writer"].state == "idle"
        async with Team(mail_b, [writer]):  # free again once the first team stopped
            pass


def _crashing_model() -> FunctionModel:
    async def crash(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(0.05)  # long enough for a test to see the teammate working
        if "crash" in newest_task(messages):
            raise RuntimeError("a bug in the teammate")
        return "fine"

    return FunctionModel(crash)


async def test_a_crash_fails_pending_requests_fast_and_is_reported() -> None:
    async with MemoryMailboxes() as mail:
        async with Team(mail, [Teammate("flaky", _crashing_model)]) as team:
            errors: list[RemoteError] = []

            async def ask_for_a_crash() -> None:
                try:
                    await team.ask("flaky", "please crash", timeout=60)
                except RemoteError as exc:
                    errors.append(exc)

            queued = Envelope.request("lead", "flaky", "queued behind", type="task")
            with anyio.fail_after(5):  # far sooner than the requests' 60 s timeouts
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask_for_a_crash)
                    while team.status["flaky"].state != "working":  # noqa: ASYNC110 -- a peek
                        await anyio.sleep(0.001)
                    await mail.send(queued)
            assert "TeammateCrashed: flaky crashed: RuntimeError: a bug" in str(errors[0])
            with pytest.raises(TeammateGone, match="'flaky' crashed and is not running"):
                await team.ask("flaky", "anyone?", timeout=60)
        assert team.status["flaky"].state == "crashed"
        notes = await lead_mail(mail, team)
        (failed,) = [e for e in notes if e.in_reply_to == queued.id]
        assert failed.body["message"] == "flaky crashed and will not restart"
        (crash,) = [e for e in notes if e.type == CRASHED]
        assert crash.body["error"] == "RuntimeError: a bug in the teammate"
        assert crash.body["restarting"] is False


async def test_restart_policy_brings_a_new_incarnation() -> None:
    async with MemoryMailboxes() as mail:
        flaky = Teammate(
            "flaky", _crashing_model, restart=RestartPolicy(on_failure=True, backoff=0.01)
        )
        async with Team(mail, [flaky]) as team:
            first = team.status["flaky"].incarnation
            # the next incarnation resumes the task; when it crashes that one too, the task
            # is given up (task_attempts=2) and the teammate goes on with the rest
            with pytest.raises(RemoteError, match=r"TeammateCrashed.*task tried 2 times"):
                await team.ask("flaky", "crash now", timeout=5)
            assert (await team.ask("flaky", "are you back?", timeout=5)).answer == "fine"
            assert team.status["flaky"].restarts == 2
            assert team.status["flaky"].incarnation != first
        crashes = [e for e in await lead_mail(mail, team) if e.type == CRASHED]
        assert [c.body["restarting"] for c in crashes] == [True, True]


async def test_team_budget_stops_every_member() -> None:
    def chatty(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        thought = call("note", text=f"thought {len(messages)}")
        return thought.model_copy(
            update={"usage": Usage(requests=1, input_tokens=40, output_tokens=10)}
        )

    @tool
    def note(text: str) -> str:
        """Write a note."""
        return text

    budget = TeamBudget(max_tokens=400)
    async with MemoryMailboxes() as mail:
        members = [Teammate(name, FunctionModel(chatty), tools=[note]) for name in ("a", "b")]
        async with Team(mail, members, budget=budget) as team:
            results = {}

            async def ask(name: str) -> None:
                results[name] = await team.ask(name, "think a lot", timeout=10)

            async with anyio.create_task_group() as tg:
                for name in ("a", "b"):
                    tg.start_soon(ask, name)
    for result in results.values():
        assert result.stop_reason == "limit"
        assert "team_max_tokens=400" in result.detail
    assert budget.usage.total_tokens >= 400


async def test_research_writer_demo_runs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from teamrt.demos import research_writer

    monkeypatch.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    assert await research_writer.run(tmp_path, live=False) == 0
    out = capsys.readouterr().out
    document = (tmp_path / "scratch" / "agent-loop.md").read_text()
    assert document.startswith("# The agent loop")
    for heading in ("## Limits", "## Memory", "## The loop"):
        assert heading in document  # one section per note the researcher really read
    assert "researcher -> writer" in out and "writer -> researcher" in out
    assert "teamrt inspect" in out
    transcript = tmp_path / "research-writer" / "agents" / "writer.transcript.jsonl"
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert lines[0]["reply"]["tool_calls"][0]["name"] == "write_file"


async def test_plan_approval_gate_blocks_side_effects_until_approved(tmp_path: Path) -> None:
    written: list[str] = []

    @tool
    def write_file(name: str) -> str:
        """Write a file (a side effect)."""
        (tmp_path / name).write_text("content")
        written.append(name)
        return f"wrote {name}"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        results = [m.content or "" for m in messages if m.role == "tool"]
        if not results:
            return call("write_file", name="intro.md")  # tries to act before asking
        last = results[-1]
        if "needs an approved plan" in last:
            return call("submit_plan", plan="write something")
        if last.startswith("plan rejected"):
            return call("submit_plan", plan="write intro.md with three sections")
        if last.startswith("plan approved"):
            return call("write_file", name="intro.md")
        return "done"

    plans: list[tuple[str, str]] = []

    async def approver(member: str, plan: str) -> tuple[bool, str]:
        plans.append((member, plan))
        return ("three sections" in plan, "too vague" if "three" not in plan else "")

    async with MemoryMailboxes() as mail:
        writer = Teammate(
            "writer", FunctionModel(brain), tools=[write_file], needs_approval=("write_file",)
        )
        async with Team(mail, [writer], approver=approver) as team:
            result = await team.ask("writer", "write the intro", timeout=10)
    assert result.answer == "done"
    assert plans == [
        ("writer", "write something"),
        ("writer", "write intro.md with three sections"),
    ]
    assert written == ["intro.md"]  # once, after the approval
    assert any(e.type == IDLE for e in team.notices)


async def test_errors_in_the_body_are_not_wrapped() -> None:
    async with MemoryMailboxes() as mail:
        with pytest.raises(RemoteError, match="StaleShutdown"):  # noqa: PT012 -- the whole block
            async with Team(mail, [Teammate("writer", lambda: ScriptedModel([]))]):
                stale = Envelope.request(
                    "lead", "writer", ShutdownBody(incarnation="x"), type=SHUTDOWN
                )
                await mail.request(stale, timeout=5)


async def test_mail_racing_the_end_of_a_task_reaches_the_next_one() -> None:
    seen: list[str] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        seen.extend(m.content or "" for m in messages if m.role == "user")
        return "ok"

    async with (
        MemoryMailboxes() as mail,
        Team(mail, [Teammate("worker", FunctionModel(brain))]) as team,
    ):
        await team.ask("worker", "first", timeout=5)
        await mail.send(Envelope.message("lead", "worker", "sent as it went idle"))
        await team.ask("worker", "second", timeout=5)
    assert seen[0] == "first"
    assert any("sent as it went idle" in text for text in seen[1:])


async def test_live_view_prints_each_change_when_not_a_terminal() -> None:
    import io

    from teamrt.demos.live import live_view

    out = io.StringIO()
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [Teammate("writer", lambda: ScriptedModel(["x"]))]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: live_view(team, interval=0.01, out=out))
        await team.ask("writer", "go", timeout=5)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:2] == ["writer", "idle"]
    assert any("tasks  1" in line for line in lines)


async def test_inspect_shows_who_runs_each_member_and_its_last_run(tmp_path: Path) -> None:
    from teamrt.cli.main import main

    team_dir = tmp_path / "t"
    async with (
        FileMailboxes(team_dir) as mail,
        Team(
            mail, [Teammate("writer", lambda: ScriptedModel(["x"]))], agent_dir=team_dir / "agents"
        ) as team,
    ):
        await team.ask("writer", "go", timeout=5)
        code = await anyio.to_thread.run_sync(main, ["inspect", str(team_dir), "--json"])
        assert code == 0
    # the same facts, read from the files once the team has stopped
    from teamrt.agents.journal import summarise
    from teamrt.mail.filestore import lease_holder

    assert lease_holder(team_dir, "writer") is None
    run = summarise(team_dir / "agents" / "writer.state.jsonl")
    assert run is not None and (run["stop_reason"], run["steps"]) == ("answer", 1)


async def test_lease_holder_names_the_running_incarnation(tmp_path: Path) -> None:
    from teamrt.mail.filestore import lease_holder

    team_dir = tmp_path / "t"
    async with (
        FileMailboxes(team_dir) as mail,
        Team(mail, [Teammate("writer", lambda: ScriptedModel([]))]) as team,
    ):
        holder = lease_holder(team_dir, "writer")
        assert holder is not None
        assert team.status["writer"].incarnation in holder and "pid " in holder


async def test_requests_arriving_mid_task_are_served_after_it_even_across_a_restart() -> None:
    started = anyio.Event()

    @tool
    async def wait_a_bit(seconds: float) -> str:
        """Wait."""
        started.set()
        await anyio.sleep(seconds)  # the next request arrives meanwhile
        return "waited"

    def model() -> FunctionModel:
        async def brain(
            messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
        ) -> ModelReply | str:
            task = newest_task(messages)
            if task != "crash":
                return f"did {task}"
            if messages[-1].role == "user":
                return call("wait_a_bit", seconds=0.1)
            raise RuntimeError("boom")  # after the step boundary queued the next request

        return FunctionModel(brain)

    async with MemoryMailboxes() as mail:
        flaky = Teammate(
            "flaky", model, tools=[wait_a_bit], restart=RestartPolicy(on_failure=True, backoff=0.01)
        )
        async with Team(mail, [flaky]) as team:
            results: dict[str, str] = {}

            async def ask(text: str) -> None:
                try:
                    results[text] = (await team.ask("flaky", text, timeout=10)).answer or ""
                except RemoteError as exc:
                    results[text] = exc.error_type

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "crash")
                await started.wait()
                tg.start_soon(ask, "second")
    assert results == {"crash": "TeammateCrashed", "second": "did second"}
