"""The scripted OpenAI-compatible server of `teamrt bench --only models`, on 127.0.0.1 and a free
port: `python -m teamrt.bench.model_server PORT_FILE` writes its port to PORT_FILE once it
listens. Every chat completion gets the same answer (streamed, when asked: in three pieces, then
the usage)."""

from __future__ import annotations

import json
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "The stock is 14 units."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 60, "completion_tokens": 8, "total_tokens": 68},
}
_PIECES = ["The stock ", "is 14 ", "units."]


def _stream_events() -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        choices = [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench-model"}
        data = {**body, "choices": choices, **({"usage": usage} if usage else {})}
        return f"data: {json.dumps(data)}\n\n".encode()

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _PIECES]
    events.append(chunk({}, "stop"))
    events.append(chunk({}, usage=_ANSWER["usage"]))
    return [*events, b"data: [DONE]\n\n"]


def _serve(port_file: str) -> None:
    answer = json.dumps(_ANSWER).encode()
    events = _stream_events()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body go out in two writes: without this, Nagle's algorithm holds the
            # second until the client's delayed ACK (~40 ms a call)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            self.send_response(200)
            if body.get("stream"):
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for event in events:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that closed its connection

    server = Server(("127.0.0.1", 0), Handler)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1])
