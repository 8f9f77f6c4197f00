"""Messaging tools: two agents with their own loops, linked only by their mailboxes."""

from __future__ import annotations

import json
from collections.abc import Sequence

import anyio

from teamrt.agents import Agent, messaging_tools
from teamrt.mail import MemoryMailboxes
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ScriptedModel, ToolSpec, call


def writer_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    """Wait for a request, answer it, then finish."""
    last = messages[-1]
    if last.role == "user":
        return call("wait_for_messages", timeout=5)
    if not (last.content or "").startswith("{"):
        return "replied"  # the reply tool said so
    result = json.loads(last.content or "{}")
    if "messages" in result:
        request = result["messages"][0]
        return call("reply", request_id=request["id"], text=request["body"].upper())
    return "replied"


async def test_request_and_reply_between_two_agents() -> None:
    async with MemoryMailboxes(members=["lead", "writer", "critic"]) as mail:
        lead_model = ScriptedModel(
            [
                call("request", to="writer", text="draft the intro", timeout=5),
                call("broadcast", text="intro drafted"),
                "The writer answered: DRAFT THE INTRO",
            ]
        )
        lead = Agent("lead", lead_model, tools=messaging_tools(mail, "lead"))
        writer = Agent("writer", FunctionModel(writer_model), tools=messaging_tools(mail, "writer"))
        reports = {}

        async def run(agent: Agent, task: str) -> None:
            reports[agent.name] = await agent.run(task)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, writer, "Serve one request.")
            tg.start_soon(run, lead, "Get the intro drafted.")

        assert reports["lead"].ok and reports["writer"].ok
        answer = json.loads(lead_model.calls[1][-1].content or "{}")
        assert answer == {"from": "writer", "answer": "DRAFT THE INTRO"}
        critic = await mail.inbox("critic").receive(timeout=1)
        assert (critic.kind, critic.body) == ("broadcast", "intro drafted")


async def test_waiting_on_an_empty_inbox_and_bad_replies() -> None:
    async with MemoryMailboxes(members=["lead", "writer"]) as mail:
        model = ScriptedModel(
            [
                call("wait_for_messages", timeout=0.05),
                call("reply", request_id="nope", text="x"),
                call("send_message", to="ghost", text="boo"),
                call("send_message", to="writer", text="hello"),
                "done",
            ]
        )
        report = await Agent("lead", model, tools=messaging_tools(mail, "lead")).run("try")
        assert report.ok
        results = [m.content or "" for m in model.calls[-1] if m.role == "tool"]
        assert json.loads(results[0]) == {"nothing_arrived": "no message arrived within 0.05s"}
        assert "no open request with id 'nope'" in results[1]
        assert "UnknownRecipient" in results[2]
        assert results[3].startswith("sent message ")
        assert (await mail.inbox("writer").receive(timeout=1)).body == "hello"
