"""A scripted OpenAI-compatible HTTP server on 127.0.0.1, for testing the real client.

Each POST takes the next scripted action (status, JSON body or raw bytes, headers, delay, or a
stream of server-sent events with pauses and faults) and records the request it answered. It
serves /v1/chat/completions and /v1/responses alike: the script decides. HTTP/1.1 with keep-alive,
streams sent chunked, so that a dropped connection is visible to the client as one.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Cut:
    """In a stream: drop the connection here, without ending the chunked body."""


# a stream's items: a data payload (str), a pause in seconds (float), raw bytes, or a Cut
StreamItem = str | float | bytes | Cut


@dataclass
class Action:
    body: dict[str, Any] | None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw: bytes | None = None  # sent instead of the JSON body
    content_type: str = "application/json"
    stream: list[StreamItem] | None = None


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def chat_reply(
    content: str | None = None,
    tool_calls: list[tuple[str, str, str]] | None = None,
    prompt_tokens: int = 11,
    completion_tokens: int = 7,
) -> dict[str, Any]:
    """A Chat Completions answer; tool_calls are (id, name, arguments JSON text)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def responses_reply(
    text: str | None = None, calls: list[tuple[str, str, str]] | None = None
) -> dict[str, Any]:
    """A Responses API answer; calls are (call_id, name, arguments JSON text)."""
    output: list[dict[str, Any]] = [
        {
            "type": "function_call",
            "id": f"fc_{c}",
            "call_id": c,
            "name": n,
            "arguments": a,
            "status": "completed",
        }
        for c, n, a in calls or []
    ]
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "fake-model",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 13,
            "output_tokens": 5,
            "total_tokens": 18,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def error_body(message: str, kind: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def chat_chunks(
    pieces: list[str],
    tool_calls: list[tuple[str, str, str]] | None = None,
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = (11, 7),
    done: bool = True,
) -> list[StreamItem]:
    """A streamed Chat Completions answer: text pieces, tool calls (id, name, arguments; the
    arguments split in two chunks), the finish reason, a usage chunk and [DONE]."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return json.dumps(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": "fake-model",
                "choices": [choice],
            }
        )

    items: list[StreamItem] = [chunk({"role": "assistant", "content": ""})]
    items += [chunk({"content": piece}) for piece in pieces]
    for n, (i, name, arguments) in enumerate(tool_calls or []):
        half = len(arguments) // 2
        first = {
            "index": n,
            "id": i,
            "type": "function",
            "function": {"name": name, "arguments": arguments[:half]},
        }
        items.append(chunk({"tool_calls": [first]}))
        items.append(
            chunk({"tool_calls": [{"index": n, "function": {"arguments": arguments[half:]}}]})
        )
    items.append(chunk({}, finish_reason or ("tool_calls" if tool_calls else "stop")))
    if usage is not None:
        prompt, completion = usage
        items.append(
            json.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "model": "fake-model",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
            )
        )
    if done:
        items.append("[DONE]")
    return items


def responses_events(
    pieces: list[str], calls: list[tuple[str, str, str]] | None = None
) -> list[StreamItem]:
    """A streamed Responses API answer: created, text deltas, completed (with the response)."""
    final = responses_reply(text="".join(pieces) if pieces else None, calls=calls)
    items: list[StreamItem] = [
        json.dumps(
            {
                "type": "response.created",
                "response": {**final, "status": "in_progress", "output": []},
            }
        )
    ]
    items += [
        json.dumps(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
        )
        for piece in pieces
    ]
    items.append(json.dumps({"type": "response.completed", "response": final}))
    return items


class FakeOpenAI:
    def __init__(self) -> None:
        self.script: deque[Action] = deque()
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # no Nagle delay between the headers and the body (~40 ms a call otherwise)
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.seen.append(Seen(self.path, headers, body))
                action = (
                    server.script.popleft()
                    if server.script
                    else Action(error_body("the fake server's script is empty"), status=500)
                )
                if action.delay:
                    time.sleep(action.delay)
                try:
                    if action.stream is not None:
                        self._stream(action)
                        return
                    data = (
                        action.raw if action.raw is not None else json.dumps(action.body).encode()
                    )
                    self.send_response(action.status)
                    self.send_header("content-type", action.content_type)
                    self.send_header("content-length", str(len(data)))
                    for key, value in action.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (a timeout test)

            def _stream(self, action: Action) -> None:
                self.send_response(action.status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                for key, value in action.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                for item in action.stream or []:
                    if isinstance(item, Cut):
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    if isinstance(item, float):
                        time.sleep(item)
                        continue
                    data = item if isinstance(item, bytes) else f"data: {item}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False  # a timeout test leaves a handler sleeping
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def then(
        self,
        body: dict[str, Any],
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> FakeOpenAI:
        self.script.append(Action(body, status, headers or {}, delay))
        return self

    def then_raw(
        self, data: bytes, content_type: str = "application/json", status: int = 200
    ) -> FakeOpenAI:
        """Answer with these bytes as they are (HTML, text that is not JSON, ...)."""
        self.script.append(Action(None, status, raw=data, content_type=content_type))
        return self

    def then_stream(self, items: list[StreamItem], delay: float = 0.0) -> FakeOpenAI:
        """Answer with a stream of server-sent events (see `StreamItem`)."""
        self.script.append(Action(None, delay=delay, stream=items))
        return self
