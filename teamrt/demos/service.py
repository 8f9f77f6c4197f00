"""A team inside a web service: a Starlette app whose lifespan starts the researcher/writer
team, with an endpoint that gives the researcher a task and returns its result.

    uvicorn teamrt.demos.service:app          (pip install 'teamrt[service]' uvicorn)
    curl -X POST localhost:8000/ask -d '{"question": "..."}'

The team runs in the server's event loop, on file mailboxes under `TEAMRT_SERVICE_DIR`
(default `mailboxes/service`), and is shut down cleanly when the server stops.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from teamrt.demos.research_writer import TASK, teammates
from teamrt.errors import RemoteError, RequestTimeout
from teamrt.mail import FileMailboxes
from teamrt.team import Team


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    root = Path(os.environ.get("TEAMRT_SERVICE_DIR", "mailboxes/service"))
    async with (
        FileMailboxes(root / "team", members=["lead"]) as mail,
        Team(
            mail,
            teammates(os.environ.get("TEAMRT_SERVICE_MODEL", "offline")),
            agent_dir=root / "team" / "agents",
        ) as team,
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
        result = await team.ask("researcher", question, timeout=float(payload.get("timeout", 60)))
    except RequestTimeout as exc:
        return JSONResponse({"error": str(exc)}, status_code=504)
    except RemoteError as exc:
        return JSONResponse({"error": str(exc)}, status_code=502)
    return JSONResponse(result.model_dump())


async def status(request: Request) -> JSONResponse:
    team: Team = request.app.state.team
    return JSONResponse(
        {name: {"state": s.state, "tasks_done": s.tasks_done} for name, s in team.status.items()}
    )


app = Starlette(
    routes=[Route("/ask", ask, methods=["POST"]), Route("/status", status)], lifespan=lifespan
)
