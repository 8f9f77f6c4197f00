"""Plan approval: a teammate whose side-effecting tools wait for the lead to approve a plan
for the task it is on (`Teammate(needs_approval=...)`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from teamrt.agents.state import AgentState
from teamrt.agents.tools import Tool, tool
from teamrt.envelopes import Envelope
from teamrt.mail.mailboxes import Mailboxes
from teamrt.team.protocol import PLAN_APPROVAL, DecisionBody, PlanBody

PLAN_VERDICT = "plan "  # submit_plan's result starts "plan approved" or "plan rejected"


class PlanGate:
    """Whether the task in progress has an approved plan, the gate on the tools that need one,
    and the `submit_plan` tool that asks the lead."""

    __slots__ = ("approved", "gated", "lead", "mail", "name", "task")

    def __init__(
        self, mail: Mailboxes, name: str, lead: str, gated: Iterable[str], task: Callable[[], str]
    ) -> None:
        self.mail, self.name, self.lead = mail, name, lead
        self.gated = set(gated)  # the names of the tools that wait for an approved plan
        self.task = task  # the id of the task in progress ("" for none)
        self.approved = False

    def gate(self, tools: list[Tool | Callable[..., Any]]) -> list[Tool | Callable[..., Any]]:
        """Block the side-effecting tools until the lead approves a plan for this task."""

        def guard(inner: Tool) -> Tool:
            def refusal() -> str | None:
                if self.approved:
                    return None
                return f"{inner.name} needs an approved plan: call submit_plan first"

            return dataclasses.replace(inner, gate=refusal)

        return [
            guard(t if isinstance(t, Tool) else tool(t)) if tool_name(t) in self.gated else t
            for t in tools
        ]

    def tool(self) -> Tool:
        """The `submit_plan` tool."""
        return tool(name="submit_plan", sequential=True)(self.submit_plan)

    async def submit_plan(self, plan: str) -> str:
        """Send your plan to the lead for approval; side-effecting tools wait for it."""
        decision = await self.mail.request(
            Envelope.request(
                self.name,
                self.lead,
                PlanBody(plan=plan, task=self.task()),
                type=PLAN_APPROVAL,
                timeout=300,
            )
        )
        body = DecisionBody.model_validate(decision.body)
        self.approved = body.approved
        return f"{PLAN_VERDICT}{'approved' if body.approved else 'rejected'}" + (
            f": {body.feedback}" if body.feedback else ""
        )


def plan_approved(state: AgentState) -> bool:
    """Whether the current task's conversation holds an approved plan (the last verdict)."""
    start = state.task_index if state.task_index is not None else len(state.messages)
    messages = list(state.messages[start:])
    if state.open_step is not None:
        messages.extend(state.open_step.results.values())
    approved = False
    for message in messages:
        if message.role == "tool" and message.name == "submit_plan":
            approved = (message.content or "").startswith(f"{PLAN_VERDICT}approved")
    return approved


def tool_name(item: Tool | Callable[..., Any]) -> str:
    """The name a tool (or a function made into one) goes by."""
    return item.name if isinstance(item, Tool) else getattr(item, "__name__", "")
