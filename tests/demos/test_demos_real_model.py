"""Every demo with `--model openai`, over real HTTP, against a server the tests start on
127.0.0.1 whose answers come from the demos' own offline brains (tests/support/brain_server.py).

The demos run as the user runs them (`python -m teamrt demo ...`, child processes included), so
what is checked is what a user sees: every agent's stop report on standard output, and for a
run that cannot start or stopped early one line on standard error and no traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from teamrt.conductor.planner import PLAN_PROMPT
from teamrt.demos import conductor, real, research_writer
from teamrt.demos.real import DemoFailed
from teamrt.demos.research_writer import RESEARCHER, WRITER
from teamrt.errors import UsageError
from teamrt.models import (
    ChatMessage,
    ModelReply,
    OpenAIModel,
    ToolSpec,
    allow_model_requests,
    call,
)
from tests.support.brain_server import Brain, BrainServer, Refuse

RESEARCH_ROUTES = [
    (RESEARCHER, research_writer.researcher_brain),
    (WRITER, research_writer.writer_brain),
]


def demo(
    tmp_path: Path, name: str, *extra: str, **env: str | None
) -> subprocess.CompletedProcess[str]:
    """`teamrt demo NAME --model openai` in a child process, with model requests allowed there
    and `env` over the environment (None removes a variable)."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("OPENAI_") and "PROXY" not in k
    }
    environment |= {
        "TEAMRT_ALLOW_MODEL_REQUESTS": "1",
        "TEAMRT_DEMO_SCRATCH": str(tmp_path / "scratch"),
        "OPENAI_MODEL": "brain",
        # the conductor's checks are pytest runs of a tiny package: without this venv's plugins
        # each takes a fifth of the time
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    for key, value in env.items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "teamrt",
            "demo",
            name,
            "--model",
            "openai",
            "--dir",
            "boxes",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=environment,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The run's error: exactly one line on standard error, no traceback."""
    assert "Traceback" not in result.stderr + result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("teamrt demo: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def brains() -> Iterator[BrainServer]:
    with BrainServer(RESEARCH_ROUTES) as server:
        yield server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- research-writer and two-process --------------------------------------------------------


@pytest.mark.parametrize("name", ["research-writer", "two-process"])
def test_research_writer_on_a_keyless_server(
    tmp_path: Path, brains: BrainServer, name: str
) -> None:
    result = demo(tmp_path, name, OPENAI_BASE_URL=brains.url)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = (tmp_path / "scratch" / "agent-loop.md").read_text()
    for heading in ("## Limits", "## Memory", "## The loop"):
        assert heading in document
    # both agents (the writer in its own process too) asked the server, with no key sent
    assert brains.calls[RESEARCHER] == 4 and brains.calls[WRITER] == 2
    assert brains.models == {"brain"} and brains.authorization == {None}
    assert "Stop reports:" in result.stdout
    assert "  researcher   answer (4 steps, 5 tool calls" in result.stdout
    assert "  writer       answer (2 steps, 1 tool calls" in result.stdout
    assert "cost unknown" in result.stdout  # "brain" has no price
    if name == "two-process":
        assert "started the writer as process" in result.stdout
        assert "(openai model)" in result.stdout
        assert "the writer's process exited with code 0" in result.stdout


def test_prices_from_the_environment(tmp_path: Path, brains: BrainServer) -> None:
    result = demo(
        tmp_path,
        "two-process",
        OPENAI_BASE_URL=brains.url,
        OPENAI_API_KEY="sk-test",
        TEAMRT_PRICES='{"brain": [1000, 2000]}',
    )
    assert result.returncode == 0, result.stderr
    assert brains.authorization == {"Bearer sk-test"}
    costs = [ln for ln in result.stdout.splitlines() if "tokens, $" in ln]
    assert len(costs) == 2  # the researcher here, the writer in its process, both priced
    assert "cost unknown" not in result.stdout


@pytest.mark.parametrize("name", ["research-writer", "two-process"])
def test_a_refused_key_is_one_line(tmp_path: Path, name: str) -> None:
    with BrainServer(RESEARCH_ROUTES, status=401) as server:
        result = demo(tmp_path, name, OPENAI_BASE_URL=server.url, OPENAI_API_KEY="x")
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("teamrt demo: researcher stopped early (model_error): brain at")
    assert "HTTP 401: refused by the test server (401)" in line
    assert "  researcher   model_error (0 steps" in result.stdout
    assert "  writer       never given a task" in result.stdout


def test_a_model_error_in_the_writers_process(tmp_path: Path) -> None:
    def broken_writer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise Refuse(400, "this model cannot write")

    routes: list[tuple[str, Brain]] = [
        (RESEARCHER, research_writer.researcher_brain),
        (WRITER, broken_writer),
    ]
    with BrainServer(routes) as server:
        result = demo(tmp_path, "two-process", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("teamrt demo: writer stopped early (model_error)")
    assert "HTTP 400: this model cannot write" in line
    assert "  writer       model_error (0 steps" in result.stdout
    assert "The writer stopped early (model_error)" in result.stdout  # the researcher's answer
    assert not (tmp_path / "scratch" / "agent-loop.md").exists()


def test_a_model_that_answers_without_delegating(tmp_path: Path) -> None:
    with BrainServer(RESEARCH_ROUTES, mute=True) as server:
        result = demo(tmp_path, "research-writer", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    line = one_line_error(result)
    assert line == (
        "teamrt demo: the writer never wrote agent-loop.md: the researcher answered without "
        "asking the writer"
    )
    assert "researcher's answer: I looked into it." in result.stdout
    assert "  researcher   answer (1 steps, 0 tool calls" in result.stdout
    assert "  writer       never given a task" in result.stdout


def test_a_writer_that_writes_another_file(tmp_path: Path) -> None:
    """The headline of the issue: the writer did not write agent-loop.md (here it picked
    another name). The run says so in one line, after both stop reports; no traceback."""

    def wayward(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        if messages[-1].role == "tool":
            return f"Done: {messages[-1].content}"
        return call("write_file", name="loop-notes.md", content="# Notes")

    routes: list[tuple[str, Brain]] = [(RESEARCHER, research_writer.researcher_brain)]
    with BrainServer([*routes, (WRITER, wayward)]) as server:
        result = demo(tmp_path, "two-process", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    assert one_line_error(result) == (
        "teamrt demo: the writer answered but never wrote agent-loop.md (it wrote loop-notes.md)"
    )
    assert "  writer       answer (2 steps, 1 tool calls" in result.stdout


@pytest.mark.parametrize("name", ["research-writer", "two-process", "service", "conductor"])
def test_an_unreachable_server_is_one_line(tmp_path: Path, name: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = demo(tmp_path, name, OPENAI_BASE_URL=url)
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith(f"teamrt demo: cannot reach the model server at {url}: ")
    assert "refused" in line.lower()
    assert not (tmp_path / "boxes").exists()  # nothing started


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OPENAI_MODEL": None}, "--model openai needs OPENAI_MODEL"),
        ({}, "--model openai needs OPENAI_API_KEY (or, for a local server"),
        ({"TEAMRT_PRICES": "{nope"}, "TEAMRT_PRICES must be a JSON object"),
        ({"TEAMRT_ALLOW_MODEL_REQUESTS": "0"}, "real model requests are switched off"),
    ],
)
def test_a_missing_variable_is_one_line(
    tmp_path: Path, env: dict[str, str | None], says: str
) -> None:
    if "TEAMRT_ALLOW_MODEL_REQUESTS" in env:
        env = {**env, "OPENAI_API_KEY": "x"}
    result = demo(tmp_path, "two-process", **env)
    assert result.returncode == 2  # the caller's mistake
    assert says in one_line_error(result)
    assert not (tmp_path / "boxes").exists()


# --- service --------------------------------------------------------------------------------


def test_service_on_a_keyless_server(tmp_path: Path, brains: BrainServer) -> None:
    result = demo(tmp_path, "service", OPENAI_BASE_URL=brains.url)
    assert result.returncode == 0, result.stderr
    assert "200 {'answer': 'Findings sent to the writer, who reports: Done: wrote" in result.stdout
    assert brains.calls[RESEARCHER] == 4 and brains.calls[WRITER] == 2
    reports = result.stdout.split("Stop reports:")[1]
    assert reports.count("answer (") == 2 and reports.count("never given a task") == 2
    assert (tmp_path / "scratch" / "agent-loop.md").exists()


def test_service_with_a_refused_key(tmp_path: Path) -> None:
    with BrainServer(RESEARCH_ROUTES, status=401) as server:
        result = demo(tmp_path, "service", OPENAI_BASE_URL=server.url, OPENAI_API_KEY="x")
    assert result.returncode == 1
    assert "\n502 {" in result.stdout  # the app says the task stopped without an answer
    line = one_line_error(result)
    assert line.startswith("teamrt demo: researcher-")
    assert "stopped early (model_error): brain at" in line and "HTTP 401" in line


def test_service_with_a_model_that_does_not_delegate(tmp_path: Path) -> None:
    with BrainServer(RESEARCH_ROUTES, mute=True) as server:
        result = demo(tmp_path, "service", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    assert one_line_error(result) == (
        "teamrt demo: no writer wrote agent-loop.md: the researcher answered without asking "
        "a writer"
    )


# --- conductor ------------------------------------------------------------------------------

PLANNER = PLAN_PROMPT.splitlines()[0]
CONDUCTOR_ROUTES: list[tuple[str, Brain]] = [
    (PLANNER, conductor.planner_brain),
    (conductor.BUILDER, conductor.builder_brain),
]


def test_conductor_on_a_keyless_server(tmp_path: Path) -> None:
    with BrainServer(CONDUCTOR_ROUTES) as server:
        result = demo(tmp_path, "conductor", OPENAI_BASE_URL=server.url)
    assert result.returncode == 0, result.stderr
    assert "outcome: accepted" in result.stdout
    assert "conductor  plan         3 subtasks" in result.stdout
    # the planner and both builders asked the server: 4 tasks of 2 calls each (more when a
    # loaded machine makes a request time out and the client retries it, or a check fails once)
    assert server.calls[PLANNER] == 1 and server.calls[conductor.BUILDER] >= 8
    reports = result.stdout.split("Stop reports:")[1]
    assert reports.count("builder-1    answer (2 steps, 1 tool calls") >= 1
    assert reports.count("builder-2    answer (2 steps, 1 tool calls") >= 1


def test_conductor_with_a_refused_key(tmp_path: Path) -> None:
    with BrainServer(CONDUCTOR_ROUTES, status=401) as server:
        result = demo(tmp_path, "conductor", OPENAI_BASE_URL=server.url, OPENAI_API_KEY="x")
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("teamrt demo: the conductor stopped: brain at")
    assert "HTTP 401" in line
    assert "  builder-1    never given a task" in result.stdout


def test_conductor_with_a_planner_that_answers_without_a_plan(tmp_path: Path) -> None:
    with BrainServer(CONDUCTOR_ROUTES, mute=True) as server:
        result = demo(tmp_path, "conductor", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    assert one_line_error(result).startswith("teamrt demo: the conductor stopped: not a plan: ")
    assert server.calls[PLANNER] == 2  # one repair attempt


def test_conductor_with_a_builder_model_error(tmp_path: Path) -> None:
    def broken(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        raise Refuse(400, "this model cannot build")

    with BrainServer([CONDUCTOR_ROUTES[0], (conductor.BUILDER, broken)]) as server:
        result = demo(tmp_path, "conductor", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("teamrt demo: builder-")
    assert "stopped early (model_error): brain at" in line
    assert "HTTP 400: this model cannot build" in line
    assert "outcome: stopped by the demo" in result.stdout  # at the first model error
    assert result.stdout.count("model_error (0 steps") <= 2  # not round after round
    assert "ESCALATION" not in result.stderr


def test_conductor_with_builders_that_never_write(tmp_path: Path) -> None:
    def idle(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        return "I wrote it."

    with BrainServer([CONDUCTOR_ROUTES[0], (conductor.BUILDER, idle)]) as server:
        result = demo(tmp_path, "conductor", OPENAI_BASE_URL=server.url)
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith("teamrt demo: subtask ")
    assert "was escalated to a human: it failed 3 rounds (round cap 3)" in line


def test_the_exchange_demo_has_no_model(tmp_path: Path) -> None:
    result = demo(tmp_path, "exchange")
    assert result.returncode == 2
    assert "the exchange demo has no model" in one_line_error(result)


def test_demo_help_says_how_to_run_on_a_real_model(capsys: pytest.CaptureFixture[str]) -> None:
    from teamrt.cli.main import main

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needed in ("OPENAI_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL alone", "TEAMRT_PRICES"):
        assert needed in text


# --- in this process: the checks before a run, and a run -----------------------------------


@pytest.fixture
def openai_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [k for k in os.environ if k.startswith("OPENAI_") or "PROXY" in k.upper()]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OPENAI_MODEL", "brain")
    monkeypatch.delenv("TEAMRT_PRICES", raising=False)
    return monkeypatch


async def test_the_checks_before_a_run(openai_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="unknown model 'gpt'"):
        await real.check_environment("gpt")
    await real.check_environment("offline")  # needs nothing
    with pytest.raises(UsageError, match="needs OPENAI_API_KEY"):
        await real.check_environment("openai")
    openai_env.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    with allow_model_requests(), pytest.raises(DemoFailed, match="Connection refused"):
        await real.check_environment("openai")
    openai_env.setenv("OPENAI_BASE_URL", "ftp://example/v1")
    with allow_model_requests(), pytest.raises(UsageError, match="is not an http"):
        await real.check_environment("openai")
    openai_env.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # the proxy is what answers
    await real.probe(f"http://127.0.0.1:{closed_port()}/v1")
    openai_env.setenv("TEAMRT_PRICES", "[1]")
    with pytest.raises(UsageError, match="TEAMRT_PRICES must be a JSON object"):
        await real.check_environment("offline")


def test_the_spec_reads_the_model_choice(openai_env: pytest.MonkeyPatch) -> None:
    assert research_writer.writer().name == "writer"
    openai_env.setenv(real.MODEL_VARIABLE, "openai")
    assert type(research_writer.writer().make_model()).__name__ == "OpenAIModel"
    openai_env.setenv(real.MODEL_VARIABLE, "gpt")
    with pytest.raises(UsageError, match="TEAMRT_DEMO_MODEL must be one of offline, openai"):
        research_writer.researcher()


async def test_research_writer_in_this_process(
    tmp_path: Path, openai_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    openai_env.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    openai_env.setenv("TEAMRT_PRICES", '{"brain": [1000, 2000]}')
    with BrainServer(RESEARCH_ROUTES) as server, allow_model_requests():
        openai_env.setenv("OPENAI_BASE_URL", server.url)
        assert await research_writer.run(tmp_path, "openai", live=False) == 0
    out = capsys.readouterr().out
    assert out.count("answer (") == 2 and "cost unknown" not in out
    assert server.calls[RESEARCHER] == 4 and server.calls[WRITER] == 2


async def test_the_brain_server_streams_when_asked(brains: BrainServer) -> None:
    """If a demo's agents stream (someone listens), the same brains answer."""
    task = ChatMessage.user("Findings:\n- Limits: stop somewhere.")
    model = OpenAIModel("brain", base_url=brains.url)
    try:
        with allow_model_requests():
            items = [i async for i in model.stream([ChatMessage.system(WRITER), task], [])]
    finally:
        await model.aclose()
    reply = items[-1]
    assert isinstance(reply, ModelReply) and reply.tool_calls[0].name == "write_file"
    assert "## Limits" in json.loads(reply.tool_calls[0].arguments)["content"]
    assert reply.usage.input_tokens > 0


async def test_service_demo_in_this_process(
    tmp_path: Path, openai_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from teamrt.cli.demo import service_demo

    openai_env.setenv("TEAMRT_DEMO_SCRATCH", str(tmp_path / "scratch"))
    openai_env.delenv("TEAMRT_SERVICE_DIR", raising=False)
    with BrainServer(RESEARCH_ROUTES, mute=True) as server, allow_model_requests():
        openai_env.setenv("OPENAI_BASE_URL", server.url)
        assert await service_demo(tmp_path, "openai") == 1
    captured = capsys.readouterr()
    assert "no writer wrote agent-loop.md" in captured.err
    assert captured.out.count("never given a task") == 3  # both writers, one researcher
