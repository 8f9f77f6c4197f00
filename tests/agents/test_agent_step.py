"""The agent step's short ways: a run's model calls share one deadline timer, a lone tool call
runs without the limiter but still at a checkpoint, and a call's arguments are parsed once for
its signature. Each keeps what the long way did."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import math
import pickle
import random
import time
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from teamrt import MemoryMailboxes, telemetry
from teamrt.agents import Agent, Limits, RunReport, Toolbox, ToolCallStarted, current_call_id, tool
from teamrt.agents.loop import _ResultIndex, _signature_of, signature
from teamrt.agents.state import PROGRESS_MEMORY, AgentState, OpenStep
from teamrt.errors import ToolCrashed
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    Model,
    ModelReply,
    OpenAIModel,
    ScriptedModel,
    TextDelta,
    ToolSpec,
    Usage,
    call,
    calls,
)
from teamrt.models.base import ToolCall
from teamrt.team import Team, TeamBudget, Teammate


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


# --- the step's short ways, each reached every way a user reaches it: plain, resumed, kept,
# listened to, traced, typed, with a deadline, a budget, a cancellation ---


def _call(name: str, arguments: str = "{}", id: str = "c1") -> ToolCall:
    return ToolCall(id=id, name=name, arguments=arguments)


def _giver(value: object, kind: str) -> Toolbox:
    """A toolbox whose tool `give` returns `value`: inline (a plain sync function), async, or
    in a worker thread."""

    def give_sync() -> object:
        """Give the value."""
        return value

    async def give_async() -> object:
        """Give the value."""
        return value

    fn = give_async if kind == "async" else give_sync
    return Toolbox([tool(name="give", thread=kind == "thread")(fn)])


class _FailingStr:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class _Colour(enum.Enum):
    RED = 1


class _Key(enum.StrEnum):
    A = "a"


class _Point(BaseModel):
    x: int
    y: float


def _deep(levels: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(levels):
        nested: list[Any] = []
        inner.append(nested)
        inner = nested
    return top


_KINDS = ["inline", "async", "thread"]


_LIKE_DUMPS: list[object] = [
    float("-inf"),
    [float("nan"), -0.0, 1e300, 5e-324],
    {1: "a", "1": "b", None: "c", "null": "d"},  # keys that meet as text: written twice
    {_Key.A: 1, 2.5: [(), {}]},
    {"set": {3}, "colour": _Colour.RED, "point": _Point(x=1, y=2.0)},  # default=str
    {"text": "\x00\x1f\u2028\ud800 ü 😀 \"'\\/"},
    list(range(3000)),  # longer than the cap: cut after encoding
    _deep(200),
    [[1, 2]] * 3,  # the same list twice is no cycle
]


def _random_value(rng: random.Random, depth: int = 0) -> object:
    """A value a tool might return: JSON's kinds and others json.dumps writes with str()."""
    scalars: list[object] = [
        rng.randrange(-(10**30), 10**30),
        rng.choice([0.1, -0.0, 1e308, float("nan"), float("inf"), float("-inf"), 2.5e-300]),
        rng.choice([True, False, None]),
        "".join(chr(rng.choice([0, 9, 34, 92, 127, 233, 0x2028, 0xD800, 0x1F600])) for _ in "abc"),
        _Colour.RED,
        _Key.A,
        frozenset({1}),
        b"bytes",
    ]
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(scalars)
    kind = rng.randrange(3)
    items = [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 0:
        return items
    if kind == 1:
        return tuple(items)
    keys: list[object] = ["k", 1, 2.5, True, None, _Key.A, float("nan"), -3, "é"]
    return {rng.choice(keys): item for item in items}


_UNWRITABLE: list[tuple[object, str]] = [
    ({(1, 2): "tuple key"}, "TypeError: the result could not be encoded as JSON: keys must be"),
    (_deep(100_000), "RecursionError: the result could not be encoded as JSON: maximum"),
    ({"when": _FailingStr()}, "RuntimeError: the result could not be encoded as JSON: no text"),
    (10**5000, "ValueError: the result could not be encoded as JSON: Exceeds the limit"),
]


_RAISED: list[BaseException] = [
    asyncio.CancelledError("my own"),
    SystemExit(3),
    KeyboardInterrupt(),
    GeneratorExit(),
]


_PATHS = [
    "plain",
    "listener",
    "telemetry",
    "typed",
    "structured",
    "budget",
    "deadline",
    "no model timeout",
]


class _Budget:
    """A shared budget that records its charges, and waits in each (as a store does)."""

    def __init__(self) -> None:
        self.charged: list[tuple[Usage, float | None]] = []

    async def check(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def charge(self, usage: Usage, cost: float | None) -> None:
        await anyio.lowlevel.checkpoint()
        self.charged.append((usage, cost))


class _Total(BaseModel):
    total: int


def _agent(path: str, script: list[ModelReply | str], tools: list[Any], **options: Any) -> Agent:
    """An agent whose step goes the way `path` says; its script ends with an answer of the
    kind that path takes."""
    events: list[Any] = []

    async def listen(event: Any) -> None:
        events.append(event)

    kwargs: dict[str, Any] = {"limits": Limits(model_timeout=None, max_repeats=50)}
    end: ModelReply | str = "done"
    if path == "listener":
        kwargs["on_event"] = listen
    elif path == "typed":
        kwargs["output_type"] = _Total
        end = call("final_answer", total=1)
    elif path == "structured":
        kwargs["output_type"] = _Total
        end = '{"total": 1}'
    elif path == "budget":
        kwargs["budget"] = _Budget()
    elif path == "deadline":
        kwargs["limits"] = Limits(deadline=600, model_timeout=60, max_repeats=50)
    elif path == "plain":
        kwargs["limits"] = Limits(max_repeats=50)  # the default model_timeout
    kwargs.update(options)
    model = ScriptedModel([*script, end], structured_output=path == "structured")
    return Agent("a", model, tools=tools, **kwargs)


@pytest.fixture(params=_PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param != "telemetry":
        yield request.param
        return
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    telemetry.enable(provider)
    try:
        yield request.param
    finally:
        telemetry.disable()


@pytest.mark.parametrize("value", _LIKE_DUMPS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("kind", _KINDS)
async def test_hostile_values_read_as_json_dumps_writes_them(value: object, kind: str) -> None:
    result = await _giver(value, kind).run(_call("give"))
    expected = json.dumps(value, default=str, ensure_ascii=False)
    if len(expected) > 8000:
        expected = (
            f"{expected[:8000]}... [cut {len(expected) - 8000} of {len(expected)} characters]"
        )
    assert result.ok
    assert result.content == expected


def test_random_results_read_as_json_dumps_writes_them() -> None:
    rng = random.Random(15)
    box = _giver(None, "inline")
    give = box.get("give")
    assert give is not None
    for i in range(2000):
        value = _random_value(rng)
        if isinstance(value, str):  # a text result is the text (a str enum's, say)
            assert give._render(value) == value, i
            continue
        assert give._render(value) == json.dumps(value, default=str, ensure_ascii=False), i


@pytest.mark.parametrize(
    ("value", "error"), _UNWRITABLE, ids=["tuple key", "too deep", "failing str", "huge int"]
)
@pytest.mark.parametrize("kind", _KINDS)
async def test_a_result_json_cannot_write_is_the_tools_failure_as_data(
    value: object, error: str, kind: str
) -> None:
    # json.dumps raises TypeError, RecursionError, the object's own error: whatever it is, the
    # tool's result could not be written, which the model reads as the tool's failure
    box = _giver(value, kind)
    result = await box.run(_call("give"))
    assert not result.ok
    assert json.loads(result.content)["error"].startswith(error)
    fine = await _giver({"a": [1]}, kind).run(_call("give"))  # nothing left over in the encoder
    assert fine.content == '{"a": [1]}'


async def test_a_run_goes_on_after_a_result_json_cannot_write() -> None:
    model = ScriptedModel([call("give"), "done"])
    give = _giver({(1, 2): "x"}, "inline").get("give")
    assert give is not None
    agent = Agent("a", model, tools=[give])
    report = await agent.run("x")
    assert (report.ok, report.answer, report.tool_errors) == (True, "done", 1)


async def test_a_pydantic_model_that_cannot_serialise_is_the_tools_failure() -> None:
    class Holder(BaseModel):
        thing: object

    result = await _giver(Holder(thing=object()), "inline").run(_call("give"))
    assert not result.ok
    assert "could not be encoded as JSON" in json.loads(result.content)["error"]


@pytest.mark.parametrize("prefix", [None, "job"])
async def test_an_inline_tool_sees_its_call_id_and_nothing_leaks_after_it(
    prefix: str | None,
) -> None:
    seen: list[str | None] = []

    def look(n: int) -> int:
        """Look at the call id."""
        seen.append(current_call_id())
        if n == 2:
            raise RuntimeError("fails")
        return n

    script: list[ModelReply | str] = [
        calls(call("look", n=1), call("look", n=2)),
        call("look", n=3),
        "done",
    ]
    model = ScriptedModel(script)
    agent = Agent("a", model, tools=[look], call_id_prefix=prefix)
    report = await agent.run("x")
    assert report.ok
    ids = [c.id for r in script[:2] if isinstance(r, ModelReply) for c in r.tool_calls]
    expected = ids if prefix is None else ["job:1.0", "job:1.1", "job:2.0"]
    assert seen == expected
    assert current_call_id() is None


async def test_a_refusing_gate_keeps_an_inline_tool_from_running() -> None:
    ran: list[int] = []

    def act() -> str:
        """Act."""
        ran.append(1)
        return "acted"

    gated = tool(act)
    object.__setattr__(gated, "gate", lambda: "not now")
    box = Toolbox([gated])
    result = await box.run(_call("act"))
    direct = await gated.call(gated.args_model())
    assert result == direct
    assert (result.ok, ran) == (False, [])
    assert json.loads(result.content) == {"error": "PermissionError: not now"}


@pytest.mark.parametrize("raised", _RAISED, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("kind", ["inline", "async"])
async def test_a_base_exception_out_of_a_tool_is_a_crash_of_the_run(
    raised: BaseException, kind: str
) -> None:
    # nothing cancels this run: a CancelledError the tool raised itself is its own fault
    def boom_sync() -> str:
        """Boom."""
        raise raised

    async def boom_async() -> str:
        """Boom."""
        raise raised

    boom = tool(name="boom")(boom_sync if kind == "inline" else boom_async)
    agent = Agent("a", ScriptedModel([call("boom"), "done"]), tools=[boom])
    with pytest.raises(ToolCrashed, match=f"tool boom raised {type(raised).__name__}") as caught:
        await agent.run("x")
    assert caught.value.__cause__ is raised
    assert current_call_id() is None


async def test_a_pending_cancellation_lands_before_any_tool_runs(path: str) -> None:
    ran: list[str] = []

    def never() -> str:
        """Never reached."""
        ran.append("never")
        return "ran"

    agent = _agent(path, [call("never")], [never])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await agent.run("x")
    assert scope.cancelled_caught and ran == []


async def test_a_cancellation_from_a_lone_call_lands_before_the_next_lone_call(path: str) -> None:
    # the model's suspension stands for the first call's checkpoint only: a cancellation made
    # during it (here, by the tool itself) is taken before the second lone call is started
    ran: list[int] = []
    scope = anyio.CancelScope()

    @tool(sequential=True)
    def step(n: int) -> int:
        """One step of a sequence."""
        ran.append(n)
        scope.cancel()
        return n

    agent = _agent(path, [calls(call("step", n=1), call("step", n=2))], [step])
    with scope:
        await agent.run("x")
    assert scope.cancelled_caught and ran == [1]


async def test_a_cancellation_from_a_parallel_group_lands_before_the_lone_call_after_it(
    path: str,
) -> None:
    ran: list[str] = []
    scope = anyio.CancelScope()

    def side(name: str) -> str:
        """A call beside others."""
        ran.append(name)
        scope.cancel()
        return name

    @tool(sequential=True)
    def after() -> str:
        """A call after the others."""
        ran.append("after")
        return "after"

    reply = calls(call("side", name="a"), call("side", name="b"), call("after"))
    agent = _agent(path, [reply], [side, after])
    with scope:
        await agent.run("x")
    assert scope.cancelled_caught and "after" not in ran


async def test_other_tasks_run_at_every_step_whichever_way_it_goes(path: str) -> None:
    # a run of inline tools and a model that suspends lets a ticker run between any two calls
    ticker = Ticker()

    @tool(sequential=True)
    def look() -> int:
        """Look at the ticker."""
        return ticker.note()

    script: list[ModelReply | str] = [call("look"), calls(call("look"), call("look")), call("look")]
    report = await ticker.beside(_agent(path, script, [look]).run("x"))
    assert report.ok and len(ticker.seen) == 4
    assert all(b > a for a, b in itertools.pairwise(ticker.seen))


async def test_a_model_that_claims_to_suspend_but_never_does_starves_the_loop() -> None:
    # `suspends` is the model's promise (see `Model`): a model that breaks it gets no
    # checkpoint before the step's first tool call, so a run of such steps lets no other task
    # run and takes a cancellation only once it is over. Pinned here so that a change to it
    # is seen; the documented promise is what a model must keep.
    class Liar(FunctionModel):
        suspends = True

    left: Iterator[ModelReply | str] = iter([call("look"), call("look"), "done"])
    ran: list[int] = []

    def look() -> int:
        """Look."""
        ran.append(1)
        return len(ran)

    agent = Agent("a", Liar(lambda m, t: next(left)), tools=[look])
    with anyio.CancelScope() as scope:
        scope.cancel()
        report = await agent.run("x")
    assert report.ok and len(ran) == 2  # the pending cancellation never landed in the run
    assert not scope.cancelled_caught


@pytest.mark.parametrize("value", [1, "yes", None, 0.0, "True"])
async def test_only_suspends_true_skips_the_loops_checkpoint(value: object) -> None:
    # a truthy value that is not True (a mock's attribute, a string) is not the promise
    class Maybe(FunctionModel):
        suspends = value

    ran: list[int] = []

    def look() -> int:
        """Look."""
        ran.append(1)
        return 1

    left: Iterator[ModelReply | str] = iter([call("look"), "done"])
    agent = Agent("a", Maybe(lambda m, t: next(left)), tools=[look])
    with anyio.CancelScope() as scope:
        scope.cancel()
        await agent.run("x")
    assert scope.cancelled_caught and ran == []


async def test_a_resumed_step_passes_its_checkpoint_before_the_call_in_flight(
    tmp_path: Path,
) -> None:
    # a crash in the second call of a step; the resumed step made no model call, so its first
    # call still waits at the loop's checkpoint (a pending cancellation lands there)
    ids: list[str | None] = []
    crash = True

    @tool(sequential=True)
    def act(n: int) -> int:
        """Act, keyed by the call id."""
        ids.append(current_call_id())
        if n == 2 and crash:
            raise SystemExit("the process dies")
        return n

    script: list[ModelReply | str] = [calls(call("act", n=1), call("act", n=2)), "done"]
    journal = tmp_path / "a.jsonl"
    with pytest.raises(ToolCrashed):
        await Agent("a", ScriptedModel(script), tools=[act], checkpoint=journal).run("x")
    assert len(ids) == 2
    crash = False
    again = Agent("a", ScriptedModel(["done"]), tools=[act], checkpoint=journal)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await again.resume()
    assert scope.cancelled_caught and len(ids) == 2
    report = await Agent("a", ScriptedModel(["done"]), tools=[act], checkpoint=journal).resume()
    assert report.ok and report.answer == "done"
    assert ids[2] == ids[1]  # the call in flight ran again with its id; the first did not


async def test_the_result_index_follows_a_state_resumed_from_the_journal(tmp_path: Path) -> None:
    # the same agent object: results seen before the crash are known after the resume (the
    # index is made again from the journaled state), so a repeat is not progress
    crash = True

    def same() -> str:
        """Always the same."""
        return "same"

    @tool(sequential=True)
    def die() -> str:
        """Die once."""
        if crash:
            raise SystemExit("down")
        return "same"

    script: list[ModelReply | str] = [call("same"), call("die"), "done"]
    journal = tmp_path / "a.jsonl"
    agent = Agent("a", ScriptedModel(script), tools=[same, die], checkpoint=journal)
    with pytest.raises(ToolCrashed):
        await agent.run("x")
    crash = False
    assert agent.state is not None
    agent.restore(None)
    report = await agent.resume()
    assert report.ok
    assert agent.state is not None
    assert agent.state.stale_steps == 1  # "same" again: nothing new
    assert agent.state.seen_results == agent.journal.load().seen_results  # type: ignore[union-attr]


async def test_a_kept_conversation_starts_each_task_with_a_fresh_index() -> None:
    # each task's state has its own (empty) memory of results, as the list says; the index
    # must not carry the previous task's
    def same() -> str:
        """Always the same."""
        return "same"

    script: list[ModelReply | str] = [call("same"), "one", call("same"), "two"]
    agent = Agent("a", ScriptedModel(script), tools=[same], keep_context=True)
    first = await agent.run("x")
    assert agent.state is not None and agent.state.stale_steps == 0
    second = await agent.run("y")
    assert (first.answer, second.answer) == ("one", "two")
    assert agent.state.stale_steps == 0 and len(agent.state.seen_results) == 1


def test_the_result_index_after_a_trim_and_a_restore_of_a_full_memory() -> None:
    index = _ResultIndex()
    state = AgentState(agent="a", task="t", messages=[])
    for i in range(PROGRESS_MEMORY + 10):
        assert index.is_new(state, f"d{i}")
    assert "d0" not in state.seen_results and index.is_new(state, "d0")  # trimmed: new again
    assert not index.is_new(state, f"d{PROGRESS_MEMORY + 9}")
    # a restored state: a list as long as the index's set, other digests
    restored = AgentState(agent="a", task="t", messages=[])
    restored.seen_results = [f"r{i}" for i in range(PROGRESS_MEMORY)]
    assert not index.is_new(restored, "r5")
    assert index.is_new(restored, f"d{PROGRESS_MEMORY + 9}")
    # an old checkpoint's memory, longer than today's and with a repeat in it
    old = AgentState(agent="a", task="t", messages=[])
    old.seen_results = ["o1", "o1", *(f"o{i}" for i in range(2, PROGRESS_MEMORY + 5))]
    reference = old.model_copy(deep=True)
    for digest in ["o1", "new", "o3", "o1", "new2"]:
        assert index.is_new(old, digest) == reference.is_new_result(digest), digest
        assert old.seen_results == reference.seen_results


@pytest.mark.parametrize("model_timeout", [None, 5.0])
async def test_a_models_own_cancellation_stops_the_run_as_a_model_error(
    model_timeout: float | None,
) -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise asyncio.CancelledError("the model's own")

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=model_timeout))
    report = await agent.run("x")
    assert report.stop.reason == "model_error"
    assert "cancellation of its own" in report.stop.detail


async def test_a_models_own_timeout_error_without_a_deadline_is_raised_as_it_is() -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise TimeoutError("the model's own")

    agent = Agent("a", FunctionModel(model), limits=Limits(model_timeout=None))
    with pytest.raises(TimeoutError, match="the model's own"):
        await agent.run("x")


@pytest.mark.parametrize(
    ("limits", "limit"),
    [
        (Limits(model_timeout=None, max_model_time=0.2), "max_model_time"),
        (Limits(model_timeout=None, deadline=0.2), "deadline"),
    ],
    ids=["max_model_time", "deadline"],
)
async def test_a_hanging_model_without_a_model_timeout_still_meets_the_other_bounds(
    limits: Limits, limit: str
) -> None:
    async def model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        await anyio.sleep(60)
        return "late"

    with anyio.fail_after(30):
        report = await Agent("a", FunctionModel(model), limits=limits).run("x")
    assert report.stop.limit == limit


async def test_usage_and_cost_are_the_same_with_and_without_a_shared_budget() -> None:
    def look() -> str:
        """Look."""
        return "x"

    prices = {"scripted": (1.0, 2.0)}
    script: list[ModelReply | str] = [call("look"), "done"]
    alone = await Agent("a", ScriptedModel(script), tools=[look], prices=prices).run("x")
    budget = _Budget()
    shared = Agent("a", ScriptedModel(script), tools=[look], prices=prices, budget=budget)
    together = await shared.run("x")
    assert (alone.usage, alone.cost) == (together.usage, together.cost)
    assert together.cost is not None
    assert math.isclose(sum(c or 0 for _, c in budget.charged), together.cost)
    assert sum((u for u, _ in budget.charged), Usage()) == together.usage


async def test_a_cancellation_during_the_budget_charge_lands_before_the_tool_runs() -> None:
    # spent is spent: the charge is shielded and finishes; the cancellation it held back (a
    # team's shutdown, say) must land before the step's tool call is started, though the
    # model's call suspended before the charge
    ran: list[str] = []
    budget = _Budget()
    original = budget.charge
    scope = anyio.CancelScope()

    async def charge(usage: Usage, cost: float | None) -> None:
        scope.cancel()
        await original(usage, cost)

    budget.charge = charge  # type: ignore[method-assign]

    def act() -> str:
        """A side effect."""
        ran.append("act")
        return "acted"

    agent = Agent("a", ScriptedModel([call("act"), "done"]), tools=[act], budget=budget)
    with scope:
        await agent.run("x")
    assert scope.cancelled_caught and len(budget.charged) == 1
    assert ran == []


async def test_a_listener_that_cancels_on_the_replys_text_keeps_its_tool_call_from_running() -> (
    None
):
    # the text comes to listeners after the model's last suspension: a cancellation made
    # then lands before the reply's tool call is announced (as with no suspending model)
    ran: list[str] = []
    announced: list[str] = []
    scope = anyio.CancelScope()

    async def listen(event: Any) -> None:
        if isinstance(event, TextDelta) and "delete" in event.text:
            scope.cancel()
        elif isinstance(event, ToolCallStarted):
            announced.append(event.call.name)

    def delete() -> str:
        """Delete everything."""
        ran.append("delete")
        return "deleted"

    thinking = call("delete").model_copy(update={"text": "I will delete everything"})
    agent = Agent("a", ScriptedModel([thinking, "done"]), tools=[delete], on_event=listen)
    with scope:
        await agent.run("x")
    assert scope.cancelled_caught and (ran, announced) == ([], [])


async def test_leaving_a_stream_at_the_replys_text_keeps_its_tool_call_from_running() -> None:
    ran: list[str] = []

    def delete() -> str:
        """Delete everything."""
        ran.append("delete")
        return "deleted"

    thinking = call("delete").model_copy(update={"text": "I will delete everything"})
    agent = Agent("a", ScriptedModel([thinking, "done"]), tools=[delete])
    async with agent.stream("x") as events:
        async for event in events:
            if isinstance(event, TextDelta) and "delete" in event.text:
                break
    assert ran == []


async def test_a_listener_sees_each_inline_call_start_and_finish_in_order() -> None:
    events: list[str] = []

    async def listen(event: Any) -> None:
        name = type(event).__name__
        if name.startswith("ToolCall"):
            events.append(f"{name}:{getattr(event, 'ok', '')}")

    def look(n: int) -> dict[tuple[int, int], int] | int:
        """Look."""
        return {(n, n): n} if n == 2 else n

    script: list[ModelReply | str] = [calls(call("look", n=1), call("look", n=2)), "done"]
    agent = Agent("a", ScriptedModel(script), tools=[look], on_event=listen)
    report = await agent.run("x")
    assert report.ok
    assert events == [
        "ToolCallStarted:",
        "ToolCallStarted:",
        "ToolCallFinished:True",
        "ToolCallFinished:False",
    ] or events == [
        "ToolCallStarted:",
        "ToolCallFinished:True",
        "ToolCallStarted:",
        "ToolCallFinished:False",
    ]


async def test_a_stream_of_a_run_whose_tool_crashes_raises_the_crash(exporter: Any) -> None:
    def boom() -> str:
        """Boom."""
        raise SystemExit("out")

    agent = Agent("a", ScriptedModel([call("boom"), "done"]), tools=[boom])

    async def consume() -> None:
        async with agent.stream("x") as events:
            async for _ in events:
                pass

    with pytest.raises(ToolCrashed):
        await consume()


@pytest.mark.parametrize("suspends", [True, False], ids=["model suspends", "model never waits"])
async def test_a_tool_call_is_not_started_after_the_runs_deadline_passed(suspends: bool) -> None:
    # the deadline passes as the model answers (the agent's clock says so): the reply's call
    # is not started, whether or not the model's call suspended
    now = 0.0
    ran: list[str] = []

    class Slow(FunctionModel):
        pass

    async def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        nonlocal now
        await anyio.lowlevel.checkpoint()
        now += 10.0  # the call took 10 s by the agent's clock
        return call("act")

    def act() -> str:
        """A side effect."""
        ran.append("act")
        return "acted"

    model = Slow(answer)
    model.suspends = suspends  # type: ignore[attr-defined]
    limits = Limits(deadline=5.0, model_timeout=None)
    agent = Agent("a", model, tools=[act], limits=limits, clock=lambda: now)
    report = await agent.run("x")
    assert report.stop.limit == "deadline"
    assert ran == []


@pytest.mark.parametrize("cut", range(12))
@pytest.mark.parametrize("suspends", [True, False], ids=["model suspends", "model never waits"])
async def test_a_run_cancelled_at_any_pass_resumes_and_runs_each_call_once(
    suspends: bool, cut: int, tmp_path: Path
) -> None:
    # the run is cancelled after `cut` event-loop passes (or ends first), then resumed from its
    # journal with the same model: every call runs exactly once, as an inline call cannot be
    # cut, and the answer is the script's
    script: list[ModelReply | str] = [
        calls(call("act", n=1), call("act", n=2)),
        calls(call("side", n=3), call("side", n=4)),
        call("act", n=5),
        "done",
    ]
    ran: list[int] = []

    @tool(sequential=True)
    def act(n: int) -> int:
        """A side effect, in order."""
        ran.append(n)
        return n

    def side(n: int) -> int:
        """A side effect, beside another."""
        ran.append(n)
        return n

    left = iter(script)
    model = ScriptedModel(script) if suspends else FunctionModel(lambda m, t: next(left))
    journal = tmp_path / "a.jsonl"
    scope = anyio.CancelScope()

    async def cancel_after(passes: int) -> None:
        for _ in range(passes):
            await anyio.lowlevel.checkpoint()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_after, cut)
        with scope:
            await Agent("a", model, tools=[act, side], checkpoint=journal).run("x")
    report = await Agent("a", model, tools=[act, side], checkpoint=journal).resume()
    assert report.answer == "done"
    assert sorted(ran) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("model_timeout", [None, 5.0])
async def test_a_model_that_returns_no_reply_is_not_taken_for_a_deadline(
    model_timeout: float | None,
) -> None:
    # a broken model (complete() returns None) is its fault, said as such: not a deadline or a
    # model_timeout that did not pass
    class Broken:
        name = "broken"

        async def complete(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> Any:
            await anyio.lowlevel.checkpoint()
            return None

    agent = Agent("a", Broken(), limits=Limits(model_timeout=model_timeout))
    report = await agent.run("x")
    assert report.stop.limit is None
    assert report.stop.reason == "model_error"
    assert "broken: the model call returned None, not a ModelReply" in report.stop.detail


async def test_a_kept_conversation_restarted_mid_task_resumes_its_step(tmp_path: Path) -> None:
    # a teammate's way: a kept conversation, its second task cut by a crash in its second
    # call, taken up by a new agent object (a restart) from the journal: the call in flight
    # runs again with its id, the first does not, and the conversation keeps both tasks
    keys: list[str | None] = []
    crash = True

    @tool(sequential=True)
    def act(n: int) -> int:
        """A side effect, keyed by the call id."""
        keys.append(current_call_id())
        if n == 2 and crash:
            raise SystemExit("down")
        return n

    journal = tmp_path / "mate.jsonl"
    script: list[ModelReply | str] = [
        "first done",
        calls(call("act", n=1), call("act", n=2)),
        "second done",
    ]
    model = ScriptedModel(script)
    agent = Agent("mate", model, tools=[act], checkpoint=journal, keep_context=True)
    assert (await agent.run("one", task_id="t1")).answer == "first done"
    with pytest.raises(ToolCrashed):
        await agent.run("two", task_id="t2")
    crash = False
    again = Agent("mate", model, tools=[act], checkpoint=journal, keep_context=True)
    again.restore()
    report = await again.run("two", task_id="t2", resume=True)
    assert report.answer == "second done"
    assert keys[2] == keys[1] and len(keys) == 3
    assert again.state is not None
    texts = [m.content for m in again.state.messages if m.role == "user"]
    assert texts == ["one", "two"]


# --- the model call's deadline, models and state built without validation, plain sync tools ---


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
