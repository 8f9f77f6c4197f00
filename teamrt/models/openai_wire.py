"""The OpenAI wire formats without I/O: request bodies out, whole answers in (streams are in
`openai_stream`).

Answers are walked as plain JSON, never through the SDK's models, so that whatever a server
sends becomes either a `ModelReply` or a `ModelError` saying which part was unusable: nothing
here may raise anything else (a fuzz test holds it to that). Odd but meaningful answers are
accepted: arguments given as a JSON object, a tool call without an id, text as a list of parts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teamrt.errors import StreamFault as StreamFault
from teamrt.errors import Unusable as Unusable
from teamrt.models.base import ChatMessage, ModelReply, OutputSpec, ToolCall, ToolSpec, Usage
from teamrt.models.strict_schema import drop_added_nulls, strict_schema

# --- request bodies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFormat:
    """A typed answer's schema as sent (`json_schema`: strict when strict mode can express it)
    and, when sent strict, the original schema, whose optional properties come back as nulls
    to drop (see `strict_schema`)."""

    json_schema: dict[str, Any]
    strict: dict[str, Any] | None

    @classmethod
    def of(cls, output: OutputSpec) -> OutputFormat:
        converted = strict_schema(output.json_schema)
        fmt: dict[str, Any] = {
            "name": output.name,
            "schema": converted if converted is not None else output.json_schema,
            "strict": converted is not None,
        }
        if output.description:
            fmt["description"] = output.description
        return cls(fmt, output.json_schema if converted is not None else None)

    def clean(self, reply: ModelReply) -> ModelReply:
        """The reply with the nulls strict mode added to its answer removed."""
        if self.strict is None or not reply.text or reply.tool_calls:
            return reply
        text = drop_added_nulls(reply.text, self.strict)
        return reply if text == reply.text else reply.model_copy(update={"text": text})


def chat_body(
    model: str,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec],
    temperature: float | None,
    output: OutputFormat | None = None,
) -> dict[str, Any]:
    """A Chat Completions request; with `output`, the answer is held to its schema
    (`response_format` of type `json_schema`)."""
    body: dict[str, Any] = {"model": model, "messages": [_chat_message(m) for m in messages]}
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]
    if temperature is not None:
        body["temperature"] = temperature
    if output is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": output.json_schema}
    return body


def _chat_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""}
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    return out


@dataclass(frozen=True)
class ResponsesTools:
    """The tools as sent to the Responses API, and the original schemas of those sent strict
    (their optional arguments come back as nulls to drop)."""

    specs: list[dict[str, Any]]
    strict: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, tools: Sequence[ToolSpec]) -> ResponsesTools:
        specs, strict = [], {}
        for t in tools:
            converted = strict_schema(t.parameters)
            spec: dict[str, Any] = {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": converted if converted is not None else t.parameters,
                "strict": converted is not None,
            }
            if converted is not None:
                strict[t.name] = t.parameters
            specs.append(spec)
        return cls(specs, strict)


def responses_body(
    model: str,
    messages: Sequence[ChatMessage],
    tools: ResponsesTools,
    temperature: float | None,
    store: bool,
    output: OutputFormat | None = None,
) -> dict[str, Any]:
    """A Responses API request; with `output`, the answer is held to its schema (`text.format`
    of type `json_schema`)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.tool_call_id,
                    "output": m.content or "",
                }
            )
            continue
        for item in m.reasoning:
            # without a stored response, an item is only accepted with its encrypted content
            if store or item.get("encrypted_content"):
                items.append({k: v for k, v in item.items() if k != "status"})
        if m.content:
            items.append(
                {"role": "developer" if m.role == "system" else m.role, "content": m.content}
            )
        for c in m.tool_calls:
            items.append(
                {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
            )
    body: dict[str, Any] = {"model": model, "input": items, "store": store}
    if not store:
        body["include"] = ["reasoning.encrypted_content"]
    if tools.specs:
        body["tools"] = tools.specs
    if temperature is not None:
        body["temperature"] = temperature
    if output is not None:
        body["text"] = {"format": {"type": "json_schema", **output.json_schema}}
    return body


# --- decoding answers ---------------------------------------------------------------------------


def decode_json(status: int, content_type: str, data: bytes) -> Any:
    """The JSON value of an answer's body, or `Unusable` naming the status, the content type and
    the first bytes (an HTML page usually means the base URL points at a web app, not an API)."""
    kind = content_type.split(";")[0].strip().lower() or "no content type"
    hint = ""
    if "html" in kind or data.lstrip()[:1] == b"<":
        hint = " (is the base URL an OpenAI-compatible API? It usually ends in /v1)"
    if not kind.endswith("json") and "html" in kind:
        raise Unusable(_not_json(status, kind, data) + hint, status=status)
    try:
        return json.loads(data, parse_constant=no_constants)
    except (ValueError, RecursionError):
        raise Unusable(_not_json(status, kind, data) + hint, status=status) from None


def no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python reads them, JSON has none


def _not_json(status: int, kind: str, data: bytes) -> str:
    return f"HTTP {status} answered with {kind}, not JSON: {data[:120]!r}"


def kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Unusable(f"unusable answer: {where} is {kind_of(value)}, not an object")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unusable(f"unusable answer: {where} is {kind_of(value)}, not a list")
    return value


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def as_text(value: Any, where: str) -> str | None:
    """Message content: a string, null, or a list of parts with text (some servers)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "".join(texts) or None
    raise Unusable(f"unusable answer: {where} is {kind_of(value)}, not text")


def _arguments(value: Any) -> str:
    """Arguments as JSON text: a string as written; an object (some servers) as its JSON."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value or "{}"
    return json.dumps(value)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_id(value: Any) -> str:
    return value if isinstance(value, str) and value else new_call_id()


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Unusable(f"unusable answer: {where} is {kind_of(value)}, not a tool name")
    return value


def error_message(body: dict[str, Any]) -> str | None:
    error = body.get("error")
    if error is None:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or error)[:300]
    return str(error)[:300]


def parse_chat(body: Any) -> ModelReply:
    """A Chat Completions answer as a reply (`usage_estimated` when it had no usage)."""
    body = as_object(body, "the answer")
    if (error := error_message(body)) is not None:
        raise Unusable(f"the server answered with an error: {error}")
    choices = as_list(body.get("choices"), "choices")
    if not choices:
        raise Unusable("unusable answer: it has no choices")
    choice = as_object(choices[0], "choices[0]")
    message = as_object(choice.get("message"), "choices[0].message")
    text = as_text(message.get("content"), "choices[0].message.content")
    if text is None and isinstance(message.get("refusal"), str):
        text = message["refusal"]
    calls = []
    for i, raw in enumerate(as_list(message.get("tool_calls"), "choices[0].message.tool_calls")):
        where = f"choices[0].message.tool_calls[{i}]"
        function = as_object(as_object(raw, where).get("function"), f"{where}.function")
        calls.append(
            ToolCall(
                id=_call_id(raw.get("id")),
                name=_name(function.get("name"), f"{where}.function.name"),
                arguments=_arguments(function.get("arguments")),
            )
        )
    reason = choice.get("finish_reason")
    return make_reply(
        text, calls, body, reason if isinstance(reason, str) else None, chat_usage(body)
    )


def chat_usage(body: dict[str, Any]) -> Usage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    return Usage(requests=1, input_tokens=prompt, output_tokens=completion)


def make_reply(
    text: str | None,
    calls: Sequence[ToolCall],
    body: dict[str, Any],
    finish_reason: str | None,
    usage: Usage | None,
    reasoning: Sequence[dict[str, Any]] = (),
) -> ModelReply:
    model = body.get("model")
    return ModelReply(
        text=text,
        tool_calls=tuple(calls),
        model=model if isinstance(model, str) else "",
        finish_reason=finish_reason,
        usage=usage or Usage(requests=1),
        usage_estimated=usage is None,
        reasoning=tuple(reasoning),
    )


def parse_responses(body: Any, strict: dict[str, dict[str, Any]] | None = None) -> ModelReply:
    """A Responses API answer as a reply. An `incomplete` answer cut by the output limit is
    `finish_reason="length"`; reasoning items are kept on the reply to be sent back."""
    body = as_object(body, "the answer")
    status = body.get("status", "completed")
    if status == "failed" or (status is None and body.get("error")):
        raise Unusable(f"the response failed: {error_message(body) or 'no reason given'}")
    if status not in ("completed", "incomplete", None):
        raise Unusable(f"unusable answer: the response's status is {str(status)[:40]!r}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[dict[str, Any]] = []
    for i, raw in enumerate(as_list(body.get("output"), "output")):
        item = as_object(raw, f"output[{i}]")
        kind = item.get("type")
        if kind == "message":
            for j, part in enumerate(as_list(item.get("content"), f"output[{i}].content")):
                part = as_object(part, f"output[{i}].content[{j}]")
                value = part.get("text") if part.get("type") == "output_text" else None
                if part.get("type") == "refusal":
                    value = part.get("refusal")
                if isinstance(value, str):
                    texts.append(value)
        elif kind == "function_call":
            name = _name(item.get("name"), f"output[{i}].name")
            arguments = _arguments(item.get("arguments"))
            if strict and name in strict:
                arguments = drop_added_nulls(arguments, strict[name])
            calls.append(ToolCall(id=_call_id(item.get("call_id")), name=name, arguments=arguments))
        elif kind == "reasoning":
            reasoning.append(item)
    finish = "tool_calls" if calls else "stop"
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        finish = "length" if reason in ("max_output_tokens", None) else str(reason)[:40]
    return make_reply(
        "".join(texts) or None, calls, body, finish, _responses_usage(body), reasoning
    )


def _responses_usage(body: dict[str, Any]) -> Usage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    given, made = _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))
    if given is None or made is None:
        return None
    return Usage(requests=1, input_tokens=given, output_tokens=made)
