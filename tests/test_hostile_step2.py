"""A hostile pass over the agent step's short ways: the model call's deadline made and taken
back by the run's one timer, models made from valid parts without validation, the state's
fields set straight into its dict, plain sync tools run without a coroutine. Each test says
what must hold whatever way the step is reached."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import ConfigDict, ValidationError, field_validator

from teamrt import MemoryMailboxes
from teamrt.agents import Agent, Limits, RunReport, Toolbox, current_call_id, tool
from teamrt.agents.state import AgentState, OpenStep
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call
from teamrt.models.base import ToolCall, Usage
from teamrt.team import Team, TeamBudget, Teammate


def _no_cancellation_left() -> None:
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


def _hanging(entered: anyio.Event | None = None) -> FunctionModel:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        if entered is not None:
            entered.set()
        await anyio.sleep(30)
        return "never"

    return FunctionModel(model)


# -- the model call's deadline ---------------------------------------------------------------


async def test_a_model_that_raises_a_cancellation_itself_under_a_deadline_is_its_fault() -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.lowlevel.checkpoint()
        raise asyncio.CancelledError  # not a cancellation of the task

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=5, deadline=10))
    report = await agent.run("x")
    assert report.stop.reason == "model_error" and "cancellation of its own" in report.stop.detail
    _no_cancellation_left()
    await anyio.lowlevel.checkpoint()


async def test_a_model_turning_the_deadlines_cancellation_into_a_timeout_error() -> None:
    # bug: the TimeoutError a model made of the deadline's cancellation escaped the run (it
    # was a limit stop while the deadline was an asyncio.timeout, which this keeps)
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        try:
            await anyio.sleep(30)
        except asyncio.CancelledError:
            raise TimeoutError("mine") from None
        return "never"

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=0.02))
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.stop.limit == "model_timeout"
    _no_cancellation_left()
    await anyio.lowlevel.checkpoint()


@pytest.mark.parametrize("limits", ["model_timeout", "max_model_time", "deadline", "all"])
async def test_each_deadline_stops_a_hanging_call_and_says_which(limits: str) -> None:
    given: dict[str, Any] = {
        "model_timeout": {"model_timeout": 0.03},
        "max_model_time": {"max_model_time": 0.03},
        "deadline": {"deadline": 0.03},
        "all": {"model_timeout": 0.03, "max_model_time": 5, "deadline": 10},
    }[limits]
    agent = Agent("a", _hanging(), limits=Limits(**given))
    with anyio.fail_after(10):
        report = await agent.run("x")
    expected = "model_timeout" if limits == "all" else limits
    assert report.stop.reason == "limit" and report.stop.limit == expected
    _no_cancellation_left()
    await anyio.lowlevel.checkpoint()


async def test_max_model_time_spent_over_calls_cuts_the_last_one() -> None:
    # the task's model time runs out during the third call (each call takes a little of it)
    n = 0

    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal n
        n += 1
        await anyio.sleep(0.01 if n < 3 else 30)
        return call("noop")

    def noop() -> str:
        """Nothing."""
        return "ok"

    agent = Agent(
        "a",
        FunctionModel(model),
        tools=[noop],
        limits=Limits(model_timeout=5, max_model_time=0.3),
    )
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.stop.limit == "max_model_time" and n == 3
    _no_cancellation_left()


async def test_a_call_that_overruns_without_suspending_leaves_the_next_call_alone() -> None:
    # call 1 blocks past its deadline and returns without suspending again: its reply stands
    # (nothing could cancel it); the timer then fires between calls and must not cut call 2
    n = 0

    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal n
        n += 1
        if n == 1:
            await anyio.lowlevel.checkpoint()
            time.sleep(0.06)  # past the deadline, no checkpoint after it
            return call("noop")
        await anyio.lowlevel.checkpoint()
        return ModelReply(text="second")

    def noop() -> str:
        """Nothing."""
        return "ok"

    agent = Agent("a", FunctionModel(model), tools=[noop], limits=Limits(model_timeout=0.04))
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.ok and report.answer == "second"
    _no_cancellation_left()


async def test_a_deadline_due_at_the_calls_very_end_is_one_outcome_and_leaves_nothing() -> None:
    # the model blocks past its deadline and then checkpoints once: the step resuming it and
    # the timer are due at the same pass. Either the reply stands or the call is cut; the task
    # is left with no cancellation either way, and the next run is not cut early.
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.lowlevel.checkpoint()
        time.sleep(0.05)
        await asyncio.sleep(0)
        return "made it"

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=0.03))
    report = await agent.run("x")
    assert report.answer == "made it" or report.stop.limit == "model_timeout"
    _no_cancellation_left()
    await anyio.lowlevel.checkpoint()
    quick = Agent("b", ScriptedModel(["fine"]), limits=Limits(model_timeout=0.03))
    assert (await quick.run("y")).answer == "fine"


@pytest.mark.parametrize("outer", ["move_on_after", "fail_after", "asyncio.timeout"])
async def test_an_outer_scope_that_expires_first_cancels_the_run(outer: str) -> None:
    agent = Agent("a", _hanging(), limits=Limits(model_timeout=5))
    expired = False
    try:
        if outer == "move_on_after":
            with anyio.move_on_after(0.03) as scope:
                await agent.run("x")
            expired = scope.cancelled_caught
        elif outer == "fail_after":
            with anyio.fail_after(0.03):
                await agent.run("x")
        else:
            async with asyncio.timeout(0.03):
                await agent.run("x")
    except TimeoutError:
        expired = True
    assert expired
    assert agent.state is not None and agent.state.stop is None  # cancelled, not a limit stop
    _no_cancellation_left()
    await anyio.lowlevel.checkpoint()


async def test_a_deadline_inside_nested_scopes_that_expire_later_is_a_limit_stop() -> None:
    agent = Agent("a", _hanging(), limits=Limits(model_timeout=0.03))
    with anyio.move_on_after(20) as outer:
        with anyio.CancelScope() as inner:
            async with asyncio.timeout(10):
                report = await agent.run("x")
    assert not outer.cancelled_caught and not inner.cancelled_caught
    assert report.stop.limit == "model_timeout"
    _no_cancellation_left()


async def test_a_run_cancelled_twice_while_its_deadline_passes_stays_cancelled() -> None:
    entered = anyio.Event()
    agent = Agent("a", _hanging(entered), limits=Limits(model_timeout=0.02))
    running: list[asyncio.Task[Any]] = []
    outcome: list[str] = []

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        running.append(task)
        try:
            await agent.run("x")
        except asyncio.CancelledError:
            outcome.append(f"cancelled, {task.cancelling()} pending")
            raise
        outcome.append("returned")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await entered.wait()
        running[0].cancel()
        running[0].cancel()
        time.sleep(0.04)  # the deadline is due at the same pass as the two cancellations
    assert outcome == ["cancelled, 2 pending"]
    assert agent.state is not None and agent.state.stop is None
    _no_cancellation_left()


async def test_an_outside_cancellation_the_run_catches_does_not_become_a_deadline() -> None:
    # the task was already being cancelled (a cancellation someone caught) when the call
    # started: the deadline's own cancellation is still told apart and taken back
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    assert task.cancelling() == 1
    agent = Agent("a", _hanging(), limits=Limits(model_timeout=0.02))
    try:
        with anyio.fail_after(10):
            report = await agent.run("x")
        assert report.stop.limit == "model_timeout"
        assert task.cancelling() == 1
    finally:
        task.uncancel()


def test_asyncio_run_twice_after_a_run_cancelled_mid_call() -> None:
    agent = Agent("a", _hanging(), limits=Limits(model_timeout=0.05))

    async def cut() -> None:
        with anyio.move_on_after(0.01):
            await agent.run("x")

    asyncio.run(cut())
    # a new loop: the deadline still fires there, and only there
    report = asyncio.run(agent.run("y"))
    assert report.stop.limit == "model_timeout"


async def test_many_agents_at_once_each_keep_their_own_deadline() -> None:
    async def model_for(i: int) -> FunctionModel:
        async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
            await anyio.sleep(30 if i % 2 else 0.001 * (i % 5))
            return f"answer {i}"

        return FunctionModel(model)

    agents = [
        Agent(f"a{i}", await model_for(i), limits=Limits(model_timeout=0.5)) for i in range(40)
    ]
    reports: dict[int, RunReport] = {}

    async def one(i: int) -> None:
        reports[i] = await agents[i].run("x")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
    for i, report in reports.items():
        if i % 2:
            assert report.stop.limit == "model_timeout"
        else:
            assert report.answer == f"answer {i}"


async def test_a_streamed_run_and_an_on_event_run_stop_at_the_deadline() -> None:
    events: list[Any] = []

    async def note(event: Any) -> None:
        events.append(event)

    agent = Agent("a", _hanging(), limits=Limits(model_timeout=0.03), on_event=note)
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.stop.limit == "model_timeout"
    streamed = Agent("b", _hanging(), limits=Limits(model_timeout=0.03))
    with anyio.fail_after(10):
        async with streamed.stream("x") as stream:
            last = [event async for event in stream][-1]
    assert isinstance(last, RunReport) and last.stop.limit == "model_timeout"
    _no_cancellation_left()


async def test_a_resumed_run_keeps_its_deadline(tmp_path: Any) -> None:
    n = 0

    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal n
        n += 1
        if n == 1:
            return call("noop")
        if n == 2:
            raise KeyboardInterrupt  # the process dies mid-run
        await anyio.sleep(30)
        return ModelReply(text="never")

    def noop() -> str:
        """Nothing."""
        return "ok"

    agent = Agent(
        "a",
        FunctionModel(model),
        tools=[noop],
        limits=Limits(model_timeout=0.03),
        directory=tmp_path,
    )
    with pytest.raises(KeyboardInterrupt):
        await agent.run("x")
    again = Agent(
        "a",
        FunctionModel(model),
        tools=[noop],
        limits=Limits(model_timeout=0.03),
        directory=tmp_path,
    )
    with anyio.fail_after(10):
        report = await again.resume()
    assert report.stop.limit == "model_timeout"
    _no_cancellation_left()


# -- models made from valid parts --------------------------------------------------------------


def test_a_constructed_reply_with_raw_tool_calls_becomes_a_valid_message() -> None:
    # bug: as_message assembled raw dicts into the message's tool calls. A reply made with
    # model_construct holds what it was given: a message made of it is validated (the tool
    # calls become ToolCalls, as validation makes them), not trusted
    raw = {"id": "c1", "name": "look", "arguments": "{}"}
    raw_calls: Any = (raw,)
    reply = ModelReply.model_construct(text="t", tool_calls=raw_calls, reasoning=())
    message = reply.as_message()
    assert message == ChatMessage(role="assistant", content="t", tool_calls=(ToolCall(**raw),))
    assert type(message.tool_calls[0]) is ToolCall
    not_dicts: Any = ("not a dict",)
    odd = ModelReply.model_construct(text=None, tool_calls=(), reasoning=not_dicts)
    with pytest.raises(ValidationError):
        odd.as_message()


def test_subclasses_keep_their_own_validation() -> None:
    # bug: OpenStep.of assembled a subclass of OpenStep, skipping the subclass's validators
    class Shouting(ChatMessage):
        @field_validator("content")
        @classmethod
        def _loud(cls, value: str | None) -> str | None:
            return value.upper() if value is not None else None

    made = Shouting.tool_result(ToolCall(id="c", name="n"), "quiet")
    assert type(made) is Shouting and made.content == "QUIET"

    class Checked(OpenStep):
        @field_validator("finish_reason")
        @classmethod
        def _known(cls, value: str | None) -> str | None:
            if value not in (None, "stop", "length"):
                raise ValueError("unknown finish reason")
            return value

    message = ModelReply(text="t").as_message()
    assert type(Checked.of(message, "stop")) is Checked
    with pytest.raises(ValidationError):
        Checked.of(message, "odd")

    class Counted(Usage):
        pass

    total = Counted(requests=1) + Counted(input_tokens=2)
    assert type(total) is Usage and total == Usage(requests=1, input_tokens=2)


def test_assembled_models_compare_hash_pickle_and_dump_as_validated_ones() -> None:
    tool_call = ToolCall(id="c1", name="look")
    made = ChatMessage.tool_result(tool_call, "r")
    validated = ChatMessage(role="tool", content="r", tool_call_id="c1", name="look")
    assert {made: 1}[validated] == 1
    assert pickle.loads(pickle.dumps(made)) == validated
    assert ChatMessage.model_validate_json(made.model_dump_json()) == made
    assert made.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
    assert made.model_copy(update={"content": "s"}).content == "s"
    with pytest.raises(ValidationError):
        made.content = "s"  # type: ignore[misc]
    total = Usage(requests=1) + Usage(requests=2)
    assert total.model_dump(exclude_defaults=True) == {"requests": 3}
    assert hash(total) == hash(Usage(requests=3))
    # summing keeps each operand's fields set apart (no set shared between models)
    total.model_fields_set.add("x")
    assert "x" not in (Usage(requests=1) + Usage(requests=2)).model_fields_set


# -- the state's fields set straight into its dict -------------------------------------------


async def test_a_state_after_a_run_knows_the_fields_the_loop_set() -> None:
    # bug: fields set straight into the dict were not noted as set: a dump with
    # exclude_unset lost the stop, the steps and the answer
    def noop() -> str:
        """Nothing."""
        return "ok"

    agent = Agent("a", ScriptedModel([call("noop"), "done"]), tools=[noop])
    report = await agent.run("x")
    state = agent.state
    assert state is not None and report.answer == "done"
    unset = state.model_dump(exclude_unset=True)
    assert unset["stop"]["reason"] == "answer"
    assert unset["steps"] == 2 and unset["answer"] == "done"
    assert {"stop", "steps", "answer"} <= state.model_fields_set
    copied = state.model_copy()
    assert copied == state and copied.model_fields_set == state.model_fields_set
    assert AgentState.model_validate(state.model_dump()) == state


def test_a_state_refuses_an_attribute_it_has_no_field_for() -> None:
    # bug: a misspelt field was taken silently into the dict (and made states unequal)
    state = AgentState(agent="a", task="t", messages=[])
    with pytest.raises((ValueError, AttributeError)):
        state.stepz = 3
    assert state == AgentState(agent="a", task="t", messages=[])


def test_a_state_subclass_that_validates_assignment_still_does() -> None:
    # bug: the subclass inherited the unvalidated setter
    class Strict(AgentState):
        model_config = ConfigDict(validate_assignment=True)

    state = Strict(agent="a", task="t", messages=[])
    with pytest.raises(ValidationError):
        state.steps = "many"  # type: ignore[assignment]
    state.steps = 3
    assert state.steps == 3 and "steps" in state.model_fields_set


# -- teammates, sync tools --------------------------------------------------------------------


@pytest.mark.parametrize("per_call", [None, 5.0])
async def test_teammates_stop_at_the_teams_shared_deadline(per_call: float | None) -> None:
    entered = anyio.Event()
    budget = TeamBudget(deadline=0.1)
    limits = Limits(model_timeout=per_call, max_model_time=per_call)
    async with MemoryMailboxes() as mail:
        members = [Teammate(name, _hanging(entered), limits=limits) for name in ("a", "b")]
        async with Team(mail, members, budget=budget) as team:
            results: dict[str, Any] = {}

            async def ask(name: str) -> None:
                results[name] = await team.ask(name, "hang", timeout=10)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for name in ("a", "b"):
                        tg.start_soon(ask, name)
    for result in results.values():
        assert result.stop_reason == "limit" and "team_deadline" in result.detail
    _no_cancellation_left()


async def test_a_plain_sync_tool_run_inline_sees_its_call_and_reports_its_errors() -> None:
    seen: list[str | None] = []

    def look(n: int) -> str:
        """Look."""
        seen.append(current_call_id())
        if n < 0:
            raise ValueError("negative")
        return f"saw {n}"

    agent = Agent(
        "a",
        ScriptedModel([call("look", n=1), call("look", n=-1), call("look", m=2), "done"]),
        tools=[look],
        call_id_prefix="run7",
    )
    report = await agent.run("x")
    assert report.answer == "done" and seen == ["run7:1.0", "run7:2.0"]
    assert agent.state is not None
    results = [m for m in agent.state.messages if m.role == "tool"]
    assert results[0].content == "saw 1"
    assert "negative" in (results[1].content or "")
    assert "n" in (results[2].content or "")  # the arguments refused, the tool not called
    for message in results:  # each made from valid parts: what validation makes
        assert message == ChatMessage.model_validate(message.model_dump())
    direct = await Toolbox([look]).run(ToolCall(id="d1", name="look", arguments='{"n": 4}'))
    assert direct.ok and direct.content == "saw 4" and seen[-1] == "d1"
    assert current_call_id() is None


# -- journals ----------------------------------------------------------------------------------

#: The journal of a run that died at its second model call, written before the step's short ways
#: (a model call's deadline on the run's timer, messages assembled, the state's setter).
_OLD_JOURNAL: list[dict[str, Any]] = [
    {
        "t": "start",
        "ts": 1796107209.6545815,
        "state": {
            "agent": "a",
            "task": "x",
            "messages": [
                {
                    "role": "system",
                    "content": "Be brief.",
                    "tool_calls": [],
                    "tool_call_id": None,
                    "name": None,
                    "reasoning": [],
                },
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [],
                    "tool_call_id": None,
                    "name": None,
                    "reasoning": [],
                },
            ],
            "pinned": 2,
            "task_id": "t1",
            "task_index": 1,
            "tasks": 1,
            "idle": 0.0,
            "model_time": 0.0,
            "attempts": 0,
            "rate_limited": 0,
            "usage_estimated": False,
            "truncated": "",
            "handled": [],
            "open_step": None,
            "steps": 0,
            "tool_calls": 0,
            "tool_errors": 0,
            "consecutive_errors": 0,
            "stale_steps": 0,
            "nudges": 0,
            "output_errors": 0,
            "usage": {"requests": 0, "input_tokens": 0, "output_tokens": 0},
            "cost": 0.0,
            "cost_known": True,
            "elapsed": 0.0,
            "context_tokens": 10,
            "compactions": 0,
            "call_counts": {},
            "seen_results": [],
            "answer": None,
            "stop": None,
        },
    },
    {
        "t": "call",
        "ts": 1796107209.6556826,
        "inject": [],
        "handled": [],
        "reply": {
            "role": "assistant",
            "tool_calls": [{"id": "call_0", "name": "look", "arguments": '{"n": 1}'}],
        },
        "finish": None,
        "usage": {"requests": 1, "input_tokens": 7, "output_tokens": 3},
        "scalars": {
            "task_index": 1,
            "idle": 0.0,
            "model_time": 9.231900185113773e-05,
            "attempts": 1,
            "rate_limited": 0,
            "usage_estimated": False,
            "truncated": "",
            "steps": 1,
            "tool_calls": 0,
            "tool_errors": 0,
            "consecutive_errors": 0,
            "stale_steps": 0,
            "nudges": 0,
            "output_errors": 0,
            "cost": 0.0,
            "cost_known": True,
            "elapsed": 0.0,
            "context_tokens": 10,
            "compactions": 0,
            "answer": None,
        },
    },
    {
        "t": "result",
        "ts": 1796107209.6558154,
        "id": "call_0",
        "message": {
            "role": "tool",
            "content": "saw 1",
            "tool_calls": [],
            "tool_call_id": "call_0",
            "name": "look",
            "reasoning": [],
        },
    },
    {
        "t": "step",
        "ts": 1796107209.6558645,
        "append": [],
        "calls": ['look({"n": 1})'],
        "digests": ["a27730694bcc6987"],
        "handled": [],
        "usage": {"requests": 1, "input_tokens": 7, "output_tokens": 3},
        "scalars": {
            "task_index": 1,
            "idle": 0.0,
            "model_time": 9.231900185113773e-05,
            "attempts": 1,
            "rate_limited": 0,
            "usage_estimated": False,
            "truncated": "",
            "steps": 1,
            "tool_calls": 1,
            "tool_errors": 0,
            "consecutive_errors": 0,
            "stale_steps": 0,
            "nudges": 0,
            "output_errors": 0,
            "cost": 0.0,
            "cost_known": True,
            "elapsed": 0.0011140940041514114,
            "context_tokens": 22,
            "compactions": 0,
            "answer": None,
        },
    },
]


def _interrupted_model() -> FunctionModel:
    n = 0

    def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal n
        n += 1
        if n == 1:  # the id the old run's model gave its call
            looking = ToolCall(id="call_0", name="look", arguments='{"n": 1}')
            usage = Usage(requests=1, input_tokens=7, output_tokens=3)
            return ModelReply(tool_calls=(looking,), usage=usage)
        raise KeyboardInterrupt  # the process dies

    return FunctionModel(model)


def _timeless(record: dict[str, Any]) -> dict[str, Any]:
    record = json.loads(json.dumps(record))  # a copy
    record.pop("ts")
    for part in (record.get("state"), record.get("scalars")):
        if part is not None:
            part.pop("model_time"), part.pop("elapsed")
    return dict(record)


async def test_a_journal_is_written_as_before_and_an_old_one_resumes(tmp_path: Path) -> None:
    def look(n: int) -> str:
        """Look."""
        return f"saw {n}"

    agent = Agent(
        "a",
        _interrupted_model(),
        tools=[look],
        limits=Limits(model_timeout=30),
        directory=tmp_path / "new",
        instructions="Be brief.",
    )
    with pytest.raises(KeyboardInterrupt):
        await agent.run("x", task_id="t1")
    written = (tmp_path / "new" / "a.state.jsonl").read_text().splitlines()
    assert [_timeless(json.loads(line)) for line in written] == [
        _timeless(record) for record in _OLD_JOURNAL
    ]
    # an old journal resumes: the step's tool result is not run again
    old = tmp_path / "old"
    old.mkdir()
    lines = [json.dumps(record, separators=(",", ":")) for record in _OLD_JOURNAL]
    (old / "a.state.jsonl").write_text("\n".join(lines) + "\n")

    def again(n: int) -> str:
        """Look."""
        raise AssertionError("run again")

    resumed = Agent(
        "a",
        ScriptedModel(["done"]),
        tools=[tool(name="look")(again)],
        limits=Limits(model_timeout=30),
        directory=old,
        instructions="Be brief.",
    )
    report = await resumed.resume()
    assert report.answer == "done" and report.steps == 2
    assert report.usage.input_tokens >= 7
    state = resumed.state
    assert state is not None
    assert [m.content for m in state.messages if m.role == "tool"] == ["saw 1"]
    assert AgentState.model_validate_json(state.model_dump_json()) == state
