"""The model interface: provider-neutral messages and tool schemas in, a reply out.

A `Model` takes the conversation (`ChatMessage`s) and the tools on offer (`ToolSpec`s) and returns
a `ModelReply`: text, tool calls, or both, with token usage. Adapters translate to and from a
provider's wire format at this one boundary; everything above it sees only these types.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from teamrt._assemble import assemble
from teamrt.errors import ModelRequestsBlocked

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    """A model's request to run a tool. `arguments` is the JSON text exactly as the model wrote
    it: it is validated by the tool, not trusted here."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # on a tool result: the call it answers
    name: str | None = None  # on a tool result: the tool's name
    # on an assistant message: the Responses API's reasoning items, sent back on the next call
    reasoning: tuple[dict[str, Any], ...] = ()

    @classmethod
    def system(cls, content: str) -> ChatMessage:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> ChatMessage:
        return cls(role="user", content=content)

    @classmethod
    def tool_result(cls, call: ToolCall, content: str) -> ChatMessage:
        id_, name = call.id, call.name
        if cls is ChatMessage and type(content) is str and type(id_) is str and type(name) is str:
            # valid as they are: made without validating them again (once per tool call)
            values = {
                "role": "tool",
                "content": content,
                "tool_calls": (),
                "tool_call_id": id_,
                "name": name,
                "reasoning": (),
            }
            return assemble(cls, values, {"role", "content", "tool_call_id", "name"})
        return cls(role="tool", content=content, tool_call_id=id_, name=name)


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and a JSON schema for its arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class OutputSpec(BaseModel):
    """A typed answer as a model is asked for it: a name, a description and the JSON schema
    the final answer must match (always an object: other types are wrapped as `{"value": ...}`
    by the agent). A model that does structured output (`StructuredOutputModel`) gets it with
    each call of a typed run; for other models the agent offers a final-answer tool instead."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    json_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class Usage(BaseModel):
    """Tokens used by one or more model calls."""

    model_config = ConfigDict(frozen=True)

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        requests = self.requests + other.requests
        input_tokens = self.input_tokens + other.input_tokens
        output_tokens = self.output_tokens + other.output_tokens
        if type(requests) is int and type(input_tokens) is int and type(output_tokens) is int:
            # sums of ints are valid as they are (once per model call)
            values = {
                "requests": requests,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
            }
            return assemble(Usage, values, {"requests", "input_tokens", "output_tokens"})
        return Usage(requests=requests, input_tokens=input_tokens, output_tokens=output_tokens)


class ModelReply(BaseModel):
    """What the model answered: text, tool calls, or both.

    `finish_reason` is `"length"` when the reply was cut off by the output limit (a Responses
    API `incomplete` answer is reported the same way): the loop does not take it as final.
    `attempts` counts the HTTP requests it took (retries are `attempts - 1`, of which
    `rate_limited` were 429 answers). `usage_estimated` is True when the server reported no
    usage and the tokens were estimated locally. `reasoning` holds a reasoning model's items
    (Responses API), carried into the conversation so the next call sends them back.
    """

    model_config = ConfigDict(frozen=True)

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage(requests=1)
    model: str = ""
    finish_reason: str | None = None
    attempts: int = 1
    rate_limited: int = 0
    usage_estimated: bool = False
    reasoning: tuple[dict[str, Any], ...] = ()  # Responses API reasoning items, to send back

    def as_message(self) -> ChatMessage:
        text, calls, reasoning = self.text, self.tool_calls, self.reasoning
        if (
            (text is None or type(text) is str)
            and type(calls) is tuple
            and type(reasoning) is tuple
            and (
                not calls
                or (len(calls) == 1 and type(calls[0]) is ToolCall)
                or all(type(c) is ToolCall for c in calls)
            )
            and (not reasoning or all(type(r) is dict for r in reasoning))
        ):
            # a validated reply's fields are a valid message's (once per model call); one made
            # by `model_construct` may hold raw parts, which validation turns into valid ones
            values = {
                "role": "assistant",
                "content": text,
                "tool_calls": calls,
                "tool_call_id": None,
                "name": None,
                "reasoning": reasoning,
            }
            return assemble(ChatMessage, values, {"role", "content", "tool_calls", "reasoning"})
        return ChatMessage(role="assistant", content=text, tool_calls=calls, reasoning=reasoning)


class TextDelta(BaseModel):
    """A piece of a reply's text as the model writes it (streaming)."""

    model_config = ConfigDict(frozen=True)

    text: str


def message_tokens(message: ChatMessage) -> int:
    """A cheap token estimate for budgets (4 characters a token, plus a little per message)."""
    size = len(message.content or "")
    for call in message.tool_calls:
        size += len(call.name) + len(call.arguments)
    return size // 4 + 4


@runtime_checkable
class StreamingModel(Protocol):
    """A model that can also stream: `stream()` yields `TextDelta`s as the text is written,
    then exactly one `ModelReply`, the whole reply (as `complete()` would have returned it).
    A fault mid-stream raises `ModelError` like `complete()` (after any retries)."""

    def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[TextDelta | ModelReply]: ...


@runtime_checkable
class Model(Protocol):
    """Anything that can continue a conversation.

    A model whose every `complete()` (and `stream()`) suspends at least once, yielding to the
    event loop (a request over the network, say), may say so with an attribute
    `suspends = True`: the agent loop then adds no event-loop pass of its own before the step's
    first tool call (other tasks ran, and a cancellation landed, during the model call), unless
    the agent has a shared budget or a listener (`on_event`), which may be the last to see a
    cancellation. Without it the loop passes a checkpoint before each tool call that runs
    alone, so a run whose model and tools never wait still lets other tasks run and can be
    cancelled at every step. It is a promise: a model that says it and answers without waiting
    runs steps of sync tools that let no other task run and take no cancellation.
    """

    @property
    def name(self) -> str:
        """The model's name, used to look up its price."""
        ...

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> ModelReply: ...


@runtime_checkable
class StructuredOutputModel(Protocol):
    """A model that can be held to a JSON schema for its final answer (a provider's structured
    output, such as OpenAI's `response_format` of type `json_schema`).

    `structured_output` says whether it does (an adapter may be told not to, for a server that
    does not); when it is False, a typed agent asks for the answer through a final-answer tool
    instead. With `output`, the reply's text is the answer as JSON text (tool calls may still
    come first)."""

    @property
    def structured_output(self) -> bool: ...

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply: ...


@runtime_checkable
class StructuredStreamingModel(Protocol):
    """A structured-output model that also streams with the schema applied."""

    def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> AsyncIterator[TextDelta | ModelReply]: ...


# --- the switch that keeps tests offline -------------------------------------------------------

_ENV_SWITCH = "TEAMRT_ALLOW_MODEL_REQUESTS"
_allowed: bool | None = None  # None: follow the environment


def model_requests_allowed() -> bool:
    """Whether adapters for real models may send requests (default: yes).

    The test configuration switches this off, so a test can never call a real model by
    accident; a test of an adapter against a local server switches it on explicitly.
    """
    if _allowed is not None:
        return _allowed
    return os.environ.get(_ENV_SWITCH, "1").lower() not in ("0", "false", "no")


def set_model_requests_allowed(allowed: bool | None) -> None:
    """Switch real model requests on or off for this process (None: follow the environment)."""
    global _allowed
    _allowed = allowed


@contextmanager
def allow_model_requests(allowed: bool = True) -> Iterator[None]:
    """Temporarily switch real model requests on (or off)."""
    previous = _allowed
    set_model_requests_allowed(allowed)
    try:
        yield
    finally:
        set_model_requests_allowed(previous)


def check_model_requests_allowed(model: str) -> None:
    if not model_requests_allowed():
        raise ModelRequestsBlocked(
            f"refusing to call the real model {model!r}: real model requests are switched off "
            f"(set {_ENV_SWITCH}=1 or use teamrt.models.allow_model_requests())"
        )
