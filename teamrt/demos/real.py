"""What the demos share when they run on a real model: the choice, the check before a run, the
models, and the stop reports printed after it.

A demo checks its environment before it starts a team (`check_environment`: the variables, the
price table, and that the server's port answers), so a missing variable or an unreachable server
is one line, not a traceback from inside a teammate. The choice of model reaches child processes
through `MODEL_VARIABLE`, which the demos' specs read. Nothing here sends a model request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio

from teamrt.agents.journal import summarise
from teamrt.agents.limits import prices_from_env
from teamrt.errors import DemoFailed as DemoFailed
from teamrt.errors import UsageError
from teamrt.mail import open_store
from teamrt.models import FunctionModel, Model, model_requests_allowed
from teamrt.replay import timeline
from teamrt.team import RESULT, TaskResult
from teamrt.teamdir import AgentDir, TeamDir

Choice = Literal["offline", "openai"]
CHOICES: tuple[Choice, ...] = ("offline", "openai")

#: How a demo tells its child processes (`teamrt run-agent --spec ...`) which model to use.
MODEL_VARIABLE = "TEAMRT_DEMO_MODEL"

#: Seconds the check before a run waits for the server's port to accept a connection.
PROBE_TIMEOUT = 10.0

_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def choice_from_env() -> Choice:
    """The model a demo's spec uses in a child process (offline unless the lead said so)."""
    value = os.environ.get(MODEL_VARIABLE, "offline").strip() or "offline"
    if value not in CHOICES:
        raise UsageError(f"{MODEL_VARIABLE} must be one of {', '.join(CHOICES)}, not {value!r}")
    return value


def make_model(choice: str, brain: Callable[..., Any], name: str) -> Model:
    """The model of one teammate: an `OpenAIModel` from the environment, or `brain` offline."""
    if choice == "openai":
        from teamrt.models import OpenAIModel

        return OpenAIModel()
    return FunctionModel(brain, name=name)


def prices() -> dict[str, tuple[float, float]]:
    """The demos' price table: TEAMRT_PRICES (model -> [input, output] USD per million)."""
    return prices_from_env()


async def check_environment(choice: str) -> None:
    """Raise if a demo on `choice` cannot start, in one line: `UsageError` for a missing
    variable, a malformed price table or model requests switched off (`check_variables`),
    `DemoFailed` for a server that cannot be reached (`probe`)."""
    check_variables(choice)
    if choice == "openai":
        await probe(os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")


def check_variables(choice: str) -> None:
    """Raise `UsageError` (one line) if the environment cannot run a demo on `choice`."""
    if choice not in CHOICES:
        raise UsageError(f"unknown model {choice!r}: pick one of {', '.join(CHOICES)}")
    prices()  # a malformed TEAMRT_PRICES raises here, before anything starts
    if choice == "offline":
        return
    if not os.environ.get("OPENAI_MODEL"):
        raise UsageError(
            "--model openai needs OPENAI_MODEL, the model's name (e.g. gpt-4.1-mini, or "
            "llama3.1:8b on a local Ollama)"
        )
    if not os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
        raise UsageError(
            "--model openai needs OPENAI_API_KEY (or, for a local server that needs no key, "
            "OPENAI_BASE_URL alone, e.g. http://localhost:11434/v1)"
        )
    if not model_requests_allowed():
        raise UsageError(
            "real model requests are switched off here (TEAMRT_ALLOW_MODEL_REQUESTS=0)"
        )


async def probe(base_url: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Connect to the server's port and hang up (no HTTP request is sent): an unreachable
    server is one line now, not a model error after a run of retries. Skipped behind a proxy,
    which is what the client would connect to."""
    if any(os.environ.get(v) for v in _PROXIES):
        return
    parts = urlsplit(base_url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise UsageError(f"OPENAI_BASE_URL={base_url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with anyio.fail_after(timeout):
            stream = await anyio.connect_tcp(host, port)
    except TimeoutError:
        raise DemoFailed(
            f"cannot reach the model server at {base_url}: no connection within {timeout:g}s"
        ) from None
    except OSError as exc:
        raise DemoFailed(
            f"cannot reach the model server at {base_url}: {_reason(exc)} (is it running, and is "
            "OPENAI_BASE_URL right?)"
        ) from None
    await stream.aclose()


def _reason(exc: BaseException) -> str:
    """What refused the connection: anyio says "All connection attempts failed" and keeps each
    attempt's error as the cause (a group of them when the name had several addresses)."""
    cause = exc.__cause__
    while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
        cause = cause.exceptions[0]
    if isinstance(cause, OSError):
        exc = cause
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0:
        return os.strerror(exc.errno)  # asyncio words a refusal "Connect call failed (...)"
    if isinstance(exc, OSError) and exc.strerror:  # a name that did not resolve
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- after the run ------------------------------------------------------------------------------


def results(team: str | Path) -> dict[str, list[TaskResult]]:
    """Every task result each member sent, read back from the team's inboxes (a team
    directory or a store URL)."""
    found: dict[str, list[TaskResult]] = {}
    for event in timeline(team):
        if event.type == RESULT and isinstance(event.body, dict):
            try:
                result = TaskResult.model_validate(event.body)
            except ValueError:
                continue
            found.setdefault(event.sender, []).append(result)
    return found


def report_line(result: TaskResult) -> str:
    cost = "cost unknown" if result.cost is None else f"${result.cost:.4f}"
    detail = " ".join(result.detail.split())
    detail = detail if len(detail) <= 160 else detail[:157] + "..."
    return (
        f"{result.stop_reason} ({result.steps} steps, {result.tool_calls} tool calls, "
        f"{result.tokens} tokens, {cost}): {detail}"
    )


def print_reports(
    team: str | Path, members: Iterable[str], agent_dir: Path | None = None
) -> dict[str, list[TaskResult]]:
    """Print every member's stop reports (one per task); a member without one says why (its
    journal's last run in `agent_dir`, by default the team directory's agents/, or that it was
    never given a task). Returns what it printed."""
    found = results(team)
    agents = AgentDir(agent_dir) if agent_dir is not None else TeamDir.at(team).agents
    print("Stop reports:")
    for member in members:
        reports = found.get(member, [])
        for result in reports:
            print(f"  {member:12} {report_line(result)}")
        if reports:
            continue
        journal = agents.journal(member)
        last = summarise(journal) if journal.exists() else None
        if last is None:
            print(f"  {member:12} never given a task")
        else:
            print(f"  {member:12} no task result: {last['stop_reason']} {last['detail']}".rstrip())
    return found


def first_failure(found: dict[str, list[TaskResult]], order: Sequence[str]) -> str | None:
    """The first member (in `order`) whose task stopped other than with an answer, in a line."""
    for member in order:
        for result in found.get(member, []):
            if result.stop_reason != "answer":
                detail = " ".join(result.detail.split())
                return f"{member} stopped early ({result.stop_reason}): {detail}"
    return None


async def fresh_team(store: str) -> None:
    """Delete a demo's team in a network store (its inboxes from an earlier run)."""
    await open_store(store).destroy()


def fail(message: str) -> int:
    """Print the one-line error a demo ends with; the exit code of a run that stopped early."""
    print(f"teamrt demo: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return 1
