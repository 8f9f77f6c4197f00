"""A hostile pass over the agent step's short ways (issue 15): inline sync tools, results
encoded by the JSON encoder's C core, no timeout for a model call without a deadline, usage
counted without a coroutine, the loop's index of recent results, and one event-loop pass per
step when the model call suspends. Each is reached every way a user reaches it: a plain run,
a resume from the journal, a kept conversation, a listener, telemetry, a typed answer, a
deadline, a shared budget, a cancellation, a tool that misbehaves."""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from teamrt import telemetry
from teamrt.agents import Agent, Limits, ToolCallStarted, tool
from teamrt.agents.loop import _ResultIndex
from teamrt.agents.state import PROGRESS_MEMORY, AgentState
from teamrt.agents.tools import Toolbox, current_call_id
from teamrt.errors import ToolCrashed
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    ScriptedModel,
    TextDelta,
    ToolSpec,
    Usage,
    call,
    calls,
)
from teamrt.models.base import ToolCall
from tests.test_agent_step import Ticker

# -- helpers --


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

# -- results: byte for byte what json.dumps writes, and never a crash --

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


_UNWRITABLE: list[tuple[object, str]] = [
    ({(1, 2): "tuple key"}, "TypeError: the result could not be encoded as JSON: keys must be"),
    (_deep(100_000), "RecursionError: the result could not be encoded as JSON: maximum"),
    ({"when": _FailingStr()}, "RuntimeError: the result could not be encoded as JSON: no text"),
    (10**5000, "ValueError: the result could not be encoded as JSON: Exceeds the limit"),
]


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


# -- inline tools: the call's id, gates, exceptions of every kind --


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


_RAISED: list[BaseException] = [
    asyncio.CancelledError("my own"),
    SystemExit(3),
    KeyboardInterrupt(),
    GeneratorExit(),
]


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


# -- one event-loop pass per step: where the loop's checkpoint may and may not be skipped --

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


# -- resume, restore and kept conversations --


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


# -- model calls without a deadline, usage without a shared budget --


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
