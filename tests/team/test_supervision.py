"""Supervision: faults stay inside the teammate that had them, and every deadline holds while a
model call or a tool is running (threads abandoned, worker processes killed)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, MemoryMailboxes, RemoteError
from teamrt.agents import Agent, Limits, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call
from teamrt.team import CRASHED, RestartPolicy, Team, TeamBudget, Teammate


def _newest(messages: Sequence[ChatMessage]) -> str:
    return next((m.content or "" for m in reversed(messages) if m.role == "user"), "")


async def test_an_approver_that_raises_rejects_the_plan_and_the_team_goes_on() -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return f"outcome: {messages[-1].content}"
        return call("submit_plan", plan="do it")

    async def broken(member: str, plan: str) -> tuple[bool, str]:
        raise KeyError("the approver's own bug")

    async with MemoryMailboxes() as mail:
        writer = Teammate("writer", FunctionModel(brain), needs_approval=["x"])
        async with Team(mail, [writer], approver=broken) as team:
            result = await team.ask("writer", "plan something", timeout=5)
            assert result.answer is not None
            assert "plan rejected: the approver failed: KeyError" in result.answer
            assert (await team.ask("writer", "again", timeout=5)).answer is not None


async def test_a_tool_raising_system_exit_is_a_crash_of_that_teammate_only() -> None:
    @tool
    def leave() -> str:
        """Exits the process (a bug in a tool)."""
        raise SystemExit(3)

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if _newest(messages) == "exit" and messages[-1].role == "user":
            return call("leave")
        return "fine"

    async with MemoryMailboxes() as mail:
        flaky = Teammate(
            "flaky",
            FunctionModel(brain),
            tools=[leave],
            restart=RestartPolicy(on_failure=True, backoff=0.01, task_attempts=1),
        )
        steady = Teammate("steady", FunctionModel(lambda m, t: "still here"))
        async with Team(mail, [flaky, steady]) as team:
            with pytest.raises(RemoteError, match="ToolCrashed: tool leave raised SystemExit: 3"):
                await team.ask("flaky", "exit", timeout=5)
            assert (await team.ask("steady", "ok?", timeout=5)).answer == "still here"
            assert (await team.ask("flaky", "back?", timeout=5)).answer == "fine"
            assert team.status["flaky"].restarts == 1
        (crash,) = [e for e in team.notices if e.type == CRASHED]
        assert crash.body["error"].startswith("ToolCrashed") and crash.body["restarting"]


async def test_shutdown_during_a_restart_backoff_completes_within_its_deadline() -> None:
    def crash(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise RuntimeError("down")

    async with MemoryMailboxes() as mail:
        slow_restart = RestartPolicy(on_failure=True, backoff=60, max_backoff=60, task_attempts=1)
        team = Team(
            mail, [Teammate("w", FunctionModel(crash), restart=slow_restart)], shutdown_deadline=30
        )
        with anyio.fail_after(5):  # far less than the backoff or the deadline
            async with team:
                with pytest.raises(RemoteError):
                    await team.ask("w", "crash", timeout=5)
                while team.status["w"].state != "restarting":  # noqa: ASYNC110 -- a peek
                    await anyio.sleep(0.001)
        final: str = team.status["w"].state
        assert final == "stopped"


async def test_a_thread_tool_is_abandoned_at_the_agent_deadline_and_at_shutdown() -> None:
    release, entered = threading.Event(), threading.Event()

    @tool(thread=True)
    def block() -> str:
        """Blocks a thread until released."""
        entered.set()
        release.wait(30)
        return "late"

    try:
        model = ScriptedModel([call("block"), "unreachable"])
        with anyio.fail_after(5):
            # a deadline the first step reaches the tool within even on a loaded machine (at
            # 0.1 s it once passed before the tool started, under a load average of 4)
            report = await Agent("a", model, tools=[block], limits=Limits(deadline=1.0)).run("x")
        assert report.stop.limit == "deadline" and "while block ran" in report.stop.detail

        async with MemoryMailboxes() as mail:
            stuck = Teammate("stuck", ScriptedModel([call("block"), "x"]), tools=[block])
            team = Team(mail, [stuck], shutdown_deadline=0.2)
            with anyio.fail_after(5):
                async with team:
                    entered.clear()
                    await mail.send(Envelope.request("lead", "stuck", "block", type="task"))
                    while not entered.is_set():  # noqa: ASYNC110 -- a thread sets it
                        await anyio.sleep(0.001)
            assert team.status["stuck"].last == "cancelled at the shutdown deadline"
    finally:
        release.set()


async def test_the_team_deadline_interrupts_a_running_model_call() -> None:
    async def slow(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(30)
        return "too late"

    async with MemoryMailboxes() as mail:
        team = Team(mail, [Teammate("w", FunctionModel(slow))], budget=TeamBudget(deadline=0.2))
        with anyio.fail_after(5):
            async with team:
                result = await team.ask("w", "think", timeout=10)
    assert result.stop_reason == "limit"
    assert "team_deadline=0.2" in result.detail and "during a model call" in result.detail


def sleep_in_a_process(seconds: float, pid_file: str) -> str:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "woke"


async def test_a_process_tool_is_killed_at_the_deadline(tmp_path: Path) -> None:
    nap = tool(process=True)(sleep_in_a_process)
    warm = tmp_path / "warm"
    await nap.call(nap.args_model(seconds=0, pid_file=str(warm)))  # a worker is up and idle now
    pid_file = tmp_path / "pid"
    model = ScriptedModel([call("sleep_in_a_process", seconds=30, pid_file=str(pid_file)), "x"])
    with anyio.fail_after(20):
        report = await Agent("a", model, tools=[nap], limits=Limits(deadline=2)).run("nap")
    assert report.stop.limit == "deadline"
    pid = int(pid_file.read_text())
    with anyio.fail_after(5):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break  # the worker was killed, not left sleeping
            await anyio.sleep(0.01)


async def test_a_hung_teammate_can_be_cancelled_and_restarted() -> None:
    @tool
    async def hang() -> str:
        """Never returns."""
        await anyio.sleep_forever()
        return "never"

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return call("hang") if _newest(messages) == "hang" else "answered"

    async with MemoryMailboxes() as mail:
        worker = Teammate(
            "w", FunctionModel(brain), tools=[hang], restart=RestartPolicy(on_failure=True)
        )
        async with Team(mail, [worker]) as team:
            outcome: list[str] = []

            async def ask() -> None:
                try:
                    await team.ask("w", "hang", timeout=30)
                except RemoteError as exc:
                    outcome.append(str(exc))

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask)
                    while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                        await anyio.sleep(0.001)
                    await team.cancel("w", "no answer in 30 s")
            assert "TeammateCancelled: no answer in 30 s" in outcome[0]
            assert (await team.ask("w", "next", timeout=5)).answer == "answered"


async def test_a_request_cycle_between_busy_members_is_broken_at_once() -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return f"got: {messages[-1].content}"
        other = "b" if _newest(messages).startswith("ask b") else "a"
        if _newest(messages).startswith("ask"):
            return call("request", to=other, text=f"ask {'a' if other == 'b' else 'b'} back")
        return "plain answer"

    async with MemoryMailboxes() as mail:
        members = [Teammate(n, FunctionModel(brain)) for n in ("a", "b")]
        async with Team(mail, members) as team:
            with anyio.fail_after(5):  # not the 30 s request timeout
                result = await team.ask("a", "ask b", timeout=10)
    # a asks b; b, busy with that, asks a back: that closes the cycle and is refused at once
    assert result.answer is not None
    assert "Deadlock: b -> a -> b" in result.answer


async def test_an_undeclared_remote_member_is_refused() -> None:
    from teamrt.errors import UsageError

    async with MemoryMailboxes(members=["lead", "writer"]) as mail:
        with pytest.raises(UsageError, match=r"\['wirter'\] are not in the team's roster"):
            async with Team(mail, [], remote=["wirter"]):
                pass
        async with Team(mail, [], remote=["writer"]):
            pass


async def test_a_crash_and_a_cancellation_are_recorded_in_the_agents_journal(
    tmp_path: Path,
) -> None:
    import json

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if _newest(messages) == "crash":
            raise RuntimeError("the model client broke")
        return call("hang") if _newest(messages) == "hang" else "fine"

    @tool
    async def hang() -> str:
        """Never returns."""
        await anyio.sleep_forever()
        return "never"

    agents = tmp_path / "agents"
    policy = RestartPolicy(on_failure=True, backoff=0.01, task_attempts=1)
    async with MemoryMailboxes() as mail:
        worker = Teammate("w", FunctionModel(brain), tools=[hang], restart=policy)
        async with Team(mail, [worker], agent_dir=agents, shutdown_deadline=0.2) as team:
            with pytest.raises(RemoteError):
                await team.ask("w", "crash", timeout=5)
            await mail.send(Envelope.request("lead", "w", "hang", type="task"))
            while team.status["w"].state != "working":  # noqa: ASYNC110 -- a peek
                await anyio.sleep(0.001)
    kinds = [json.loads(line)["t"] for line in (agents / "w.state.jsonl").read_text().splitlines()]
    lines = [json.loads(x) for x in (agents / "w.state.jsonl").read_text().splitlines()]
    assert "cancel" in kinds
    assert any(r["t"] == "cancel" and "shutdown deadline" in r["detail"] for r in lines)


class _SlowToClose:
    """A factory-made model whose client takes long to close."""

    name = "slow-close"

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply:
        return ModelReply(text="ok")

    async def aclose(self) -> None:
        await anyio.sleep(60)


async def test_a_model_clients_close_is_bounded_by_the_shutdown_deadline_set_after_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`team.shutdown_deadline` changed while the team runs bounds what it bounds from then on,
    including the close of a teammate's model client at the end of its incarnation."""
    bounds: list[float] = []
    move_on_after = anyio.move_on_after

    def recording(delay: float, *, shield: bool = False) -> anyio.CancelScope:
        if shield:  # what must finish even while the team is cancelled: the client's close
            bounds.append(delay)
        return move_on_after(delay, shield=shield)

    async with MemoryMailboxes() as mail:
        team = Team(mail, [Teammate("a", lambda: _SlowToClose())], shutdown_deadline=5.0)
        async with team:
            assert (await team.ask("a", "hi", timeout=5)).answer == "ok"
            team.shutdown_deadline = 0.2
            monkeypatch.setattr(anyio, "move_on_after", recording)
    assert 0.2 in bounds, bounds


async def test_members_that_miss_the_shutdown_deadline_are_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shutdown that cancels many teammates says so once, naming them, not once per member
    (nor twice: by the team's sweep and by each member's own shutdown timer)."""
    names = ["a", "b", "c"]
    thinking: set[str] = set()
    all_thinking = anyio.Event()

    async def slow(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        thinking.add(_newest(messages))
        if len(thinking) == len(names):
            all_thinking.set()
        await anyio.sleep(30)
        return "too late"

    async with MemoryMailboxes() as mail:
        team = Team(mail, [Teammate(n, FunctionModel(slow)) for n in names], shutdown_deadline=0.2)
        with caplog.at_level(logging.WARNING, logger="teamrt"), anyio.fail_after(10):
            async with team:
                for n in names:
                    await mail.send(Envelope.request("lead", n, f"think {n}", type="task"))
                await all_thinking.wait()
    late = [r.getMessage() for r in caplog.records if "shutdown deadline" in r.getMessage()]
    assert len(late) == 1, late
    assert all(repr(n) in late[0] for n in names) and late[0].startswith("3 teammates"), late
    assert {team.status[n].last for n in names} == {"cancelled at the shutdown deadline"}
