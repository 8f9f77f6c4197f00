"""The agent's step machine as tables: (state, input) -> the next action, with no event loop.

`StepMachine` is pure over the agent's state, its limits and the time elapsed (a value): each
test below builds a state, hands the machine one input (the time before a model call, a model
reply, the results of its tool calls) and compares what it says to do next, and the stop it
made, with the table's row. None of them awaits anything.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from teamrt.agents import Limits, tool
from teamrt.agents.output import FINAL_TOOL, OutputType
from teamrt.agents.state import AgentState, OpenStep, Stop
from teamrt.agents.step import (
    ANSWER_AS_JSON,
    ANSWER_AS_TEXT,
    ANSWER_BY_TOOL,
    CALL_MODEL,
    CONTINUE,
    NOT_RUN_BESIDE,
    RESUME_STEP,
    STOPPED,
    StepMachine,
    StepWork,
    begin,
    digest,
    report_of,
    signature,
)
from teamrt.agents.tools import Toolbox
from teamrt.models.base import ChatMessage, ModelReply, ToolCall, Usage, message_tokens


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


@tool(waits=True)
def wait_for_messages() -> str:
    """Wait for others."""
    return "nothing"


class Point(BaseModel):
    x: int
    y: int


def make_state(**fields: Any) -> AgentState:
    return AgentState(agent="a", task="t", messages=[ChatMessage.user("t")], pinned=1, **fields)


def make_machine(
    limits: Limits | None = None, *, typed: bool = False, structured: bool = False
) -> StepMachine:
    return StepMachine(
        limits or Limits(),
        Toolbox([lookup, wait_for_messages]),
        prices={},
        output=OutputType(Point) if typed else None,
        structured=structured,
    )


def tool_call(name: str, arguments: str = "{}", n: int = 1) -> ToolCall:
    return ToolCall(id=f"c{n}", name=name, arguments=arguments)


def look(key: str, n: int = 1) -> ToolCall:
    return tool_call("lookup", json.dumps({"key": key}), n)


def opened(reply: ModelReply) -> OpenStep:
    return OpenStep.of(reply.as_message(), reply.finish_reason)


def take(
    machine: StepMachine, state: AgentState, reply: ModelReply
) -> tuple[list[ToolCall] | None, StepWork, OpenStep]:
    step = opened(reply)
    work = StepWork(dict(step.results), step.reply.tool_calls)
    return machine.take(state, step, work), work, step


# --- before a model call --------------------------------------------------------------------------

NEXT = [
    # (name, state fields, limits, elapsed, action, the limit it stopped at)
    ("a fresh run calls the model", {}, Limits(), 0.0, CALL_MODEL, None),
    ("at max_steps", {"steps": 3}, Limits(max_steps=3), 0.0, STOPPED, "max_steps"),
    ("below max_steps", {"steps": 2}, Limits(max_steps=3), 0.0, CALL_MODEL, None),
    (
        "the token budget spent",
        {"usage": Usage(input_tokens=60, output_tokens=40)},
        Limits(max_tokens=100),
        0.0,
        STOPPED,
        "max_tokens",
    ),
    ("the cost budget spent", {"cost": 0.5}, Limits(max_cost=0.5), 0.0, STOPPED, "max_cost"),
    ("past the deadline", {}, Limits(deadline=10), 10.0, STOPPED, "deadline"),
    ("before the deadline", {}, Limits(deadline=10), 9.5, CALL_MODEL, None),
    (
        "the model time spent",
        {"model_time": 5.0},
        Limits(max_model_time=5),
        0.0,
        STOPPED,
        "max_model_time",
    ),
    ("idle too long", {"idle": 7.0}, Limits(max_idle=7), 0.0, STOPPED, "max_idle"),
    (
        "stopped already",
        {"stop": Stop(reason="answer", detail="done")},
        Limits(),
        0.0,
        STOPPED,
        None,
    ),
    (
        "resumed between a reply and its results",
        {"open_step": opened(ModelReply(tool_calls=(look("k"),)))},
        Limits(max_steps=1),
        99.0,
        RESUME_STEP,
        None,
    ),
]


@pytest.mark.parametrize(
    ("fields", "limits", "elapsed", "action", "limit"),
    [row[1:] for row in NEXT],
    ids=[row[0] for row in NEXT],
)
def test_next_says_what_comes_before_a_model_call(
    fields: dict[str, Any], limits: Limits, elapsed: float, action: object, limit: str | None
) -> None:
    state = make_state(**fields)
    stopped_before = state.stop
    assert make_machine(limits).next(state, elapsed) is action
    if limit is not None:
        assert state.stop is not None and state.stop.reason == "limit"
        assert state.stop.limit == limit
    else:
        assert state.stop == stopped_before


# --- a reply --------------------------------------------------------------------------------------

TAKE = [
    # (name, state fields, limits, reply, calls to run, stop reason, the limit, nudges after)
    ("an answer", {}, None, ModelReply(text="42"), None, "answer", None, 0),
    ("one tool call", {}, None, ModelReply(tool_calls=(look("k"),)), ["c1"], None, None, 0),
    (
        "two tool calls, both admitted",
        {},
        None,
        ModelReply(tool_calls=(look("a", 1), look("b", 2))),
        ["c1", "c2"],
        None,
        None,
        0,
    ),
    (
        "a tool call resets the nudges",
        {"nudges": 1},
        None,
        ModelReply(tool_calls=(look("k"),)),
        ["c1"],
        None,
        None,
        0,
    ),
    (
        "arguments that are not JSON: a nudge",
        {},
        None,
        ModelReply(tool_calls=(tool_call("lookup", "{nope"),)),
        None,
        None,
        None,
        1,
    ),
    (
        "malformed again after a nudge",
        {"nudges": 1},
        None,
        ModelReply(tool_calls=(tool_call("lookup", "[1]"),)),
        None,
        "malformed_reply",
        None,
        1,
    ),
    ("neither text nor a call", {}, None, ModelReply(text="  "), None, None, None, 1),
    (
        "cut off: asked to continue",
        {},
        None,
        ModelReply(text="par", finish_reason="length"),
        None,
        None,
        None,
        0,
    ),
    (
        "cut off again after continuing",
        {"truncated": "par"},
        None,
        ModelReply(text="tial", finish_reason="length"),
        None,
        "truncated",
        None,
        0,
    ),
    (
        "the tool-call budget spent",
        {"tool_calls": 2},
        Limits(max_tool_calls=2),
        ModelReply(tool_calls=(look("k"),)),
        None,
        "limit",
        "max_tool_calls",
        0,
    ),
    (
        "the second call over the budget: the first still runs",
        {"tool_calls": 1},
        Limits(max_tool_calls=2),
        ModelReply(tool_calls=(look("a", 1), look("b", 2))),
        ["c1"],
        "limit",
        "max_tool_calls",
        0,
    ),
    (
        "the same call once too often",
        {"call_counts": {signature(look("k")): 3}},
        Limits(max_repeats=3),
        ModelReply(tool_calls=(look("k"),)),
        None,
        "limit",
        "max_repeats",
        0,
    ),
    (
        "a waiting tool is never a repeat",
        {"call_counts": {signature(tool_call("wait_for_messages")): 3}},
        Limits(max_repeats=3),
        ModelReply(tool_calls=(tool_call("wait_for_messages"),)),
        ["c1"],
        None,
        None,
        0,
    ),
]


@pytest.mark.parametrize(
    ("fields", "limits", "reply", "pending", "stop", "limit", "nudges"),
    [row[1:] for row in TAKE],
    ids=[row[0] for row in TAKE],
)
def test_take_says_which_calls_run_or_how_the_step_ends(
    fields: dict[str, Any],
    limits: Limits | None,
    reply: ModelReply,
    pending: list[str] | None,
    stop: str | None,
    limit: str | None,
    nudges: int,
) -> None:
    state = make_state(**fields)
    run, work, _ = take(make_machine(limits), state, reply)
    assert (None if run is None else [c.id for c in run]) == pending
    assert (state.stop.reason if state.stop else None) == stop
    assert (state.stop.limit if state.stop else None) == limit
    assert state.nudges == nudges
    # every call of the reply gets a result: run, or one the machine wrote
    ran = {c.id for c in run or ()}
    written = {m.tool_call_id for m in work.appended if m.role == "tool"}
    assert ran | written == {c.id for c in reply.tool_calls}


def test_an_answer_after_a_cut_off_reply_is_the_whole_text() -> None:
    state = make_state(truncated="The ans")
    run, _, _ = take(make_machine(), state, ModelReply(text="wer is 42"))
    assert run is None
    assert state.answer == "The answer is 42" and state.truncated == ""


def test_a_cut_off_reply_asks_to_continue() -> None:
    state = make_state()
    _, work, _ = take(make_machine(), state, ModelReply(text="par", finish_reason="length"))
    assert [m.content for m in work.appended] == [CONTINUE]
    assert state.truncated == "par"


def test_an_admitted_call_is_counted_and_its_signature_kept() -> None:
    state = make_state()
    run, work, _ = take(make_machine(), state, ModelReply(tool_calls=(look("k"),)))
    assert run is not None and state.tool_calls == 1
    assert work.calls == [signature(look("k"))]
    assert state.call_counts == {signature(look("k")): 1}


def test_a_call_with_a_result_already_is_admitted_but_not_run_again() -> None:
    state = make_state()
    reply = ModelReply(tool_calls=(look("a", 1), look("b", 2)))
    step = opened(reply)
    done = ChatMessage.tool_result(reply.tool_calls[0], '"a"')
    work = StepWork({"c1": done}, step.reply.tool_calls)
    run = make_machine().take(state, step, work)
    assert [c.id for c in run or ()] == ["c2"]
    assert [c.id for c in work.admitted] == ["c1", "c2"]


HINTS = [
    ("untyped", False, False, ANSWER_AS_TEXT),
    ("typed, by the final-answer tool", True, False, ANSWER_BY_TOOL),
    ("typed, by structured output", True, True, ANSWER_AS_JSON),
]


@pytest.mark.parametrize(
    ("typed", "structured", "hint"), [r[1:] for r in HINTS], ids=[r[0] for r in HINTS]
)
def test_a_nudge_asks_for_the_answer_the_way_the_run_takes_it(
    typed: bool, structured: bool, hint: str
) -> None:
    state = make_state()
    _, work, _ = take(make_machine(typed=typed, structured=structured), state, ModelReply())
    assert work.appended[-1].content is not None and hint in work.appended[-1].content


# --- typed answers --------------------------------------------------------------------------------

FINAL = [
    # (name, state fields, arguments, stop reason, output errors after)
    ("a valid answer", {}, '{"x": 1, "y": 2}', "answer", 0),
    ("an invalid one goes back once", {}, '{"x": "no"}', None, 1),
    ("an invalid one again stops the run", {"output_errors": 1}, '{"x": 1}', "invalid_output", 2),
]


@pytest.mark.parametrize(
    ("fields", "arguments", "stop", "errors"), [r[1:] for r in FINAL], ids=[r[0] for r in FINAL]
)
def test_a_final_answer_call_is_checked_against_the_type(
    fields: dict[str, Any], arguments: str, stop: str | None, errors: int
) -> None:
    state = make_state(**fields)
    machine = make_machine(typed=True)
    reply = ModelReply(tool_calls=(look("k", 1), tool_call(FINAL_TOOL, arguments, 2)))
    run, work, _ = take(machine, state, reply)
    assert run is None  # calls beside a final answer never run
    assert (state.stop.reason if state.stop else None) == stop
    assert state.output_errors == errors
    assert set(work.results) == {"c1", "c2"}
    assert [call_id for call_id, _ in work.fresh or ()] == ["c1", "c2"]  # for the driver to journal
    if stop == "answer":
        assert state.answer == '{"x":1,"y":2}'
        assert report_of(state, machine.output, machine.accepted).output == Point(x=1, y=2)
    else:
        assert NOT_RUN_BESIDE in (work.results["c1"].content or "")


TYPED_TEXT = [
    # (name, structured, text, stop reason, feedback starts with)
    ("valid JSON by structured output", True, '{"x": 1, "y": 2}', "answer", None),
    ("invalid JSON by structured output", True, '{"x": 1}', None, "Your answer does not match"),
    ("valid JSON instead of the tool", False, '{"x": 3, "y": 4}', "answer", None),
    ("text instead of the tool", False, "it is (1, 2)", None, "Give your final answer"),
]


@pytest.mark.parametrize(
    ("structured", "text", "stop", "feedback"),
    [r[1:] for r in TYPED_TEXT],
    ids=[r[0] for r in TYPED_TEXT],
)
def test_a_typed_runs_text_is_its_answer_only_if_it_validates(
    structured: bool, text: str, stop: str | None, feedback: str | None
) -> None:
    state = make_state()
    _, work, _ = take(make_machine(typed=True, structured=structured), state, ModelReply(text=text))
    assert (state.stop.reason if state.stop else None) == stop
    users = [m.content or "" for m in work.appended if m.role == "user"]
    if feedback is None:
        assert users == []
    else:
        assert len(users) == 1 and users[0].startswith(feedback)


# --- the results of the calls ---------------------------------------------------------------------

ACCOUNT = [
    # (name, state fields, limits, results, tool errors, stale steps, the limit stopped at)
    ("something new", {"stale_steps": 2}, None, ['"new"'], 0, 0, None),
    ("an error not seen before is news", {}, None, ['{"error": "KeyError: k"}'], 1, 0, None),
    (
        "errors in a row, up to the limit",
        {"consecutive_errors": 2},
        Limits(max_consecutive_errors=3),
        ['{"error": "boom"}'],
        1,
        0,
        "max_consecutive_errors",
    ),
    (
        "nothing new, up to the limit",
        {"stale_steps": 3, "seen_results": [digest("SEEN")]},
        Limits(max_stale_steps=4),
        ["SEEN"],
        0,
        4,
        "max_stale_steps",
    ),
]


@pytest.mark.parametrize(
    ("fields", "limits", "contents", "errors", "stale", "limit"),
    [r[1:] for r in ACCOUNT],
    ids=[r[0] for r in ACCOUNT],
)
def test_account_counts_errors_and_progress_then_checks_the_limits(
    fields: dict[str, Any],
    limits: Limits | None,
    contents: list[str],
    errors: int,
    stale: int,
    limit: str | None,
) -> None:
    state = make_state(**fields)
    machine = make_machine(limits)
    calls = tuple(look(str(i), i) for i in range(len(contents)))
    run, work, _ = take(machine, state, ModelReply(tool_calls=calls))
    assert run is not None
    for call, content in zip(calls, contents, strict=True):
        work.results[call.id] = ChatMessage.tool_result(call, content)
    machine.account(state, work)
    assert state.tool_errors == errors
    assert state.stale_steps == stale
    assert (state.stop.limit if state.stop else None) == limit


def test_a_step_that_only_waited_is_not_a_stale_one() -> None:
    state = make_state(stale_steps=3)
    machine = make_machine(Limits(max_stale_steps=4))
    call = tool_call("wait_for_messages")
    run, work, _ = take(machine, state, ModelReply(tool_calls=(call,)))
    assert run is not None
    work.results[call.id] = ChatMessage.tool_result(call, '"nothing"')
    machine.account(state, work)
    assert state.stale_steps == 3 and state.stop is None


def test_close_adds_the_reply_and_its_results_in_call_order() -> None:
    state = make_state()
    machine = make_machine()
    calls = (look("a", 1), look("b", 2))
    run, work, step = take(machine, state, ModelReply(tool_calls=calls))
    assert run is not None
    for call in reversed(calls):  # results come in any order
        work.results[call.id] = ChatMessage.tool_result(call, f'"{call.id}"')
    before, tokens = len(state.messages), state.context_tokens
    state.open_step = step
    machine.close(state, step, work)
    added = state.messages[before:]
    assert [m.role for m in added] == ["assistant", "tool", "tool"]
    assert [m.tool_call_id for m in added[1:]] == ["c1", "c2"]
    assert state.context_tokens == tokens + sum(message_tokens(m) for m in added)
    assert state.open_step is None


# --- a task's state -------------------------------------------------------------------------------

BEGIN = [
    # (name, keep_context, instructions, previous instructions, messages' roles, pinned, tasks)
    ("a first task", False, "be brief", None, ["system", "user"], 2, 1),
    ("a first task without instructions", False, "", None, ["user"], 1, 1),
    (
        "a kept conversation's next task",
        True,
        "be brief",
        "be brief",
        ["system"] + ["user"] * 2,
        1,
        2,
    ),
    (
        "new instructions for a kept one",
        True,
        "be kind",
        "be brief",
        ["system"] + ["user"] * 2,
        1,
        2,
    ),
    ("a fresh one after another task", False, "be brief", "be brief", ["system", "user"], 2, 1),
]


@pytest.mark.parametrize(
    ("keep", "instructions", "before", "roles", "pinned", "tasks"),
    [r[1:] for r in BEGIN],
    ids=[r[0] for r in BEGIN],
)
def test_begin_carries_on_or_starts_afresh(
    keep: bool,
    instructions: str,
    before: str | None,
    roles: list[str],
    pinned: int,
    tasks: int,
) -> None:
    last = None
    if before is not None:
        last = begin(
            None, agent="a", instructions=before, keep_context=keep, task="one", task_id="t1"
        )
        last.stop = Stop(reason="answer", detail="done")
    state = begin(
        last, agent="a", instructions=instructions, keep_context=keep, task="two", task_id="t2"
    )
    assert [m.role for m in state.messages] == roles
    assert state.pinned == pinned and state.tasks == tasks
    assert state.messages[state.task_index or 0].content == "two"
    if instructions:
        assert state.messages[0].content == instructions
    if last is not None:
        assert "t1" in state.handled  # a redelivery of the last task is recognised


def test_the_step_machine_has_no_await_and_no_event_loop() -> None:
    import ast
    import inspect

    from teamrt.agents import step

    tree = ast.parse(inspect.getsource(step))
    asynchronous = (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor)
    assert not [node for node in ast.walk(tree) if isinstance(node, asynchronous)]
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"asyncio", "anyio", "trio"}
