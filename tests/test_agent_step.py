"""The agent step's short ways: a run's model calls share one deadline timer, a lone tool call
runs without the limiter but still at a checkpoint, and a call's arguments are parsed once for
its signature. Each keeps what the long way did."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import pickle
import random
import time
from collections.abc import Awaitable, Sequence

import anyio
import anyio.lowlevel
import openai
import pytest
from pydantic import BaseModel, ValidationError

from teamrt.agents import Agent, Limits, RunReport, tool
from teamrt.agents.loop import _ResultIndex, _signature_of, signature
from teamrt.agents.state import PROGRESS_MEMORY, AgentState, OpenStep
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    Model,
    ModelReply,
    OpenAIModel,
    ScriptedModel,
    ToolSpec,
    call,
    calls,
)
from teamrt.models.base import ToolCall, Usage


async def test_a_model_timeout_fires_on_a_later_call_after_the_timer_moved() -> None:
    # call 1 is quick and arms the shared timer for its deadline; a slow tool and a slow (but
    # in time) call 2 run past that moment, so the timer fires during call 2 and must move to
    # call 2's own deadline, not cut it; call 3 hangs and must be stopped at its deadline.
    calls = 0

    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal calls
        calls += 1
        if calls == 2:
            await anyio.sleep(0.3)
        elif calls == 3:
            await anyio.sleep(30)
        return call("wait", n=calls)

    async def wait(n: int) -> int:
        """Wait a little."""
        await anyio.sleep(0.3)
        return n

    agent = Agent("a", FunctionModel(model), tools=[wait], limits=Limits(model_timeout=0.5))
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.stop.limit == "model_timeout"
    assert (calls, report.steps) == (3, 2)  # call 2 finished; call 3 was the one cut


async def test_a_models_own_timeout_error_is_not_taken_for_the_deadline() -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise TimeoutError("the model's own")

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=5))
    with pytest.raises(TimeoutError, match="the model's own"):
        await agent.run("x")


def test_an_agent_runs_again_on_another_event_loop() -> None:
    # the deadline timer of the first run (and loop) is gone when the second starts
    agent = Agent("a", ScriptedModel(["one", "two"]), limits=Limits(model_timeout=60))
    first = asyncio.run(agent.run("x"))
    second = asyncio.run(agent.run("y"))
    assert (first.answer, second.answer) == ("one", "two")


def _never_waits(replies: list[ModelReply | str]) -> FunctionModel:
    """A model that answers at once: its calls never yield to the event loop."""
    left = iter(replies)
    return FunctionModel(lambda messages, tools: next(left))


class Ticker:
    """A task that counts event-loop passes, run beside an agent's run; `note()` (called by a
    tool) keeps the count it sees."""

    def __init__(self) -> None:
        self.ticks = 0
        self.seen: list[int] = []

    def note(self) -> int:
        self.seen.append(self.ticks)
        return len(self.seen)

    async def beside(self, run: Awaitable[RunReport]) -> RunReport:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._tick)
            await anyio.lowlevel.checkpoint()
            report = await run
            tg.cancel_scope.cancel()
        return report

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await anyio.lowlevel.checkpoint()


async def _ticks_at_each_call(model: Model, calls: int) -> list[int]:
    """Run `model` (which calls the tool `look` `calls` times, one call a step) beside a
    ticker; the count each call saw."""
    ticker = Ticker()

    def look() -> int:
        """Look at the ticker."""
        return ticker.note()

    limits = Limits(max_repeats=calls + 1)
    report = await ticker.beside(Agent("a", model, tools=[look], limits=limits).run("x"))
    assert report.ok and len(ticker.seen) == calls
    return ticker.seen


async def test_other_tasks_run_at_each_tool_call_of_a_run_that_never_waits() -> None:
    # neither the model nor the tool yields: the loop's own checkpoint lets the ticker run
    seen = await _ticks_at_each_call(_never_waits([*(call("look") for _ in range(3)), "done"]), 3)
    assert [b - a for a, b in itertools.pairwise(seen)] == [1, 1]


async def test_a_step_whose_model_call_suspends_makes_one_event_loop_pass_not_two() -> None:
    # the scripted model yields once per call, as a model over the network does: the loop adds
    # no checkpoint of its own before the step's tool call, so each step is one pass
    model = ScriptedModel([*(call("look") for _ in range(3)), "done"])
    assert model.suspends
    seen = await _ticks_at_each_call(model, 3)
    assert [b - a for a, b in itertools.pairwise(seen)] == [1, 1]


async def test_the_second_lone_call_of_a_step_still_passes_a_checkpoint() -> None:
    # two calls to a sequential tool in one reply run one after the other, each alone: the
    # model's suspension stands for the first call's checkpoint only
    ticker = Ticker()

    @tool(sequential=True)
    def look(n: int) -> int:
        """Look at the ticker."""
        return ticker.note()

    model = ScriptedModel([calls(call("look", n=1), call("look", n=2)), "done"])
    report = await ticker.beside(Agent("a", model, tools=[look]).run("x"))
    assert report.ok and ticker.seen[1] == ticker.seen[0] + 1


def test_an_openai_model_suspends_only_with_the_client_it_makes() -> None:
    own = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    given = OpenAIModel(
        "m", client=openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
    )
    assert (own.suspends, given.suspends) == (True, False)


@pytest.mark.parametrize("suspends", [True, False], ids=["model suspends", "model never waits"])
async def test_a_pending_cancellation_lands_before_the_first_tool_call(suspends: bool) -> None:
    ran: list[str] = []

    def never() -> str:
        """Never reached."""
        ran.append("never")
        return "ran"

    script: list[ModelReply | str] = [call("never"), "done"]
    model = ScriptedModel(script) if suspends else _never_waits(script)
    with anyio.CancelScope() as scope:
        scope.cancel()  # pending before the run starts: the first checkpoint takes it
        await Agent("a", model, tools=[never]).run("x")
    assert scope.cancelled_caught and ran == []


@pytest.mark.parametrize(
    "arguments",
    [
        "{}",
        '{"i": 5}',
        '{"b": 1, "a": [1.5, {"z": null, "y": true}], "e": "\\u00e9\\u2028"}',
        '{"x": 1e300, "n": -0.0, "big": 123456789012345678901234567890, "s": "\\"q\\""}',
        '{ "spaced" :  [ 1 , 2 ] }',
    ],
)
def test_a_signature_from_parsed_arguments_is_the_same(arguments: str) -> None:
    tool_call = ToolCall(id="c", name="t", arguments=arguments)
    # what checkpoints hold: json.dumps with sorted keys (the encoder made once must match it)
    canonical = f"t({json.dumps(json.loads(arguments), sort_keys=True)})"
    assert _signature_of(tool_call, json.loads(arguments)) == canonical
    assert signature(tool_call) == canonical


def test_the_loops_result_index_agrees_with_the_states_list() -> None:
    # digests come back after falling out of the bounded memory, and the index follows the
    # state it is asked about: another state, or the same state with its list replaced
    rng = random.Random(7)
    index = _ResultIndex()
    by_index = AgentState(agent="a", task="t", messages=[])
    by_list = AgentState(agent="a", task="t", messages=[])
    for step in range(3000):
        digest = f"d{rng.randrange(PROGRESS_MEMORY * 2)}"
        if step == 1000:  # a restored state: a copy of the list, in a new object
            by_index = by_index.model_copy(deep=True)
        if step == 2000:  # as long as before, other digests
            by_list.seen_results = [f"x{i}" for i in range(PROGRESS_MEMORY)]
            by_index.seen_results = list(by_list.seen_results)
        assert index.is_new(by_index, digest) == by_list.is_new_result(digest), step
        assert by_index.seen_results == by_list.seen_results
    assert len(by_list.seen_results) == PROGRESS_MEMORY


# -- messages made without validating them again -------------------------------------------


def _same(made: BaseModel, validated: BaseModel) -> None:
    assert type(made) is type(validated)
    assert made == validated and made.model_dump() == validated.model_dump()
    assert made.model_fields_set == validated.model_fields_set
    assert made.model_dump_json() == validated.model_dump_json()
    assert pickle.loads(pickle.dumps(made)) == validated
    assert made.model_copy(deep=True) == validated


def test_messages_made_from_valid_parts_are_what_validation_makes() -> None:
    tool_call = ToolCall(id="c1", name="look", arguments='{"n": 1}')
    _same(
        ChatMessage.tool_result(tool_call, "ü result"),
        ChatMessage(role="tool", content="ü result", tool_call_id="c1", name="look"),
    )
    assert hash(ChatMessage.tool_result(tool_call, "x")) == hash(
        ChatMessage(role="tool", content="x", tool_call_id="c1", name="look")
    )
    with pytest.raises(ValidationError):  # frozen, as a validated one is
        ChatMessage.tool_result(tool_call, "x").content = "y"  # type: ignore[misc]
    for reply in (
        ModelReply(text="hi"),
        ModelReply(tool_calls=(tool_call,), reasoning=({"id": "r1"},)),
        ModelReply(),
    ):
        _same(
            reply.as_message(),
            ChatMessage(
                role="assistant",
                content=reply.text,
                tool_calls=reply.tool_calls,
                reasoning=reply.reasoning,
            ),
        )
    message = ModelReply(text="t").as_message()
    _same(OpenStep.of(message, "stop"), OpenStep(reply=message, finish_reason="stop"))
    _same(OpenStep.of(message, None), OpenStep(reply=message, finish_reason=None))
    step = OpenStep.of(message, None)
    step.results["c1"] = ChatMessage.tool_result(tool_call, "x")  # its own dict
    assert OpenStep.of(message, None).results == {}
    _same(
        Usage(requests=1, input_tokens=2, output_tokens=3) + Usage(input_tokens=5),
        Usage(requests=1, input_tokens=7, output_tokens=3),
    )


def test_parts_that_are_not_valid_are_still_refused() -> None:
    tool_call = ToolCall(id="c1", name="look")
    with pytest.raises(ValidationError):
        ChatMessage.tool_result(tool_call, 5)  # type: ignore[arg-type]
    odd = ModelReply.model_construct(text=7, tool_calls=(), reasoning=())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        odd.as_message()


def test_a_states_fields_set_by_the_loop_are_saved_and_compared() -> None:
    state = AgentState(agent="a", task="t", messages=[])
    state.steps += 2
    state.open_step = OpenStep.of(ModelReply(text="t").as_message(), None)
    again = AgentState.model_validate_json(state.model_dump_json())
    assert again == state and again.steps == 2 and again.open_step == state.open_step


# -- the model call's deadline, made and taken back by the loop -----------------------------


@pytest.mark.parametrize("outside_first", [False, True], ids=["deadline first", "outside first"])
async def test_a_timed_model_call_cancelled_from_outside_too(outside_first: bool) -> None:
    # the deadline passes first: the run stops at it, and the outside cancellation finds it
    # over; the outside cancellation first (the deadline due at the same pass of the loop):
    # the run is cancelled, not stopped at the deadline. Either way nothing stays pending.
    entered = anyio.Event()

    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        entered.set()
        await anyio.sleep(30)
        return "never"

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=0.02))
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "x")
            await entered.wait()
            if outside_first:
                scope.cancel()
                time.sleep(0.05)  # the loop's next pass has both: the cancellation and the deadline
            else:
                await anyio.sleep(0.2)  # the deadline passed: the run stopped at it by now
                scope.cancel()
    assert agent.state is not None
    if outside_first:
        assert agent.state.stop is None  # cancelled, not stopped at the deadline
    else:
        assert agent.state.stop is not None and agent.state.stop.limit == "model_timeout"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_model_that_swallows_the_deadlines_cancellation_keeps_its_reply() -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        with contextlib.suppress(asyncio.CancelledError):  # a model that should not, but does
            await anyio.sleep(30)
        return "late but here"

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=0.05))
    with anyio.fail_after(10):
        report = await agent.run("x")
    assert report.ok and report.answer == "late but here"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's cancel taken back
    await anyio.lowlevel.checkpoint()  # and no cancellation lands later
