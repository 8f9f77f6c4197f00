"""Streamed OpenAI answers without I/O: server-sent event lines in, text pieces and one reply out.

`SSEDecoder` turns lines into events' data; `ChatStream` folds Chat Completions chunks and
`ResponsesStream` Responses API events into a `ModelReply`. Like `openai_wire`, anything a server
sends ends as text, a reply, or a `ModelError`: `Unusable` (an error event; not retried) or
`StreamFault` (a chunk that is not JSON, a stream that stopped early; retried by the adapter while
no text was passed on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from teamrt.models.base import ModelReply, ToolCall, Usage
from teamrt.models.openai_wire import (
    StreamFault,
    Unusable,
    as_list,
    as_object,
    as_text,
    chat_usage,
    error_message,
    kind_of,
    make_reply,
    new_call_id,
    no_constants,
    parse_responses,
)


class SSEDecoder:
    """Server-sent events from lines: `feed(line)` returns the event's data when a blank line ends
    one (data lines joined by newlines), else None. Comments and other fields are ignored."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The last event, when the stream ended without its closing blank line."""
        return self.feed("")


def _chunk(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data, parse_constant=no_constants)
    except (ValueError, RecursionError):
        raise StreamFault(f"a streamed chunk is not JSON: {data[:120]!r}") from None
    if not isinstance(value, dict):
        raise StreamFault(f"a streamed chunk is {kind_of(value)}, not an object: {data[:120]!r}")
    return value


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChatStream:
    """Chat Completions chunks folded into one reply. `feed(data)` returns the text to pass on
    now; `reply()` is the whole reply once the stream finished, else a `StreamFault`."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model = ""
        self.done = False

    def feed(self, data: str) -> str:
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        chunk = _chunk(data)
        if (error := error_message(chunk)) is not None:
            raise Unusable(f"the server sent an error mid-stream: {error}")
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        self.usage = chat_usage(chunk) or self.usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        for raw in as_list(delta.get("tool_calls"), "a streamed delta's tool_calls"):
            self._call(raw)
        piece = as_text(delta.get("content"), "a streamed delta's content") or ""
        if piece:
            self.text.append(piece)
        return piece

    def _call(self, raw: Any) -> None:
        raw = as_object(raw, "a streamed tool call")
        index = raw.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # no index: a new call when it brings an id, else more of the last one
            index = len(self.calls) if raw.get("id") or not self.calls else max(self.calls)
        call = self.calls.setdefault(index, _PartialCall())
        if isinstance(raw.get("id"), str) and raw["id"]:
            call.id = raw["id"]
        function = raw.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call.name += function["name"]
            arguments = function.get("arguments")
            if arguments is not None:
                call.arguments.append(
                    arguments if isinstance(arguments, str) else json.dumps(arguments)
                )

    def reply(self) -> ModelReply:
        if not self.done and self.finish_reason is None:
            raise StreamFault("the stream ended before the answer was complete")
        calls = [
            ToolCall(id=c.id or new_call_id(), name=c.name, arguments="".join(c.arguments) or "{}")
            for _, c in sorted(self.calls.items())
        ]
        return make_reply(
            "".join(self.text) or None,
            calls,
            {"model": self.model},
            self.finish_reason,
            self.usage,
        )


class ResponsesStream:
    """Responses API events folded into one reply: text deltas are passed on as they come, the
    reply is the final `response.completed` (or `response.incomplete`) event's response."""

    def __init__(self, strict: dict[str, dict[str, Any]] | None = None) -> None:
        self._strict = strict
        self.text: list[str] = []
        self.final: ModelReply | None = None

    def feed(self, data: str) -> str:
        event = _chunk(data)
        kind = event.get("type")
        if kind == "response.output_text.delta":
            piece = event.get("delta")
            if isinstance(piece, str) and piece:
                self.text.append(piece)
                return piece
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = parse_responses(event.get("response"), self._strict)
        elif kind == "error":
            message = error_message(event) or str(event.get("message"))[:300]
            raise Unusable(f"the server sent an error mid-stream: {message}")
        return ""

    def reply(self) -> ModelReply:
        if self.final is None:
            raise StreamFault("the stream ended before the answer was complete")
        if self.final.text is None and self.text:
            return self.final.model_copy(update={"text": "".join(self.text)})
        return self.final
