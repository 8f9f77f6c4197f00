"""Edges of supervision, liveness, budgets, streaming and tracing found by a hostile test pass:
each test is the reproduction of a guarantee that once broke, kept as a regression test (the
comments say what was observed before the fix)."""

# ruff: noqa: ASYNC110, ASYNC220, PT012, PT017, SIM117, TID251 -- the reproductions keep the
# shape they were found in: busy-waits on child processes, a library's raw asyncio task, and
# nested blocks that show which layer a failure escaped

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes, RemoteError
from teamrt.agents import Agent, Limits, tool
from teamrt.errors import MemberBusy, RequestTimeout, ToolCrashed
from teamrt.models import ChatMessage, FunctionModel, ModelReply, TextDelta, ToolSpec, Usage, call
from teamrt.team import ProgressBody, RestartPolicy, TaskResult, Team, TeamBudget, Teammate
from tests.support.remote import TESTS, run_agent, until_running


async def test_an_unlimited_team_budget_still_counts_what_the_team_spent() -> None:
    # TeamBudget.usage: "Tokens spent by the whole team (every process, once published)".
    budget = TeamBudget()  # no limits: accounting only
    async with MemoryMailboxes() as mail:
        async with Team(
            mail, [Teammate("w", FunctionModel(lambda m, t: "hi"))], budget=budget
        ) as team:
            with anyio.fail_after(10):
                await team.ask("w", "x", timeout=5)
    assert budget.usage.requests == 1  # observed: 0 (the local charge is overwritten by _sync)


_PROBER = """
import sys, time
import anyio
from teamrt import FileMailboxes

async def main():
    async with FileMailboxes(sys.argv[1]) as mail:
        for i in range(10**7):  # what every waiting request does every 0.5 s
            mail.store.member_alive("worker")
            if i == 1000:
                print("ready", flush=True)

anyio.run(main)
"""


async def test_a_liveness_probe_in_another_process_never_makes_a_starting_member_busy(
    tmp_path: Path,
) -> None:
    # A request waiting on `worker` probes its lease (member_alive takes a shared flock on the
    # lease file for an instant); a (re)starting `worker` taking its lease at that instant must
    # not be refused with MemberBusy: nobody runs it.
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "worker"]) as mail:
        await (await mail.store.acquire_lease("worker", "first run")).release()  # it ran once
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(
            [sys.executable, "-c", _PROBER, str(team)], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            refusals: list[str] = []
            end = time.monotonic() + 3
            while time.monotonic() < end and not refusals:
                try:
                    lease = await mail.store.acquire_lease("worker", "restart")
                except MemberBusy as exc:
                    refusals.append(str(exc))
                else:
                    await lease.release()
            assert refusals == []  # observed: many "already running (unknown holder)"
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


async def test_max_model_time_stops_a_model_call_that_is_running() -> None:
    # README: "Limits(max_model_time=...) per task ... stop a running model call or tool."
    async def hangs(messages: object, tools: object) -> str:
        await anyio.sleep(60)
        return "too late"

    agent = Agent("a", FunctionModel(hangs), limits=Limits(max_model_time=0.2, model_timeout=None))
    with anyio.fail_after(10):  # observed: TimeoutError here, the call is not bounded
        report = await agent.run("x")
    assert report.stop.limit == "max_model_time"


async def test_max_model_time_bounds_the_call_by_what_is_left_of_it() -> None:
    # the same with a per-call timeout far above what is left of the task's model time
    async def hangs(messages: object, tools: object) -> str:
        await anyio.sleep(60)
        return "too late"

    agent = Agent("a", FunctionModel(hangs), limits=Limits(max_model_time=0.2, model_timeout=30))
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.stop.limit == "max_model_time"  # observed: TimeoutError (it waits 30 s)


def exit_in_a_process() -> str:
    """A `process=True` tool with a bug: it calls sys.exit."""
    raise SystemExit(3)


def fine_in_a_process() -> str:
    """A `process=True` tool that works."""
    return "ok"


async def test_a_process_tool_exiting_does_not_break_the_next_process_tool_call() -> None:
    # "A tool that raises SystemExit ... is a crash of its teammate only ... nothing else in
    # the team stops": the worker process that ran it exits but stays in anyio's idle pool,
    # so the next process=True call (of any teammate of this process) fails.
    leaving = tool(process=True)(exit_in_a_process)
    working = tool(process=True)(fine_in_a_process)
    with anyio.fail_after(30):
        with pytest.raises(ToolCrashed, match="SystemExit"):
            await leaving.call(leaving.args_model())
        result = await working.call(working.args_model())
    # observed: ToolResult(content='{"error": "BrokenWorkerProcess: "}', ok=False)
    assert result.ok and result.content == "ok", result


async def test_another_teammates_process_tool_survives_a_teammates_exiting_tool() -> None:
    # The same through a team: "flaky"'s tool exits; "steady", another teammate, then runs its
    # own process=True tool and should get its result.
    leaving = tool(process=True)(exit_in_a_process)
    working = tool(process=True)(fine_in_a_process)

    def flaky_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("exit_in_a_process")

    def steady_brain(
        messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply | str:
        if messages[-1].role == "tool":
            return f"tool said: {messages[-1].content}"
        return call("fine_in_a_process")

    async with MemoryMailboxes() as mail:
        flaky = Teammate("flaky", FunctionModel(flaky_brain), tools=[leaving])
        steady = Teammate("steady", FunctionModel(steady_brain), tools=[working])
        async with Team(mail, [flaky, steady]) as team:
            with anyio.fail_after(30):
                with pytest.raises(RemoteError, match="ToolCrashed"):
                    await team.ask("flaky", "go", timeout=20)
                result = await team.ask("steady", "go", timeout=20)
    # observed: 'tool said: {"error": "BrokenWorkerProcess: "}'
    assert result.answer == "tool said: ok"


@tool
def save(text: str) -> str:
    """Save a document."""
    return f"saved {len(text)} characters"


def _writer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "the document is saved"
    return call("save", text="x" * 200_000)


async def test_streaming_a_task_does_not_crash_a_teammate_whose_tool_call_is_large() -> None:
    # The same task asked works; streamed, the tool call's arguments are sent whole as a
    # task_progress message (tool results are cut at 2,000 characters, arguments are not),
    # which is over the envelope limit: the progress send raises inside the agent's event
    # callback and the teammate crashes.
    async with MemoryMailboxes(max_envelope=100_000) as mail:
        async with Team(mail, [Teammate("w", FunctionModel(_writer), tools=[save])]) as team:
            with anyio.fail_after(20):
                asked = await team.ask("w", "write it", timeout=10)
                assert asked.answer == "the document is saved"
                events = []
                async with team.stream("w", "write it again", timeout=10) as stream:
                    async for event in stream:
                        events.append(event)
    # observed: RemoteError TeammateCrashed ... EnvelopeTooLarge from the iterator
    last = events[-1]
    assert isinstance(last, TaskResult) and last.answer == "the document is saved"


def _unpriced_spend(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    thought = call("note", text=f"thought {len(messages)}")
    return thought.model_copy(update={"usage": Usage(requests=1, input_tokens=150)})


@tool
def note(text: str) -> str:
    """Write a note."""
    return text


#: a model nobody priced ("mystery"), thinking for ever: a cost budget must refuse or stop it
unpriced_spender = Teammate(
    "w",
    FunctionModel(_unpriced_spend, name="mystery"),
    tools=[note],
    limits=Limits(max_steps=300, max_tool_calls=1000, max_repeats=1000, max_stale_steps=1000),
)


async def _stop(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.kill()
    await anyio.to_thread.run_sync(proc.wait)
    assert proc.stdout is not None and proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    return err


async def test_a_remote_teammate_with_an_unpriced_model_is_held_to_the_team_cost_budget(
    tmp_path: Path,
) -> None:
    # README: a cost budget needs every member's model to have a price (unpriced="refuse" by
    # default). A local unpriced teammate crashes at its first task with UsageError ("cannot
    # be kept with model 'mystery', which has no price"); the remote one (run-agent started
    # before the lead published the ledger, as in tests/team/test_remote_members.py) spends
    # until its own step limit: every call of its unpriced model is charged $0 against the team's
    # max_cost.
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "unpriced_spender", module="tests.team.test_supervision_edges")
        try:
            await until_running(mail, proc)
            budget = TeamBudget(max_cost=0.000001)
            async with Team(mail, [], remote=["w"], budget=budget) as lead:
                with anyio.fail_after(60):
                    try:
                        result = await lead.ask("w", "think", timeout=60)
                    except RemoteError as exc:  # refused for its missing price: fine
                        assert "no price" in str(exc)
                        return
        finally:
            await _stop(proc)
    # observed: stop_reason 'limit' on max_steps=300 after 300 model calls, cost 0
    assert "team_max_cost" in result.detail, (result.stop_reason, result.detail, result.steps)


def _crash_once(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    raise RuntimeError("a bug on the first task")


#: crashes on its task and restarts after a backoff of 2 to 4 s
slow_restarter = Teammate(
    "w",
    FunctionModel(_crash_once),
    restart=RestartPolicy(on_failure=True, backoff=4, max_backoff=4, task_attempts=1),
)

#: crashes on its task and restarts after a backoff of 30 to 60 s
slower_restarter = Teammate(
    "w",
    FunctionModel(_crash_once),
    restart=RestartPolicy(on_failure=True, backoff=60, max_backoff=60, task_attempts=1),
)


async def test_a_remote_teammate_in_a_restart_backoff_stops_at_the_team_shutdown(
    tmp_path: Path,
) -> None:
    # README: "A shutdown during a restart backoff ends the teammate at once", and run-agent
    # "enforces the deadline of the shutdown request it accepts by itself". A remote teammate
    # in its backoff reads nothing; its next incarnation finds the shutdown expired, answers
    # Expired, and runs on: the process never exits.
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "slow_restarter", module="tests.team.test_supervision_edges")
        try:
            await until_running(mail, proc)
            async with Team(mail, [], remote=["w"], shutdown_deadline=0.5) as lead:
                with anyio.fail_after(10), pytest.raises(RemoteError, match="TeammateCrashed"):
                    await lead.ask("w", "go", timeout=30)
                # it is in its restart backoff now; leaving the block shuts the team down
            with anyio.move_on_after(15):
                while proc.poll() is None:
                    await anyio.sleep(0.05)
            assert proc.poll() is not None, "run-agent still running 15 s after the shutdown"
        finally:
            await _stop(proc)


async def test_a_remote_teammate_in_a_long_restart_backoff_stops_at_once_at_the_shutdown(
    tmp_path: Path,
) -> None:
    # README: "A shutdown during a restart backoff ends the teammate at once" (in-process, Team
    # cancels a restarting member's scope). A run-agent member in its backoff reads no mail, so
    # it keeps running until the backoff ends (30 to 60 s here), long past the shutdown deadline.
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w"]) as mail:
        proc = run_agent(team, "slower_restarter", module="tests.team.test_supervision_edges")
        try:
            await until_running(mail, proc)
            async with Team(mail, [], remote=["w"], shutdown_deadline=0.5) as lead:
                with anyio.fail_after(10), pytest.raises(RemoteError, match="TeammateCrashed"):
                    await lead.ask("w", "go", timeout=30)
            with anyio.move_on_after(10):  # deadline 0.5 s; 10 s is generous
                while proc.poll() is None:
                    await anyio.sleep(0.05)
            assert proc.poll() is not None, "run-agent still running 10 s after the shutdown"
        finally:
            await _stop(proc)


@tool
def leave() -> str:
    """Exits the process (a bug in a tool)."""
    raise SystemExit(3)


def _leaver(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    return "done" if messages[-1].role == "tool" else call("leave")


async def test_a_streamed_run_raises_the_errors_of_run_as_they_are() -> None:
    # Agent.run raises ToolCrashed; Agent.stream should raise it too (as Team.stream does with
    # the errors of ask: "raised out of the task group as it is, not grouped").
    with pytest.raises(ToolCrashed):
        await Agent("a", FunctionModel(_leaver), tools=[leave]).run("x")
    with anyio.fail_after(10), pytest.raises(ToolCrashed):  # observed: ExceptionGroup
        async with Agent("a", FunctionModel(_leaver), tools=[leave]).stream("x") as events:
            async for _ in events:
                pass


@tool
async def fetch() -> str:
    """Awaits a background job that something else cancelled (a library's asyncio task)."""
    job = asyncio.ensure_future(asyncio.sleep(10))
    job.cancel()
    await job  # raises asyncio.CancelledError: no cancel scope of ours asked for it
    return "never"


async def test_a_stray_cancelled_error_from_a_tool_stays_in_its_teammate() -> None:
    # "Faults stay where they happen": a CancelledError that no cancel scope of the team raised
    # is a fault of that tool. Observed: it is re-raised as cancellation (tools.py: `if
    # isinstance(exc, anyio.get_cancelled_exc_class()): raise`); the lead's ask and then the
    # other teammate's ask end in CancelledError, flaky stays 'working', and both teammates are
    # cancelled at the shutdown deadline.
    def flaky_brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        return "done" if messages[-1].role == "tool" else call("fetch")

    outcomes: list[str] = []
    async with MemoryMailboxes() as mail:
        flaky = Teammate("flaky", FunctionModel(flaky_brain), tools=[fetch])
        steady = Teammate("steady", FunctionModel(lambda m, t: "still here"))
        async with Team(mail, [flaky, steady], shutdown_deadline=1) as team:
            for member in ("flaky", "steady"):
                try:
                    with anyio.fail_after(5):
                        result = await team.ask(member, "go", timeout=4)
                    outcomes.append(f"{member}: {result.answer}")
                except Exception as exc:
                    outcomes.append(f"{member}: {type(exc).__name__}")
                except BaseException as exc:
                    outcomes.append(f"{member}: escaped {type(exc).__name__}")
    assert outcomes[1] == "steady: still here", outcomes
    assert outcomes[0] in ("flaky: RemoteError", "flaky: done"), outcomes


async def test_a_stray_cancelled_error_from_a_model_stays_in_its_teammate() -> None:
    # The same from a model adapter (an HTTP client whose inner task was cancelled): observed,
    # the lead's own code is cancelled (loop.py _call_model catches LimitExceeded and ModelError
    # only; team.py _incarnation catches Exception).
    async def broken(messages: object, tools: object) -> str:
        job = asyncio.ensure_future(asyncio.sleep(10))
        job.cancel()
        await job
        return "never"

    outcomes: list[str] = []
    async with MemoryMailboxes() as mail:
        flaky = Teammate("flaky", FunctionModel(broken))
        steady = Teammate("steady", FunctionModel(lambda m, t: "still here"))
        async with Team(mail, [flaky, steady], shutdown_deadline=1) as team:
            for member in ("flaky", "steady"):
                try:
                    with anyio.fail_after(5):
                        result = await team.ask(member, "go", timeout=4)
                    outcomes.append(f"{member}: {result.stop_reason}")
                except Exception as exc:
                    outcomes.append(f"{member}: {type(exc).__name__}")
                except BaseException as exc:
                    outcomes.append(f"{member}: escaped {type(exc).__name__}")
    assert outcomes[1] == "steady: answer", outcomes
    assert outcomes[0] in ("flaky: RemoteError", "flaky: model_error"), outcomes


async def test_a_remote_teammate_in_its_restart_backoff_is_not_gone(tmp_path: Path) -> None:
    # "a teammate keeps its lease through restart backoffs": another process asking it during
    # the backoff waits (RequestTimeout here), it does not get TeammateGone.
    team = tmp_path / "t"
    async with FileMailboxes(team, members=["lead", "w", "other"]) as mail:
        proc = run_agent(team, "slower_restarter", module="tests.team.test_supervision_edges")
        try:
            await until_running(mail, proc)
            async with Team(mail, [], remote=["w"], shutdown_deadline=0.5) as lead:
                with anyio.fail_after(10), pytest.raises(RemoteError, match="TeammateCrashed"):
                    await lead.ask("w", "go", timeout=30)
                request = Envelope.request("other", "w", "still there?", type="task")
                with anyio.fail_after(20), pytest.raises(RequestTimeout):
                    await mail.request(request, timeout=6)
        finally:
            await _stop(proc)


class _Stalling:
    """A streaming model that writes two pieces of text 1 ms apart, then thinks (until told to
    go on) before finishing its reply: as a slow model does mid-answer."""

    def __init__(self) -> None:
        self.go_on = anyio.Event()

    @property
    def name(self) -> str:
        return "function"

    async def complete(self, messages: object, tools: object) -> ModelReply:
        raise AssertionError("a listener is there: stream() is used")

    async def stream(
        self, messages: object, tools: object
    ) -> AsyncIterator[TextDelta | ModelReply]:
        yield TextDelta(text="first ")
        await anyio.sleep(0.001)
        yield TextDelta(text="second ")
        await self.go_on.wait()
        yield TextDelta(text="third")
        yield ModelReply(text="first second third")


async def test_streamed_text_reaches_the_lead_while_the_model_is_still_thinking() -> None:
    # team.stream: progress is "batched: one message per _PROGRESS_EVERY (0.05 s) seconds of
    # writing". Text written just after a flush waits for the next piece of text, however long
    # the model takes to write it: here "second " is not seen until the model goes on.
    model = _Stalling()
    async with MemoryMailboxes() as mail, Team(mail, [Teammate("w", model)]) as team:
        seen = ""
        with anyio.fail_after(10):
            async with team.stream("w", "write", timeout=30) as events:
                with anyio.move_on_after(3):  # 60 batching periods
                    async for event in events:
                        if isinstance(event, ProgressBody) and event.event == "text":
                            seen += event.text
                        if "second" in seen:
                            break
                model.go_on.set()
    assert seen.startswith("first second"), seen  # observed: 'first '
