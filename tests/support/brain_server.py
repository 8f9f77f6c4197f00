"""An OpenAI-compatible server on 127.0.0.1 whose answers come from the demos' own offline brains.

Several agents call it at once, in any order, so it keeps no script: each Chat Completions
request is turned back into teamrt `ChatMessage`s and `ToolSpec`s (a tool result's name is
found from the call it answers, which the wire does not repeat), the brain is picked by the
system prompt (the teammate's instructions), and its reply is sent as a chat completion with
tool calls or text, with usage (streamed when asked to). The real `openai` client, the HTTP
path and the demo code run end to end. It can also fail: every answer an HTTP error (`status`),
every answer text without tool calls (`mute`), or one brain's answers an error (a brain that
raises `Refuse`).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from teamrt.models import ChatMessage, ModelReply, ToolCall, ToolSpec
from teamrt.models.base import message_tokens

Brain = Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], ModelReply | str]


class Refuse(Exception):
    """Raised by a brain: answer with this HTTP error instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def messages_of(body: dict[str, Any]) -> list[ChatMessage]:
    """A Chat Completions request's messages as teamrt messages."""
    names: dict[str, str] = {}  # call id -> tool name, to name the tool results
    out = []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = tuple(
            ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in m.get("tool_calls") or ()
        )
        names.update({c.id: c.name for c in calls})
        call_id = m.get("tool_call_id")
        out.append(
            ChatMessage(
                role=m["role"],
                content=content,
                tool_calls=calls,
                tool_call_id=call_id,
                name=names.get(call_id or "") if m["role"] == "tool" else None,
            )
        )
    return out


def tools_of(body: dict[str, Any]) -> list[ToolSpec]:
    return [
        ToolSpec(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            parameters=t["function"].get("parameters", {"type": "object"}),
        )
        for t in body.get("tools") or ()
    ]


def completion(model: str, reply: ModelReply, messages: Sequence[ChatMessage]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    prompt = sum(message_tokens(m) for m in messages)
    answer = message_tokens(reply.as_message())
    return {
        "id": "chatcmpl-brain",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": answer,
            "total_tokens": prompt + answer,
        },
    }


class BrainServer:
    """`routes`: (text in the system prompt, brain), the first match answers."""

    def __init__(
        self,
        routes: Sequence[tuple[str, Brain]],
        *,
        status: int | None = None,
        mute: bool = False,
    ) -> None:
        self.routes = list(routes)
        self.status = status  # answer every request with this HTTP error
        self.mute = mute  # answer every request with text, never a tool call
        self.calls: Counter[str] = Counter()  # route key -> requests answered
        self.models: set[str] = set()  # the model names requests asked for
        self.authorization: set[str | None] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                server.authorization.add(self.headers.get("authorization"))
                status, answer = server.answer(self.path, body)
                if status == 200 and body.get("stream"):
                    self._stream(answer)
                    return
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, answer: dict[str, Any]) -> None:
                """The same answer as server-sent events: one chunk with the whole message,
                the finish reason, the usage, [DONE]."""
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in stream_events(answer):
                    data = f"data: {event}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.status is not None:
            return self.status, _error(f"refused by the test server ({self.status})")
        if not path.endswith("/chat/completions"):
            return 404, _error(f"no route {path}")
        messages, tools = messages_of(body), tools_of(body)
        model = str(body.get("model", ""))
        self.models.add(model)
        system = next((m.content or "" for m in messages if m.role == "system"), "")
        key, brain = next(((k, b) for k, b in self.routes if k in system), ("", None))
        self.calls[key] += 1
        if brain is None:
            return 400, _error(f"no brain for the system prompt {system[:60]!r}")
        if self.mute:
            return 200, completion(model, ModelReply(text="I looked into it."), messages)
        try:
            reply = brain(messages, tools)
        except Refuse as exc:
            return exc.status, _error(str(exc))
        if isinstance(reply, str):
            reply = ModelReply(text=reply)
        return 200, completion(model, reply, messages)

    def __enter__(self) -> BrainServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def stream_events(answer: dict[str, Any]) -> list[str]:
    """A chat completion as the data lines of a streamed one (Chat Completions chunks)."""
    choice = answer["choices"][0]
    message = dict(choice["message"])
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "model": answer["model"]}
    return [
        json.dumps({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        json.dumps(
            {
                **head,
                "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            }
        ),
        json.dumps({**head, "choices": [], "usage": answer["usage"]}),
        "[DONE]",
    ]


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}
