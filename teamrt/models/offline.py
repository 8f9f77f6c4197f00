"""Offline models for tests and demos: `ScriptedModel` replays a script, `FunctionModel` asks a
function. Both are part of the public API and never touch the network.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from teamrt.errors import ScriptExhausted, UsageError
from teamrt.models.base import (
    ChatMessage,
    ModelReply,
    OutputSpec,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    message_tokens,
)

_call_ids = itertools.count()


class _TokenCounter:
    """Input-token estimates for a conversation that grows by appending: only the messages
    added since the previous call are counted, so a long run costs O(1) per call."""

    def __init__(self) -> None:
        self._length = 0
        self._tokens = 0
        self._first: ChatMessage | None = None
        self._last: ChatMessage | None = None

    def count(self, messages: Sequence[ChatMessage]) -> int:
        n = self._length
        grown = (
            0 < n <= len(messages)
            and messages[0] is self._first
            and (messages[n - 1] is self._last)
        )
        start = n if grown else 0
        tokens = (self._tokens if grown else 0) + sum(message_tokens(m) for m in messages[start:])
        self._length, self._tokens = len(messages), tokens
        self._first = messages[0] if messages else None
        self._last = messages[-1] if messages else None
        return tokens


async def streamed(answer: Awaitable[ModelReply]) -> AsyncIterator[TextDelta | ModelReply]:
    """A reply as a stream: its text in a few chunks (split at spaces), then the reply."""
    whole = await answer
    text = whole.text or ""
    step = max(8, len(text) // 3)
    start = 0
    while start < len(text):
        end = text.find(" ", start + step)
        end = len(text) if end < 0 else end + 1
        yield TextDelta(text=text[start:end])
        start = end
    yield whole


def reply(text: str, *, output_tokens: int | None = None) -> ModelReply:
    """A scripted final answer."""
    return ModelReply(text=text, usage=Usage(requests=1, output_tokens=output_tokens or 0))


def call(name: str, arguments: dict[str, Any] | str | None = None, /, **kwargs: Any) -> ModelReply:
    """A scripted tool call: `call("search", query="x")` or `call("search", '{"query": ...}')`.

    A string is used verbatim as the arguments' JSON text, so a script can send malformed JSON.
    """
    text = arguments if isinstance(arguments, str) else json.dumps({**(arguments or {}), **kwargs})
    return ModelReply(
        tool_calls=(ToolCall(id=f"call_{next(_call_ids)}", name=name, arguments=text),)
    )


def calls(*tool_calls: ModelReply) -> ModelReply:
    """Several tool calls in one reply (parallel tool calls)."""
    return ModelReply(tool_calls=tuple(c for r in tool_calls for c in r.tool_calls))


class ScriptedModel:
    """Replies from a list, in order. A call after the last reply raises `ScriptExhausted`.

    Items are `ModelReply`s (see `reply`, `call`, `calls`) or plain strings (final answers).
    Usage counts input tokens as characters / 4 of the conversation, so budgets can be tested.

    `structured_output=True` makes it a `StructuredOutputModel`: a typed agent then sends the
    answer's schema with each call (kept in `outputs`, one per call) and takes the scripted
    text as the JSON answer; by default a typed agent offers it a `final_answer` tool instead,
    which the script calls (`call("final_answer", total=12)`).

    Each call yields to the event loop once, before it takes its reply, as a model over the
    network does (`suspends`): other tasks run, and a cancellation lands, at every call.
    """

    suspends = True  # each call passes a checkpoint (see `Model`)

    def __init__(
        self,
        script: Sequence[ModelReply | str],
        *,
        name: str = "scripted",
        record_calls: bool = True,
        structured_output: bool = False,
    ) -> None:
        self._script = [reply(item) if isinstance(item, str) else item for item in script]
        self._name = name
        self._record = record_calls
        self._structured = structured_output
        self._used = 0
        self._tokens = _TokenCounter()
        self.calls: list[list[ChatMessage]] = []  # the conversation as sent, per call
        self.outputs: list[OutputSpec | None] = []  # the answer's schema sent, per call

    @property
    def name(self) -> str:
        return self._name

    @property
    def structured_output(self) -> bool:
        """Whether a typed agent sends this model its answer's schema (see the class)."""
        return self._structured

    @property
    def remaining(self) -> int:
        return len(self._script) - self._used

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        await asyncio.sleep(0)  # a checkpoint, before the script is touched
        step = self._used
        if step >= len(self._script):
            raise ScriptExhausted(
                f"{self._name}: called a {step + 1}th time, but the script has "
                f"{len(self._script)} replies"
            )
        self._used += 1
        if self._record:
            self.calls.append(list(messages))
            self.outputs.append(output)
        scripted = self._script[step]
        usage = Usage(
            requests=1,
            input_tokens=self._tokens.count(messages),
            output_tokens=scripted.usage.output_tokens or len(scripted.text or "") // 4 + 1,
        )
        return scripted.model_copy(update={"usage": usage, "model": self._name})

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[TextDelta | ModelReply]:
        """The next scripted reply as a stream: its text in a few chunks, then the reply."""
        return streamed(self.complete(messages, tools, output=output))

    def assert_done(self) -> None:
        """Fail unless every scripted reply was used."""
        if self.remaining:
            raise AssertionError(
                f"{self._name}: {self.remaining} scripted replies were never "
                f"used (used {self._used} of {len(self._script)})"
            )


ReplyFunction = Callable[
    [Sequence[ChatMessage], Sequence[ToolSpec]], ModelReply | str | Awaitable[ModelReply | str]
]


class FunctionModel:
    """Each reply is decided by `fn(messages, tools)` (sync or async), returning a `ModelReply`
    or a string (a final answer). `structured_output=True`: a typed agent sends the answer's
    schema with each call (the last one sent is `output`) and takes the text as the answer."""

    def __init__(
        self, fn: ReplyFunction, *, name: str = "function", structured_output: bool = False
    ) -> None:
        if not callable(fn):
            raise UsageError("FunctionModel needs a callable")
        self._fn = fn
        self._name = name
        self._structured = structured_output
        self.output: OutputSpec | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def structured_output(self) -> bool:
        """Whether a typed agent sends this model its answer's schema (see the class)."""
        return self._structured

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        self.output = output
        result = self._fn(messages, tools)
        if inspect.isawaitable(result):
            result = await result
        answer = reply(result) if isinstance(result, str) else result
        if not isinstance(answer, ModelReply):
            raise UsageError(
                f"FunctionModel function returned {type(answer).__name__}, not a ModelReply or str"
            )
        return answer.model_copy(update={"model": self._name})

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[TextDelta | ModelReply]:
        """The function's reply as a stream: its text in a few chunks, then the reply."""
        return streamed(self.complete(messages, tools, output=output))
