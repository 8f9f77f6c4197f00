"""Telemetry around the agent's driver: a span for a run, a model call, a tool call.

Each wrapper takes the awaitable it traces and opens its span (see `teamrt.telemetry`)
around it, with the GenAI semantic conventions' attributes; the driver calls one only when
telemetry is on (a run's span is always made: with telemetry off it is nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable

from teamrt import telemetry
from teamrt.agents.state import RunReport
from teamrt.agents.tools import ToolResult
from teamrt.models.base import ModelReply, ToolCall


async def invoke_agent(agent: str, task_id: str | None, run: Awaitable[RunReport]) -> RunReport:
    """`run`, one agent run, in an `invoke_agent <agent>` span."""
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        "teamrt.task.id": task_id,
    }
    with telemetry.span(f"invoke_agent {agent}", attributes) as span:
        report = await run
        telemetry.annotate(
            span,
            teamrt__stop__reason=report.stop.reason,
            gen_ai__usage__input_tokens=report.usage.input_tokens,
            gen_ai__usage__output_tokens=report.usage.output_tokens,
        )
        return report


async def chat(model: str, call: Awaitable[ModelReply]) -> ModelReply:
    """`call`, one model call, in a `chat <model>` span."""
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    with telemetry.span(f"chat {model}", attributes) as span:
        reply = await call
        telemetry.annotate(
            span,
            gen_ai__response__model=reply.model or None,
            gen_ai__usage__input_tokens=reply.usage.input_tokens,
            gen_ai__usage__output_tokens=reply.usage.output_tokens,
            gen_ai__response__finish_reasons=[reply.finish_reason or "stop"],
            teamrt__attempts=reply.attempts,
        )
        return reply


async def execute_tool(call: ToolCall, run: Awaitable[ToolResult]) -> ToolResult:
    """`run`, one tool call, in an `execute_tool <tool>` span."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
    }
    with telemetry.span(f"execute_tool {call.name}", attributes) as span:
        result = await run
        telemetry.annotate(span, teamrt__tool__ok=result.ok)
        return result
