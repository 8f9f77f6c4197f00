"""A plain sync tool runs inline (`Toolbox.run_now`, no coroutine, no thread): a differential
test against the same function run the other way, in a worker thread (`thread=True`)."""

from __future__ import annotations

import dataclasses

import pytest

from teamrt.agents.tools import Tool, Toolbox, current_call_id, tool
from teamrt.models.base import ToolCall


def divide(a: int, b: int = 1) -> dict[str, float | str | None]:
    """Divide a by b."""
    return {"quotient": a / b, "call": current_call_id()}


def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() * 3


CASES = [
    ("a result", "divide", '{"a": 6, "b": 3}'),
    ("a default", "divide", '{"a": 6}'),
    ("the tool raises", "divide", '{"a": 1, "b": 0}'),
    ("arguments of the wrong type", "divide", '{"a": "six"}'),
    ("arguments that are not JSON", "divide", "{a"),
    ("a missing argument", "shout", "{}"),
    ("a plain string result", "shout", '{"text": "hey"}'),
]


def boxes(gate: str | None = None) -> tuple[Toolbox, Toolbox]:
    def gated(made: Tool) -> Tool:
        return dataclasses.replace(made, gate=lambda: gate) if gate is not None else made

    inline = Toolbox([gated(tool(divide)), gated(tool(shout))])
    threaded = Toolbox([gated(tool(thread=True)(divide)), gated(tool(thread=True)(shout))])
    return inline, threaded


@pytest.mark.parametrize(("name", "arguments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_an_inline_call_gives_what_the_threaded_call_gives(name: str, arguments: str) -> None:
    inline, threaded = boxes()
    call = ToolCall(id="call_1", name=name, arguments=arguments)
    found = inline.get(name)
    assert found is not None and found.inline
    other = threaded.get(name)
    assert other is not None and not other.inline
    assert inline.run_now(call, found) == await threaded.run(call)
    assert await inline.run(call) == await threaded.run(call)


async def test_a_refusing_gate_refuses_the_same_either_way() -> None:
    inline, threaded = boxes(gate="not now")
    call = ToolCall(id="call_1", name="divide", arguments='{"a": 1}')
    found = inline.get("divide")
    assert found is not None
    result = inline.run_now(call, found)
    assert not result.ok and "not now" in result.content
    assert result == await threaded.run(call)
