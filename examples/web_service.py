"""A team in a web service: a Starlette app whose lifespan runs a team, and an endpoint that
asks it. A client that hangs up before its answer withdraws its task.

Serve it: uvicorn examples.web_service:app   (pip install 'teamrt[service]')
          curl -X POST localhost:8000/ask -d '{"question": "How many earbuds?"}'
Run it as a program and it asks itself once, in-process: python examples/web_service.py
"""

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from teamrt import (
    ChatMessage,
    FunctionModel,
    MemoryMailboxes,
    ModelReply,
    Team,
    Teammate,
    ToolSpec,
    call,
    tool,
)
from teamrt.errors import TeamrtError


@tool
def check_stock(sku: str) -> dict[str, int]:
    """How many of a SKU are in stock."""
    return {"quantity": {"EARBUDS": 14, "CABLE": 0}.get(sku, 0)}


def clerk_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """An offline model as a function: check the stock, then answer from the tool's result."""
    if messages[-1].role == "tool":
        return f"In stock: {messages[-1].content}"
    return call("check_stock", sku="EARBUDS")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # the team lives as long as the server: started before the first request, stopped after
    # the last; a pool of three clerks serves requests side by side
    clerks = Teammate("clerk", lambda: FunctionModel(clerk_model), tools=[check_stock], replicas=3)
    async with MemoryMailboxes() as mail, Team(mail, [clerks]) as team:
        app.state.team = team
        yield


async def ask(request: Request) -> JSONResponse:
    question = (await request.json())["question"]
    try:
        result = await request.app.state.team.ask("clerk", question, timeout=60)
    except TeamrtError as exc:
        return JSONResponse({"error": str(exc)}, status_code=503)
    return JSONResponse({"answer": result.answer, "stop_reason": result.stop_reason})


app = Starlette(routes=[Route("/ask", ask, methods=["POST"])], lifespan=lifespan)


async def main() -> None:
    async with app.router.lifespan_context(app):  # what uvicorn does at start and stop
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            response = await client.post("/ask", json={"question": "How many earbuds?"})
    print(response.status_code, response.json())


if __name__ == "__main__":
    anyio.run(main)
