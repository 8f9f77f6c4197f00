"""A small MCP server for the tests, built with the SDK's `MCPServer` (once `FastMCP`).

    python tests/support/mcp_server.py                          # over stdin and stdout
    python tests/support/mcp_server.py --http PORT [--token T]  # streamable HTTP (127.0.0.1)

Its tools add numbers, greet, fail on purpose, sleep, report the server's pid and how many
calls it has served, echo the call id teamrt sends, and exit the process mid-call. With
`--token`, an HTTP request without `Authorization: Bearer T` is refused (401).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer(
    "arith", instructions="Arithmetic, greetings and faults, for tests.", log_level="WARNING"
)
served = 0


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    global served
    served += 1
    return a + b


@server.tool()
def greet(name: str, excited: bool = False) -> str:
    """Greet someone by name."""
    global served
    served += 1
    return f"hello {name}{'!' if excited else ''}"


@server.tool()
def stats() -> dict[str, int]:
    """The server's pid and how many add and greet calls it has served."""
    return {"pid": os.getpid(), "served": served}


@server.tool()
def call_id(ctx: Context) -> str:
    """The teamrt call id the client sent in the request's _meta (empty if none)."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("teamrt/call_id", ""))


@server.tool(structured_output=False)
def explode(why: str) -> str:
    """Fails with the given reason."""
    raise ToolError(f"exploded: {why}")


@server.tool(name="dotted.name")
def dotted() -> str:
    """A tool whose name has a dot."""
    return "dotted"


@server.tool()
async def nap(seconds: float) -> str:
    """Sleeps for a while (other calls go on meanwhile)."""
    await anyio.sleep(seconds)
    return "rested"


@server.tool()
def die() -> str:
    """Ends the server process at once, mid-call."""
    os._exit(3)


def _guarded(app: Any, token: str) -> Any:
    """The app, refusing HTTP requests without the bearer token."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no token"})
                return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--token")
    options = parser.parse_args()
    if options.http is None:
        server.run("stdio")
        return
    import uvicorn

    app: Any = server.streamable_http_app()
    if options.token:
        app = _guarded(app, options.token)
    uvicorn.run(app, host="127.0.0.1", port=options.http, log_level="warning")


if __name__ == "__main__":
    main()
