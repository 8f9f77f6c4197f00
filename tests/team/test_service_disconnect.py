"""The service demo under a real server (uvicorn on 127.0.0.1): a client that disconnects
withdraws its task, on `/ask` and `/ask/stream`: a queued task is dropped (it never reaches the
model), a running one is stopped in its tool, and the team is free for the next request; on
file mailboxes and on Redis."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn

from teamrt.demos.service import create_app
from teamrt.team import Team
from tests.support.redis_server import RedisServer, needs_redis, shared_redis
from tests.team.helpers import Worker, cancelled_answers, until

__all__ = ["shared_redis"]  # the fixture


@pytest.fixture(params=["files", pytest.param("redis", marks=needs_redis)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    """The app's store: None (file mailboxes in its directory), or a team on Redis."""
    if request.param == "files":
        return None
    server: RedisServer = request.getfixturevalue("shared_redis")
    return server.url(f"service-{tmp_path.name}"[:60].replace(".", "-"))


@asynccontextmanager
async def served(
    worker: Worker, tmp_path: Path, store: str | None
) -> AsyncIterator[tuple[httpx.AsyncClient, Team]]:
    """The app around `worker` (role "w"), served by uvicorn on a free port of 127.0.0.1."""
    app = create_app(
        lambda: [worker.teammate], directory=lambda: tmp_path, role="w", store=lambda: store
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: server.serve(sockets=[sock]))
            await until(lambda: server.started)
            try:
                url = f"http://127.0.0.1:{port}"
                async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                    yield client, app.state.team
            finally:
                server.should_exit = True


async def test_a_disconnected_clients_task_is_withdrawn_on_ask(
    tmp_path: Path, store: str | None
) -> None:
    worker = Worker()
    async with served(worker, tmp_path, store) as (client, team):
        async with anyio.create_task_group() as clients:
            clients.start_soon(lambda: client.post("/ask", json={"question": "hold"}))
            await worker.holding.wait()  # the first request's task runs, in its tool
            clients.start_soon(lambda: client.post("/ask", json={"question": "queued"}))
            await until(lambda: team.status["w"].queued == 1)
            clients.cancel_scope.cancel()  # both clients hang up
        # the queued one is dropped, the running one stopped in its tool (the gate stays shut)
        await until(lambda: len(cancelled_answers(team)) == 2)
        response = await client.post("/ask", json={"question": "next"})
        assert response.status_code == 200 and response.json()["answer"] == "done: next"
    assert worker.calls == ["hold", "next"]
    # the queued task never reached the model: dropped, or (when the running one's hang-up was
    # seen first) stopped at the boundary before its first step
    steps = sorted((r.steps, r.detail) for r in cancelled_answers(team))
    assert steps[0][0] == 0 and steps[1][0] == 1 and "cut short" in steps[1][1]


async def test_a_disconnected_clients_task_is_withdrawn_on_ask_stream(
    tmp_path: Path, store: str | None
) -> None:
    worker = Worker()
    async with served(worker, tmp_path, store) as (client, team):
        async with client.stream("POST", "/ask/stream", json={"question": "hold"}) as events:
            async for line in events.aiter_lines():
                if line == "event: progress":  # the tool call: the task runs
                    break
        await until(lambda: len(cancelled_answers(team)) == 1)  # its tool is cut short
        response = await client.post("/ask", json={"question": "next"})
        assert response.json()["answer"] == "done: next"
    assert worker.calls == ["hold", "next"]
    [stopped] = cancelled_answers(team)
    assert stopped.steps == 1 and "cut short" in stopped.detail
