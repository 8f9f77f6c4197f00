"""Tools: schemas from type hints, validation before the call, errors as data, output caps."""

from __future__ import annotations

import json
from typing import Literal

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

from teamrt.agents import Tool, Toolbox, tool
from teamrt.errors import UsageError
from teamrt.models import ToolCall

seen: list[object] = []


class Window(BaseModel):
    start: int
    end: int


@tool
def search(query: str, limit: int = 3, mode: Literal["fast", "deep"] = "fast") -> list[str]:
    """Search the notes.

    Longer explanation that the model does not need."""
    seen.append((query, limit, mode))
    return [f"{query}-{i}" for i in range(limit)]


@tool(name="read_lines", max_output=40)
async def read(path: str, window: Window | None = None) -> str:
    """Read a file's lines."""
    await anyio.lowlevel.checkpoint()
    if path == "missing":
        raise FileNotFoundError(f"no such file: {path}")
    return "x" * 100


def _call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=arguments)


def test_schema_comes_from_type_hints() -> None:
    spec = search.spec
    assert spec.name == "search" and spec.description == "Search the notes."
    props = spec.parameters["properties"]
    assert props["query"]["type"] == "string"
    assert props["limit"]["default"] == 3
    assert props["mode"]["enum"] == ["fast", "deep"]
    assert spec.parameters["required"] == ["query"]
    assert spec.parameters["additionalProperties"] is False
    nested = read.spec.parameters
    assert read.name == "read_lines" and "Window" in json.dumps(nested)


async def test_valid_call_runs_the_function() -> None:
    box = Toolbox([search])
    result = await box.run(_call("search", '{"query": "inotify", "limit": 2}'))
    assert result.ok and json.loads(result.content) == ["inotify-0", "inotify-1"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"limit": 2}', "query: Field required"),
        ('{"query": "x", "limit": "many"}', "limit: Input should be a valid integer"),
        ('{"query": "x", "mode": "slow"}', "mode: Input should be 'fast' or 'deep'"),
        ('{"query": "x", "extra": 1}', "extra: Extra inputs are not permitted"),
        ("[1, 2]", "Input should be an object"),
    ],
)
async def test_bad_arguments_never_reach_the_tool(arguments: str, message: str) -> None:
    seen.clear()
    result = await Toolbox([search]).run(_call("search", arguments))
    assert not result.ok
    assert json.loads(result.content)["error"].startswith("ValidationError: ")
    assert message in result.content
    assert seen == []


async def test_exceptions_and_unknown_tools_are_data() -> None:
    box = Toolbox([search, read])
    failed = await box.run(_call("read_lines", '{"path": "missing"}'))
    assert json.loads(failed.content) == {"error": "FileNotFoundError: no such file: missing"}
    unknown = await box.run(_call("delete_everything", "{}"))
    assert json.loads(unknown.content) == {
        "error": "UnknownTool: no tool named 'delete_everything'; available: search, read_lines"
    }


async def test_output_is_capped() -> None:
    result = await Toolbox([read]).run(_call("read_lines", '{"path": "a"}'))
    assert result.ok
    assert result.content == "x" * 40 + "... [cut 60 of 100 characters]"


async def test_blocking_tool_in_a_thread() -> None:
    @tool(thread=True)
    def slow(n: int) -> int:
        """Blocks."""
        import time

        time.sleep(0.01)
        return n * 2

    assert (await Toolbox([slow]).run(_call("slow", '{"n": 4}'))).content == "8"


def test_bad_tool_definitions() -> None:
    def star(*args: int) -> None: ...

    with pytest.raises(UsageError, match=r"\*args"):
        tool(star)
    with pytest.raises(UsageError, match="two tools are named 'search'"):
        Toolbox([search, search])
    assert isinstance(Toolbox([lambda x: x]).get("<lambda>"), Tool)


class _Shown:
    def __str__(self) -> str:
        return "shown ü"


_RESULTS: list[object] = [
    0,
    -12345678901234567890123,
    1.5,
    float("inf"),
    float("nan"),
    None,
    True,
    [1, "two", 3.0, None],
    (1, 2),
    {"é": "ü\u2028\U0001f600", "nested": {"deep": [{"a": []}]}, "q": '"quoted"\\'},
    {1: "int key", 2.5: "float key", None: "none key", False: "bool key"},
    {"when": _Shown(), "set": frozenset()},
]


def _giver(value: object, inline: bool) -> Tool:
    """A tool `give` that returns `value`: a plain function (run inline) or a coroutine."""

    def give_sync() -> object:
        """Give the value."""
        return value

    async def give_async() -> object:
        """Give the value."""
        return value

    return tool(name="give")(give_sync if inline else give_async)


@pytest.mark.parametrize("value", _RESULTS, ids=[type(v).__name__ for v in _RESULTS])
@pytest.mark.parametrize("inline", [True, False], ids=["sync", "async"])
async def test_a_result_reads_as_json_dumps_would_write_it(value: object, inline: bool) -> None:
    box = Toolbox([_giver(value, inline)])
    result = await box.run(_call("give", "{}"))
    assert result.ok
    assert result.content == json.dumps(value, default=str, ensure_ascii=False)


@pytest.mark.parametrize("inline", [True, False], ids=["sync", "async"])
async def test_a_result_that_cannot_be_encoded_is_the_tools_failure_not_a_crash(
    inline: bool,
) -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)

    box = Toolbox([_giver(cyclic, inline)])
    result = await box.run(_call("give", "{}"))
    assert not result.ok
    assert json.loads(result.content) == {
        "error": "ValueError: the result could not be encoded as JSON: Circular reference detected"
    }
    again = await box.run(_call("give", "{}"))  # no encoder state left over from the failure
    assert again.content == result.content


def test_closures_of_one_function_share_an_arguments_model_with_their_own_defaults() -> None:
    """A team makes the same tools for each member: the arguments model is made once per
    function code and fields, and a closure with other defaults gets a model of its own."""

    def make(timeout: float, tag: str) -> Tool:
        @tool
        def wait(seconds: float = timeout) -> str:
            """Wait."""
            return f"{tag} {seconds}"

        return wait

    first, same, other = make(30.0, "a"), make(30.0, "b"), make(5.0, "c")
    assert first.args_model is same.args_model
    assert other.args_model is not first.args_model
    assert first.args_model.model_validate({}).model_dump() == {"seconds": 30.0}
    assert other.args_model.model_validate({}).model_dump() == {"seconds": 5.0}

    def unhashable(items: list[int] = [1]) -> int:  # noqa: B006 -- the point of the test
        """Count."""
        return len(items)

    assert tool(unhashable).args_model.model_validate({}).model_dump() == {"items": [1]}
