"""A teammate's agent, equipped: its own tools, its MCP servers' tools, the team's tools
(messaging, `delegate`, `submit_plan`) and the agent built over them, once per incarnation."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from teamrt.agents.delegate import delegate_tool
from teamrt.agents.loop import Agent, Inbound
from teamrt.agents.messaging import messaging_tools
from teamrt.agents.tools import Tool
from teamrt.errors import UsageError
from teamrt.models.base import Usage
from teamrt.team.config import Teammate
from teamrt.team.context import TeamContext
from teamrt.team.desk import Desk
from teamrt.team.plans import PlanGate, tool_name


def team_tools(context: TeamContext, name: str, desk: Desk) -> list[Tool]:
    """The messaging tools of teammate `name`, its mail read from `desk`."""
    return messaging_tools(
        context.mail, name, desk=desk, resolve=context.pick, waiting=context.waiting
    )


def team_tool_names(teammate: Teammate, messaging: list[Tool]) -> list[str]:
    """The names of the tools the team gives the teammate beside its own: messaging, and
    `delegate` and `submit_plan` when it has them."""
    names = [t.name for t in messaging]
    if teammate.delegate:
        names.append("delegate")
    if teammate.needs_approval:
        names.append("submit_plan")
    return names


async def mcp_tools(
    stack: contextlib.AsyncExitStack, teammate: Teammate, team_names: list[str]
) -> list[Tool]:
    """Connect the teammate's MCP servers (each held by a task of its own, closed with
    `stack`) and give their tools. A server that cannot connect, or a tool name that two tools
    would share, raises (a crash of the incarnation at its start)."""
    names = {tool_name(t): "its own tools" for t in teammate.tools}
    for name in team_names:
        names.setdefault(name, "the team's tools")
    found_tools: list[Tool] = []
    for server in teammate.mcp:
        connection = await stack.enter_async_context(server.connect())
        for found in connection.tools:
            if found.name in names:
                raise UsageError(
                    f"{teammate.name}: tool {found.name!r} of MCP server {server.label!r} "
                    f"has the name of a tool in {names[found.name]}; give the server "
                    "a prefix= (or leave it out with deny=)"
                )
            names[found.name] = f"MCP server {server.label!r}"
            found_tools.append(found)
    return found_tools


def build_agent(
    context: TeamContext,
    teammate: Teammate,
    *,
    tools: list[Tool | Callable[..., Any]],
    messaging: list[Tool],
    plans: PlanGate,
    journal: Path | None,
    transcript: Path | None,
    inbound: Inbound,
    on_spend: Callable[[Usage, float | None], None],
) -> Agent:
    """The teammate's agent over its own `tools` (gated by `plans` when it needs approval),
    the team's `messaging` tools, and `delegate` and `submit_plan` when it has them."""
    model = teammate.make_model()
    own = tools
    if teammate.needs_approval:
        own = plans.gate(own)  # for the teammate and for any sub-agent it delegates to
    every: list[Tool | Callable[..., Any]] = [*own, *messaging]
    if teammate.delegate:
        every.append(
            delegate_tool(
                teammate.make_model,
                tools=own,
                limits=teammate.limits,
                budget=context.budget,
                prices={**context.prices, **(teammate.prices or {})},
                owner=teammate.name,
                on_spend=on_spend,
            )
        )
    if teammate.needs_approval:
        every.append(plans.tool())
    return Agent(
        teammate.name,
        model,
        instructions=teammate.instructions,
        tools=every,
        limits=teammate.limits,
        memory=teammate.memory,
        prices={**context.prices, **(teammate.prices or {})},
        budget=context.budget,
        checkpoint=journal,
        transcript=transcript,
        inbound=inbound,
        keep_context=teammate.context == "persistent",
    )
