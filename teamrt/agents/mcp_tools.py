"""MCP tools: the tools of a Model Context Protocol server, used by an agent like its own.

    files = MCPTools.stdio("python", ["files_server.py"], prefix="files")
    async with files.connect() as connection:
        agent = Agent("clerk", model, tools=[check_stock, *connection.tools])
        report = await agent.run("What is in notes.md?")

An `MCPTools` says how to reach a server (a command to run, talking over its stdin and stdout,
or a streamable HTTP URL) and which of its tools to take; it holds no connection, so one value
serves any number of agents and incarnations. `connect()` starts or reaches the server, lists
its tools and makes each a teamrt `Tool` whose schema is the server's input schema, so the model
sees it like a local tool; leaving the block closes the connection (and stops a stdio server).
A `Teammate(mcp=[...])` connects at the start of every incarnation and closes at its end.

A call goes through the same path as a local tool's: arguments are validated against the
server's schema before anything is sent, the approval gate and the limits apply, and every
failure is data for the model (`{"error": "Kind: message"}`): a result the server marks
`isError` (`ToolError`), no answer within `timeout` (`TimeoutError`), a server that has died
or dropped the connection (`ServerGone`; every later call says so at once, without waiting).
Text content becomes the result; a result with no text gives its structured content as JSON.

The connection lives in a task of its own, which enters and leaves the SDK's client (and its
anyio task groups) itself, so a transport that fails mid-run ends that task only, never the
agent's. The `mcp` package (`pip install 'teamrt[mcp]'`) is imported on `connect()`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import sys
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskStatus
from pydantic import BaseModel

from teamrt.agents.tools import DEFAULT_MAX_OUTPUT, Tool, ToolResult, _error, current_call_id
from teamrt.errors import MCPServerError, UsageError
from teamrt.errors import ServerGone as ServerGone
from teamrt.errors import ToolError as ToolError
from teamrt.models.base import ToolSpec

if TYPE_CHECKING:
    from jsonschema.protocols import Validator
    from mcp import Client
    from mcp_types import CallToolResult, ContentBlock
    from mcp_types import Tool as ServerTool

log = logging.getLogger("teamrt.agents.mcp")

DEFAULT_TIMEOUT = 60.0  # seconds one tool call may take
DEFAULT_START_TIMEOUT = 30.0  # seconds to start or reach a server and list its tools
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what model APIs accept in a tool name
_MAX_NAME = 64
_MAX_PAGES = 100  # tools/list pages read at most
#: The `_meta` key of a call's `current_call_id()`: the same when a resumed run repeats a call
#: that was in flight at a crash, so a server can use it as an idempotency key.
CALL_ID_META = "teamrt/call_id"


@dataclass(frozen=True)
class MCPTools:
    """How to reach one MCP server, and which of its tools an agent gets.

    Make one with `MCPTools.stdio(...)` or `MCPTools.http(...)`; `connect()` gives a live
    `MCPConnection`. Options:

    - `name`: the server's name in errors and logs (default: the command or the URL).
    - `prefix`: tools are named `<prefix>_<tool>` for the model (default: the server's names),
      which keeps two servers' `search` tools apart. Characters a model API refuses in a tool
      name become `_`; two tools of one server that end up with the same name are an error.
    - `allow` / `deny`: the server's tool names to take (all by default) or to leave out; a name
      in `allow` that the server does not have is an error at connect.
    - `timeout`: seconds one call may take; `start_timeout`: seconds to start or reach the
      server and list its tools. `max_output`: characters of a result the model sees.
    """

    transport: Literal["stdio", "http"]
    target: str  # the command, or the URL
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    headers: Mapping[str, str] | None = None
    stderr: TextIO | None = None
    name: str | None = None
    prefix: str | None = None
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    max_output: int = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        if not self.target:
            raise UsageError("MCPTools: the command or URL is empty")
        if self.timeout <= 0 or self.start_timeout <= 0:
            raise UsageError("MCPTools: timeout and start_timeout must be positive")
        if self.prefix is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", self.prefix):
            raise UsageError(f"MCPTools: prefix {self.prefix!r} may use only A-Z a-z 0-9 _ -")
        if isinstance(self.allow, str) or isinstance(self.deny, str):
            raise UsageError("MCPTools: allow and deny take a list of tool names, not a string")

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stderr: TextIO | None = None,
        name: str | None = None,
        prefix: str | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] = (),
        timeout: float = DEFAULT_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> MCPTools:
        """A server run as `command args...`, speaking MCP over its stdin and stdout.

        Each `connect()` starts a fresh process, in its own process group, and stops it when
        the connection closes (stdin closed, then SIGTERM and SIGKILL if it lingers). As the
        MCP SDK does, the process inherits only a few environment variables (`HOME`, `PATH`,
        `USER`, ...): `env` adds to them. Its stderr goes to `stderr` (default: this process's).
        """
        return cls(
            "stdio",
            command,
            args=tuple(args),
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            stderr=stderr,
            name=name,
            prefix=prefix,
            allow=_names(allow),
            deny=tuple(deny),
            timeout=timeout,
            start_timeout=start_timeout,
            max_output=max_output,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] = (),
        timeout: float = DEFAULT_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> MCPTools:
        """A server at a streamable HTTP endpoint (`http://127.0.0.1:8000/mcp`), sent
        `headers` (an `Authorization` header, say) with every request."""
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"MCPTools.http: {url!r} is not an http:// or https:// URL")
        return cls(
            "http",
            url,
            headers=dict(headers) if headers is not None else None,
            name=name,
            prefix=prefix,
            allow=_names(allow),
            deny=tuple(deny),
            timeout=timeout,
            start_timeout=start_timeout,
            max_output=max_output,
        )

    @property
    def label(self) -> str:
        """The server's name in messages: `name`, else its command line or URL."""
        if self.name:
            return self.name
        if self.transport == "http":
            url = urlsplit(self.target)  # without a user and password it may carry
            return url._replace(netloc=url.netloc.rpartition("@")[2]).geturl()
        line = " ".join([Path(self.target).name, *self.args])
        return line if len(line) <= 60 else line[:57] + "..."

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[MCPConnection]:
        """Start or reach the server, list its tools, and yield the live connection; leaving
        the block closes it. Raises `MCPServerError` if the server cannot be started, reached
        or listed within `start_timeout`, and `UsageError` for an `allow` name it lacks."""
        try:
            import jsonschema  # noqa: F401
            import mcp  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                f"MCP server {self.label!r}: MCP tools need the mcp package "
                "(pip install 'teamrt[mcp]')"
            ) from exc
        try:
            async with MCPConnection(self).held() as connection:
                yield connection
        except BaseExceptionGroup as group:  # the task group wraps what the block raised
            if len(group.exceptions) != 1:
                raise
            inner = group.exceptions[0]
            raise inner from inner.__cause__


def _names(names: Iterable[str] | None) -> tuple[str, ...] | None:
    return tuple(names) if names is not None else None


class _Arguments(BaseModel):
    """An MCP tool's validated arguments, handed to the server as they are."""

    arguments: dict[str, Any]


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool of an MCP server: the model sees the server's input schema, arguments are
    validated against it here, and `fn` sends the call to the server.

    `remote_name` is the name the server knows the tool by (`name` is the model's)."""

    remote_name: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def spec(self) -> ToolSpec:
        schema = {k: v for k, v in self.input_schema.items() if k != "title"}
        schema.setdefault("type", "object")
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    @cached_property
    def _validator(self) -> Validator | None:
        from jsonschema import SchemaError
        from jsonschema.validators import validator_for

        try:
            kind = validator_for(self.input_schema)
            kind.check_schema(self.input_schema)
        except SchemaError as exc:  # the server's to fix; it still validates its own input
            log.warning("%s: its input schema is not valid JSON Schema: %s", self.name, exc)
            return None
        validator: Validator = kind(self.input_schema)
        return validator

    def parse(self, arguments: str) -> BaseModel | ToolResult:
        """Validate the model's argument text against the server's schema."""
        try:
            value = json.loads(arguments or "{}")
        except ValueError as exc:
            return _error("ValidationError", f"arguments: not valid JSON ({exc})")
        if not isinstance(value, dict):
            return _error("ValidationError", "arguments: must be a JSON object")
        validator = self._validator
        if validator is not None:
            errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
            if errors:
                parts = [
                    f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
                    for e in errors[:5]
                ]
                return _error("ValidationError", "; ".join(parts))
        return _Arguments(arguments=value)


class MCPConnection:
    """A live connection to an MCP server, from `MCPTools.connect()`.

    `tools` are teamrt `Tool`s (pass them to an `Agent` with the others); `instructions` is
    what the server says about using it, if anything; `gone` says why the server no longer
    answers (None while it does). The connection is held by a task of its own: calls may come
    from any task of the same event loop.
    """

    def __init__(self, spec: MCPTools) -> None:
        self.spec = spec
        self.tools: tuple[MCPTool, ...] = ()
        self.instructions: str | None = None
        self.gone: str | None = None
        self._client: Client | None = None
        self._closing = anyio.Event()
        self._calls: set[anyio.CancelScope] = set()
        self._failed: Exception | None = None  # why it could not start

    def __iter__(self) -> Iterator[MCPTool]:
        return iter(self.tools)

    # -- the task that holds the connection --

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[MCPConnection]:
        """The connection, held by a task of its own for the block (see `connect()`, which
        unwraps the task group's errors); raises why it could not start, if it could not."""
        async with anyio.create_task_group() as tasks:
            await tasks.start(self._hold)
            if self._failed is not None:
                raise self._failed
            try:
                yield self
            finally:
                self._closing.set()

    async def _hold(self, *, task_status: TaskStatus[None]) -> None:
        """Connect and list the tools, report started, then hold the connection until it is
        closed; the SDK's client is entered and left here, in this one task. A failure to
        start is kept in `_failed` for `connect()` to raise."""
        started = False
        try:
            # a deadline for starting, lifted once started (a scope that encloses the client's
            # own task groups, as anyio wants)
            with anyio.CancelScope(
                deadline=anyio.current_time() + self.spec.start_timeout
            ) as start:
                async with contextlib.AsyncExitStack() as stack:
                    client = await self._open(stack)
                    self.tools = await self._list(client)
                    self.instructions = client.instructions
                    self._client = client
                    start.deadline = math.inf
                    task_status.started()
                    started = True
                    await self._closing.wait()
            if not started:
                raise TimeoutError(f"no answer within {self.spec.start_timeout:g} s")
        except Exception as exc:
            leaf = _innermost(exc)
            reason = _describe(leaf)
            if not started:
                self._failed = (
                    leaf
                    if isinstance(leaf, UsageError)
                    else MCPServerError(
                        f"MCP server {self.spec.label!r} could not be "
                        f"{'started' if self.spec.transport == 'stdio' else 'reached'}: {reason}"
                    )
                )
                self._failed.__cause__ = exc
                task_status.started()
            elif not self._closing.is_set():  # it failed while in use: calls must not hang
                self._lose(reason)
            else:
                log.debug("MCP server %r closed with an error: %s", self.spec.label, reason)
        finally:
            self._client = None
            if started and self.gone is None:
                self.gone = "the connection was closed"

    async def _open(self, stack: contextlib.AsyncExitStack) -> Client:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp_types import Implementation

        import teamrt

        spec = self.spec
        if spec.transport == "stdio":
            server = StdioServerParameters(
                command=spec.target, args=list(spec.args), env=spec.env, cwd=spec.cwd
            )
            transport = stdio_client(server, errlog=spec.stderr or sys.stderr)
        else:
            import httpx2

            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(spec.headers or {}),
                    timeout=httpx2.Timeout(spec.start_timeout, read=max(spec.timeout, 300.0)),
                )
            )
            transport = streamable_http_client(spec.target, http_client=http)
        client = Client(
            transport,
            cache=None,  # tools are listed once per connection
            client_info=Implementation(name="teamrt", version=teamrt.__version__),
        )
        return await stack.enter_async_context(client)

    async def _list(self, client: Client) -> tuple[MCPTool, ...]:
        listed: list[ServerTool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        spec = self.spec
        have = [t.name for t in listed]
        if spec.allow is not None:
            missing = sorted(set(spec.allow) - set(have))
            if missing:
                raise UsageError(
                    f"MCP server {spec.label!r} has no tool named {', '.join(missing)} "
                    f"(allow=...); it has: {', '.join(have) or 'none'}"
                )
        taken = [
            t
            for t in listed
            if (spec.allow is None or t.name in spec.allow) and t.name not in spec.deny
        ]
        tools: dict[str, MCPTool] = {}
        for server_tool in taken:
            tool = self._tool(server_tool)
            if tool.name in tools:
                raise UsageError(
                    f"MCP server {spec.label!r}: tools {tools[tool.name].remote_name!r} and "
                    f"{server_tool.name!r} are both named {tool.name!r} for the model"
                )
            tools[tool.name] = tool
        return tuple(tools.values())

    def _tool(self, server_tool: ServerTool) -> MCPTool:
        remote = server_tool.name
        name = _TOOL_NAME.sub("_", remote)
        if self.spec.prefix:
            name = f"{self.spec.prefix}_{name}"

        async def call(arguments: dict[str, Any]) -> Any:
            return await self._call(remote, arguments)

        call.__name__ = call.__qualname__ = name
        return MCPTool(
            name=name[:_MAX_NAME],
            description=server_tool.description or server_tool.title or "",
            fn=call,
            args_model=_Arguments,
            is_async=True,
            max_output=self.spec.max_output,
            remote_name=remote,
            input_schema=dict(server_tool.input_schema),
        )

    def _lose(self, reason: str) -> None:
        """The server is gone: say so to every call waiting on it, and to every later one."""
        if self.gone is None:
            self.gone = reason
            log.warning("MCP server %r is gone: %s", self.spec.label, reason)
        for scope in list(self._calls):
            scope.cancel()

    # -- calls, from the agent's tasks --

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        spec, client = self.spec, self._client
        if self.gone is not None or client is None:
            raise ServerGone(self._gone_message())
        result: CallToolResult | None = None
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                call_id = current_call_id()  # for a server that keeps calls idempotent
                meta: Any = {CALL_ID_META: call_id} if call_id is not None else None
                with anyio.move_on_after(spec.timeout):
                    result = await client.call_tool(tool, arguments, meta=meta)
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    self._lose(exc.message)
                    raise ServerGone(self._gone_message()) from None
                raise
            finally:
                self._calls.discard(scope)
        if scope.cancelled_caught or (self.gone is not None and result is None):
            raise ServerGone(self._gone_message())
        if result is None:
            raise TimeoutError(
                f"MCP server {spec.label!r} did not answer {tool} within {spec.timeout:g} s"
            )
        if result.is_error:
            raise ToolError(_text(result.content) or "the tool failed (the server gave no text)")
        text = _text(result.content)
        if text or result.structured_content is None:
            return text
        return result.structured_content

    def _gone_message(self) -> str:
        return f"MCP server {self.spec.label!r} is gone ({self.gone}); its tools no longer answer"


def _text(blocks: Sequence[ContentBlock]) -> str:
    """A result's content as text: text as it is, other kinds described in a line."""
    parts: list[str] = []
    for block in blocks:
        if block.type == "text":
            parts.append(block.text)
        elif block.type in ("image", "audio"):
            parts.append(f"[{block.type} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif block.type == "resource_link":
            parts.append(f"[resource {block.uri}{f' ({block.name})' if block.name else ''}]")
        elif block.type == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}, binary]")
    return "\n".join(parts)


def _innermost(exc: Exception) -> Exception:
    """The first error inside exception groups (the SDK's task groups wrap them)."""
    while isinstance(exc, ExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
