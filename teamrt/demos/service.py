"""A team inside a web service: a Starlette app whose lifespan starts the researcher/writer
team, with an endpoint that gives the researcher a task and returns its result.

    uvicorn teamrt.demos.service:app          (pip install 'teamrt[service]' uvicorn)
    curl -X POST localhost:8000/ask -d '{"question": "..."}'

The team runs in the server's event loop, on file mailboxes under `TEAMRT_SERVICE_DIR`
(default `mailboxes/service`), and is shut down cleanly when the server stops. Each role is a pool
of `TEAMRT_SERVICE_REPLICAS` teammates (default 2): a request goes to the least busy researcher,
whose request to "writer" goes to the least busy writer. `POST /ask/stream` answers the same as
Server-Sent Events: `progress` events while the team works, then the `result`. A full queue
answers 503 at once, a request whose deadline passed before anyone could start it answers 504,
never worked on. A task that stopped without an answer (a model error, a limit) answers 502 with
its stop report and an `error` line. A client that disconnects before its answer withdraws its
task (a queued one never runs, a running one stops at its next step), so a burst of abandoned
requests costs no work once the queue drains. `TEAMRT_SERVICE_MODEL=openai` runs the team on
`OpenAIModel` (see `teamrt.demos.real`). `create_app()` builds the same app around any
teammates (the benchmark uses it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from teamrt.demos import real
from teamrt.demos.research_writer import TASK, teammates
from teamrt.errors import RemoteError, RequestTimeout, TeamrtError
from teamrt.mail import open_mailboxes
from teamrt.team import BUSY, EXPIRED, TaskResult, Team, Teammate
from teamrt.teamdir import TeamDir

T = TypeVar("T")
#: The status of an answer nobody receives (the client closed the connection), as nginx logs it.
CLIENT_GONE = 499


async def until_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """`work()`, cancelled if the client disconnects first (then None): a cancelled ask
    withdraws its task. The request's body must have been read."""
    done: list[T] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass  # (nothing else comes once the body is read)
            tg.cancel_scope.cancel()

        async def run() -> None:
            done.append(await work())
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    return done[0] if done else None


def create_app(
    make_teammates: Callable[[], Sequence[Teammate]],
    *,
    directory: Callable[[], Path],
    role: str = "researcher",
    store: Callable[[], str | None] = lambda: None,
) -> Starlette:
    """An app that asks `role` of a team of `make_teammates()`, run in its lifespan on file
    mailboxes in `directory()`, or in the store `store()` names (a URL) with the agents'
    journals in `directory()` (each called at start-up)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        root = directory()
        where = store() or str(root / "team")
        async with (
            open_mailboxes(where, members=["lead"]) as mail,
            Team(mail, make_teammates(), agent_dir=TeamDir(root / "team").agents.path) as team,
        ):
            app.state.team = team
            yield
        app.state.team = None

    async def ask(request: Request) -> JSONResponse:
        try:
            payload = await request.json()
        except ValueError:
            return JSONResponse({"error": "send a JSON object"}, status_code=400)
        question = payload.get("question", TASK) if isinstance(payload, dict) else None
        if not isinstance(question, str) or not question.strip():
            return JSONResponse({"error": "'question' must be a non-empty string"}, status_code=400)
        team: Team = request.app.state.team
        try:
            timeout = float(payload.get("timeout", 60))
            result = await until_disconnected(
                request, lambda: team.ask(role, question, timeout=timeout)
            )
        except (TypeError, ValueError):
            return JSONResponse({"error": "'timeout' must be a number"}, status_code=400)
        except RequestTimeout as exc:
            return JSONResponse({"error": str(exc)}, status_code=504)
        except RemoteError as exc:
            status = {BUSY: 503, EXPIRED: 504}.get(exc.error_type, 502)
            return JSONResponse({"error": str(exc)}, status_code=status)
        if result is None:  # the client left: its task is withdrawn, and nobody reads this
            return JSONResponse({"error": "the client disconnected"}, status_code=CLIENT_GONE)
        if result.stop_reason != "answer":
            error = f"{role} stopped early ({result.stop_reason}): {result.detail}"
            return JSONResponse({**result.model_dump(), "error": error}, status_code=502)
        return JSONResponse(result.model_dump())

    async def ask_stream(request: Request) -> Response:
        """The same task as /ask, as Server-Sent Events while it happens: `progress` events
        (text as the model writes it, tool calls and results), then one `result` event (or one
        `error` event). A client that disconnects withdraws the task: Starlette cancels the
        stream when the server reports the disconnect, which leaves `team.stream`."""
        try:
            payload = await request.json()
        except ValueError:
            return JSONResponse({"error": "send a JSON object"}, status_code=400)
        question = payload.get("question", TASK) if isinstance(payload, dict) else None
        if not isinstance(question, str) or not question.strip():
            return JSONResponse({"error": "'question' must be a non-empty string"}, status_code=400)
        try:
            timeout = float(payload.get("timeout", 60))
        except (TypeError, ValueError):
            return JSONResponse({"error": "'timeout' must be a number"}, status_code=400)
        team: Team = request.app.state.team

        async def events() -> AsyncIterator[str]:
            try:
                async with team.stream(role, question, timeout=timeout) as stream:
                    async for event in stream:
                        kind = "result" if isinstance(event, TaskResult) else "progress"
                        yield f"event: {kind}\ndata: {event.model_dump_json()}\n\n"
            except TeamrtError as exc:
                yield f"event: error\ndata: {json.dumps({'error': str(exc)})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def status(request: Request) -> JSONResponse:
        team: Team = request.app.state.team
        return JSONResponse(
            {
                name: {"state": s.state, "tasks_done": s.tasks_done, "queued": s.queued}
                for name, s in team.status.items()
            }
        )

    return Starlette(
        routes=[
            Route("/ask", ask, methods=["POST"]),
            Route("/ask/stream", ask_stream, methods=["POST"]),
            Route("/status", status),
        ],
        lifespan=lifespan,
    )


def demo_team(model: str | None = None) -> list[Teammate]:
    """The researcher/writer team, each role a pool of TEAMRT_SERVICE_REPLICAS, on `model`
    (default: TEAMRT_SERVICE_MODEL, else offline)."""
    replicas = int(os.environ.get("TEAMRT_SERVICE_REPLICAS", "2"))
    model = model or os.environ.get("TEAMRT_SERVICE_MODEL", "offline")
    real.check_variables(model)  # at start-up, not in each teammate's first call
    return [dataclasses.replace(t, replicas=replicas) for t in teammates(model)]


def service_dir() -> Path:
    return Path(os.environ.get("TEAMRT_SERVICE_DIR", "mailboxes/service"))


app = create_app(demo_team, directory=service_dir, store=lambda: os.environ.get("TEAMRT_STORE"))
