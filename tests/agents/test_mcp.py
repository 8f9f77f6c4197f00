"""MCP tools: a small MCP server (tests/support/mcp_server.py) over stdio and streamable HTTP,
called by a scripted model through an agent and a teammate: results, a tool error, bad arguments, a
timeout, a server killed mid-run, a server that cannot start, the approval gate, and a fresh
server for each incarnation."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest

from teamrt import MemoryMailboxes, RemoteError
from teamrt.agents import Agent, Limits, MCPTools, Toolbox, tool
from teamrt.errors import MCPServerError, TeammateGone, UsageError
from teamrt.models import (
    ChatMessage,
    FunctionModel,
    ModelReply,
    ScriptedModel,
    ToolCall,
    ToolSpec,
    call,
)
from teamrt.team import CRASHED, RestartPolicy, Team, Teammate
from tests.support.paths import SUPPORT
from tests.support.redis_server import free_port

pytest.importorskip("mcp")  # teamrt[mcp]

SERVER = str(SUPPORT / "mcp_server.py")


def stdio(**options: object) -> MCPTools:
    return MCPTools.stdio(sys.executable, [SERVER], name="arith", **options)  # type: ignore[arg-type]


def results(messages: Sequence[ChatMessage]) -> list[str]:
    return [m.content or "" for m in messages if m.role == "tool"]


class HTTPServer:
    """tests/support/mcp_server.py over streamable HTTP on a free port of 127.0.0.1, with a
    token."""

    def __init__(self) -> None:
        self.port = free_port()
        self.token = "s3cret"
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [sys.executable, SERVER, "--http", str(self.port), "--token", self.token]
        )
        deadline = time.monotonic() + 30
        while not self._listening():
            assert self.process.poll() is None, "the MCP test server exited at start"
            assert time.monotonic() < deadline, "the MCP test server did not listen in 30 s"
            time.sleep(0.05)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def http_server() -> Iterator[HTTPServer]:
    server = HTTPServer()
    try:
        yield server
    finally:
        server.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- one agent --


async def test_stdio_tools_are_called_like_local_ones(tmp_path: Path) -> None:
    @tool
    def double(n: int) -> int:
        """Twice n."""
        return 2 * n

    model = ScriptedModel(
        [
            call("add", a=2, b=3),
            call("greet", name="Ada", excited=True),
            call("double", n=4),
            call("dotted_name"),
            call("call_id"),
            "all done",
        ]
    )
    with anyio.fail_after(30):
        async with stdio(deny=["die"]).connect() as arith:
            assert arith.instructions == "Arithmetic, greetings and faults, for tests."
            names = [t.name for t in arith.tools]
            assert names == ["add", "greet", "stats", "call_id", "explode", "dotted_name", "nap"]
            add = arith.tools[0]
            assert add.spec.description == "Add two integers."
            assert add.spec.parameters["required"] == ["a", "b"]
            assert add.spec.parameters["properties"]["a"]["type"] == "integer"
            agent = Agent("clerk", model, tools=[double, *arith.tools], directory=tmp_path)
            report = await agent.run("compute")
            assert agent.state is not None
            *answers, call_id = results(agent.state.messages)
            assert answers == ["5", "hello Ada!", "8", "dotted"]
            sent = [c.id for m in agent.state.messages for c in m.tool_calls or ()]
            assert call_id == sent[-1]  # current_call_id(), an idempotency key for the server
    assert (report.answer, report.tool_calls, report.tool_errors) == ("all done", 5, 0)
    assert arith.gone == "the connection was closed"
    # the transcript and the journal record MCP calls like local ones
    lines = (tmp_path / "clerk.transcript.jsonl").read_text().splitlines()
    transcript = [json.loads(line) for line in lines]
    assert transcript[0]["reply"]["tool_calls"][0]["name"] == "add"
    assert "hello Ada!" in (tmp_path / "clerk.state.jsonl").read_text()


async def test_tool_errors_and_bad_arguments_are_data_for_the_model() -> None:
    model = ScriptedModel(
        [
            call("explode", why="on purpose"),
            call("add", a="two"),  # refused here: the server never sees it
            call("stats"),
            call("nope"),
            "understood",
        ]
    )
    with anyio.fail_after(30):
        async with stdio().connect() as arith:
            agent = Agent("clerk", model, tools=arith.tools)
            report = await agent.run("try things")
            # the limits hold for MCP tools like for local ones
            again = ScriptedModel([call("add", a=1, b=1), call("add", a=2, b=2), "never"])
            limited = Agent("clerk", again, tools=arith.tools, limits=Limits(max_tool_calls=1))
            stopped = await limited.run("add twice")
            assert (stopped.stop.limit, stopped.tool_calls) == ("max_tool_calls", 1)
            served = await Toolbox(arith.tools).run(ToolCall(id="c", name="stats", arguments=""))
            assert json.loads(served.content)["served"] == 1  # the second add was not sent
    assert agent.state is not None
    explode, add, stats, nope = results(agent.state.messages)
    assert json.loads(explode) == {
        "error": "ToolError: Error executing tool explode: exploded: on purpose"
    }
    assert json.loads(add) == {
        "error": "ValidationError: arguments: 'b' is a required property; "
        "a: 'two' is not of type 'integer'"
    }
    assert json.loads(nope)["error"].startswith("UnknownTool: no tool named 'nope'")
    assert json.loads(stats)["served"] == 0  # neither add reached the server
    assert (report.answer, report.tool_errors) == ("understood", 3)


async def test_a_call_past_its_timeout_is_an_error_and_the_server_still_answers() -> None:
    model = ScriptedModel([call("nap", seconds=30), call("add", a=1, b=1), "ok"])
    with anyio.fail_after(30):
        async with stdio(timeout=0.3).connect() as arith:
            agent = Agent("clerk", model, tools=arith.tools)
            await agent.run("nap")
    assert agent.state is not None
    nap, add = results(agent.state.messages)
    assert json.loads(nap) == {
        "error": "TimeoutError: MCP server 'arith' did not answer nap within 0.3 s"
    }
    assert add == "2"


async def test_a_stdio_server_killed_mid_run_is_an_error_not_a_hang() -> None:
    """Killed from outside between two calls, and dying in the middle of a call: each call
    returns an error at once, and the run goes on to its answer."""
    pids: list[int] = []

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        seen = results(messages)
        if not seen:
            return call("stats")
        if len(seen) == 1:
            pids.append(json.loads(seen[0])["pid"])
            os.kill(pids[0], signal.SIGKILL)
            return call("add", a=1, b=2)
        if len(seen) == 2:
            return call("greet", name="anyone")
        return "the server is gone"

    with anyio.fail_after(30):
        async with stdio().connect() as arith:
            agent = Agent("clerk", FunctionModel(brain), tools=arith.tools)
            report = await agent.run("go")
            assert arith.gone is not None
    assert agent.state is not None
    _, add, greet = results(agent.state.messages)
    gone = "ServerGone: MCP server 'arith' is gone (Connection closed); its tools no longer answer"
    assert json.loads(add) == json.loads(greet) == {"error": gone}
    assert (report.stop.reason, report.answer) == ("answer", "the server is gone")

    # a server that exits in the middle of a call
    model = ScriptedModel([call("die"), "it died"])
    with anyio.fail_after(30):
        async with stdio().connect() as arith:
            agent = Agent("clerk", model, tools=arith.tools)
            report = await agent.run("die")
    assert agent.state is not None
    assert json.loads(results(agent.state.messages)[0]) == {"error": gone}
    assert report.answer == "it died"


async def test_a_server_that_cannot_start_is_a_clear_error() -> None:
    with anyio.fail_after(30):
        with pytest.raises(MCPServerError, match=r"MCP server 'nowhere' could not be started.*"
                                                 r"FileNotFoundError"):  # fmt: skip
            async with MCPTools.stdio("/nonexistent/mcp-server", name="nowhere").connect():
                pass
        quits = MCPTools.stdio(sys.executable, ["-c", "pass"])
        with pytest.raises(MCPServerError, match=r"MCP server 'python\S* -c pass' could not"):
            async with quits.connect():
                pass


async def test_names_prefix_allow_and_deny() -> None:
    with anyio.fail_after(30):
        async with stdio(prefix="m", allow=["add", "dotted.name", "die"], deny=["die"]).connect(
        ) as arith:  # fmt: skip
            assert [t.name for t in arith] == ["m_add", "m_dotted_name"]
            assert [t.remote_name for t in arith] == ["add", "dotted.name"]
            model = ScriptedModel([call("m_add", a=20, b=22), "42"])
            agent = Agent("clerk", model, tools=arith.tools)
            assert (await agent.run("add")).answer == "42"
            assert agent.state is not None and results(agent.state.messages) == ["42"]
        with pytest.raises(KeyError):  # what the block raises comes out as it is
            async with stdio().connect():
                raise KeyError("mine")
        with pytest.raises(UsageError, match="has no tool named subtract"):
            async with stdio(allow=["add", "subtract"]).connect():
                pass
    with pytest.raises(UsageError, match="prefix"):
        stdio(prefix="my tools")
    with pytest.raises(UsageError, match="not an http"):
        MCPTools.http("localhost:8000/mcp")
    assert MCPTools.http("https://me:pw@example.com/mcp").label == "https://example.com/mcp"


# -- streamable HTTP --


async def test_http_tools_with_headers_and_a_tool_error(http_server: HTTPServer) -> None:
    model = ScriptedModel(
        [call("add", a=40, b=2), call("explode", why="remote"), call("stats"), "fine"]
    )
    server = MCPTools.http(
        http_server.url, headers={"Authorization": f"Bearer {http_server.token}"}, name="web"
    )
    with anyio.fail_after(30):
        async with server.connect() as web:
            agent = Agent("clerk", model, tools=web.tools)
            report = await agent.run("compute")
        with pytest.raises(MCPServerError, match="MCP server 'web' could not be reached"):
            async with MCPTools.http(http_server.url, name="web").connect():  # no token: 401
                pass
    assert agent.state is not None
    add, explode, stats = results(agent.state.messages)
    assert add == "42"
    assert json.loads(explode) == {
        "error": "ToolError: Error executing tool explode: exploded: remote"
    }
    assert json.loads(stats)["pid"] == http_server.process.pid
    assert (report.answer, report.tool_errors) == ("fine", 1)


async def test_an_http_server_that_dies_mid_call_is_an_error_not_a_hang(
    http_server: HTTPServer,
) -> None:
    model = ScriptedModel([call("die"), call("add", a=1, b=1), "no server"])
    server = MCPTools.http(
        http_server.url, headers={"Authorization": f"Bearer {http_server.token}"}, name="web"
    )
    with anyio.fail_after(30):
        async with server.connect() as web:
            agent = Agent("clerk", model, tools=web.tools)
            report = await agent.run("die")
    assert agent.state is not None
    die, add = (json.loads(r)["error"] for r in results(agent.state.messages))
    assert die.startswith("ServerGone: MCP server 'web' is gone (")
    assert add == die  # told at once: no second wait
    assert (report.stop.reason, report.answer) == ("answer", "no server")


async def test_a_teammate_whose_server_dies_goes_on_working(http_server: HTTPServer) -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        task = next(m.content for m in reversed(messages) if m.role == "user")
        if messages[-1].role == "user":
            return call("die") if task == "die" else call("add", a=2, b=2)
        return f"{task}: {messages[-1].content}"

    server = MCPTools.http(
        http_server.url, headers={"Authorization": f"Bearer {http_server.token}"}, name="web"
    )
    async with MemoryMailboxes() as mail:
        member = Teammate("calc", FunctionModel(brain), mcp=[server])
        with anyio.fail_after(30):
            async with Team(mail, [member]) as team:
                assert (await team.ask("calc", "add", timeout=20)).answer == "add: 4"
                died = (await team.ask("calc", "die", timeout=20)).answer or ""
                assert "ServerGone: MCP server 'web' is gone" in died
                after = (await team.ask("calc", "add", timeout=20)).answer or ""
                assert "ServerGone" in after  # told at once, and the teammate still answers
                assert team.status["calc"].state == "idle"
                assert team.status["calc"].restarts == 0
        assert http_server.process.wait(timeout=10) == 3


# -- teammates --


async def test_a_teammate_gets_a_fresh_server_for_each_incarnation() -> None:
    @tool
    def leave() -> str:
        """Exits (a bug in a tool): a crash of the incarnation."""
        raise SystemExit(3)

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        task = next(m.content for m in reversed(messages) if m.role == "user")
        if messages[-1].role == "user":
            return call("leave") if task == "crash" else call("stats")
        return messages[-1].content or ""

    async with MemoryMailboxes() as mail:
        member = Teammate(
            "calc",
            FunctionModel(brain),
            tools=[leave],
            mcp=[stdio()],
            restart=RestartPolicy(on_failure=True, backoff=0.01, task_attempts=1),
        )
        with anyio.fail_after(40):
            async with Team(mail, [member]) as team:
                first = json.loads((await team.ask("calc", "pid?", timeout=20)).answer or "")
                with pytest.raises(RemoteError, match="ToolCrashed"):
                    await team.ask("calc", "crash", timeout=20)
                second = json.loads((await team.ask("calc", "pid?", timeout=20)).answer or "")
                assert team.status["calc"].restarts == 1
                assert first["pid"] != second["pid"]
                assert not alive(first["pid"])  # the first incarnation's server was stopped
        assert not alive(second["pid"])  # and the last one's, when the team stopped


async def test_the_approval_gate_holds_mcp_tools_until_a_plan_is_approved() -> None:
    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        seen = results(messages)
        if not seen:
            return call("m_add", a=1, b=2)  # tries to act before asking
        if "needs an approved plan" in seen[-1]:
            return call("submit_plan", plan="add 1 and 2")
        if seen[-1].startswith("plan approved"):
            return call("m_add", a=1, b=2)
        return f"sum {seen[-1]}"

    plans: list[str] = []

    async def approver(member: str, plan: str) -> tuple[bool, str]:
        plans.append(plan)
        return True, ""

    async with MemoryMailboxes() as mail:
        member = Teammate(
            "calc",
            FunctionModel(brain),
            mcp=[stdio(prefix="m")],
            needs_approval=["m_add"],
        )
        with anyio.fail_after(30):
            async with Team(mail, [member], approver=approver) as team:
                result = await team.ask("calc", "add", timeout=20)
    assert (result.answer, plans) == ("sum 3", ["add 1 and 2"])


async def test_a_teammate_whose_server_cannot_start_crashes_saying_why() -> None:
    async with MemoryMailboxes() as mail:
        member = Teammate(
            "calc",
            ScriptedModel([]),
            mcp=[MCPTools.stdio("/nonexistent/mcp-server", name="nowhere")],
        )
        other = Teammate("other", ScriptedModel(["here"]))
        with anyio.fail_after(30):
            async with Team(mail, [member, other]) as team:
                assert team.status["calc"].state == "crashed"
                assert "could not be started" in team.status["calc"].last
                with pytest.raises(TeammateGone):
                    await team.ask("calc", "add", timeout=5)
                assert (await team.ask("other", "there?", timeout=5)).answer == "here"
    (crash,) = [e for e in team.notices if e.type == CRASHED]
    assert crash.body["error"].startswith("MCPServerError: MCP server 'nowhere' could not")


async def test_a_tool_name_taken_twice_is_a_crash_at_the_start() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """A local add."""
        return a + b

    async with MemoryMailboxes() as mail:
        member = Teammate("calc", ScriptedModel([]), tools=[add], mcp=[stdio()])
        with anyio.fail_after(30):
            async with Team(mail, [member]) as team:
                assert team.status["calc"].state == "crashed"
                last = team.status["calc"].last
    assert last.startswith("crashed: UsageError: calc: tool 'add' of MCP server 'arith' has the")


def test_the_mcp_sdk_is_imported_only_to_connect_and_its_absence_is_explained() -> None:
    code = (
        "import sys\n"
        "import anyio, teamrt, teamrt.agents, teamrt.team\n"
        "from teamrt.agents import MCPTools\n"
        "server = MCPTools.stdio('server', name='files')\n"
        "print(sorted(m for m in ('mcp', 'mcp_types', 'jsonschema') if m in sys.modules))\n"
        "sys.modules['mcp'] = None  # as if teamrt[mcp] were not installed\n"
        "async def connect() -> None:\n"
        "    async with server.connect():\n"
        "        pass\n"
        "try:\n"
        "    anyio.run(connect)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [
        "[]",
        "UsageError MCP server 'files': MCP tools need the mcp package (pip install 'teamrt[mcp]')",
    ]


# --- what users and models may well give ---


ONE_TOOL_SERVER = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("one", log_level="WARNING")


@server.tool(name=sys.argv[1])
def the_tool(to: str = "") -> str:
    return "from the server"


server.run()
"""


@pytest.mark.parametrize(
    ("clash", "where"),
    [
        ("send_message", "the team's tools"),
        ("request", "the team's tools"),
        ("delegate", "the team's tools"),
    ],
)
async def test_a_server_tool_named_like_a_team_tool_is_a_crash_that_says_which(
    tmp_path: Path, clash: str, where: str
) -> None:
    """A teammate's MCP tool named like one the team gives it (`send_message`, `request`,
    `delegate`, ...) is refused at the start as one named like a tool of its own is: naming
    the server, the tool, what it clashes with, and how to keep them apart."""
    pytest.importorskip("mcp")
    script = tmp_path / "one_tool.py"
    script.write_text(ONE_TOOL_SERVER)
    server = MCPTools.stdio(sys.executable, [str(script), clash], name="one")
    member = Teammate("calc", ScriptedModel([]), mcp=[server], delegate=clash == "delegate")
    async with MemoryMailboxes() as mail:
        with anyio.fail_after(30):
            async with Team(mail, [member]) as team:
                assert team.status["calc"].state == "crashed"
                last = team.status["calc"].last
    assert last.startswith(
        f"crashed: UsageError: calc: tool {clash!r} of MCP server 'one' has the name of a tool "
        f"in {where}; give the server a prefix="
    )
