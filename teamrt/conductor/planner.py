"""Plans from a planner model: the prompt, and one repair attempt when the answer is invalid."""

from __future__ import annotations

from teamrt.conductor.plan import Plan, PlanError
from teamrt.models.base import ChatMessage, Model

PLAN_PROMPT = """You are a planner. Break the goal into subtasks that each fit one worker.
Every subtask MUST have a check: a command whose exit code is 0 when it is done.
Answer with JSON only: {"subtasks": [{"id": "short-id", "description": "...",
"check": "command", "depends_on": ["other-id"]}], "integration_check": "command or null",
"acceptance_check": "command"}"""


async def make_plan(planner: Model, goal: str, failure: str | None = None) -> Plan:
    """A plan for `goal` (after `failure`, the acceptance check's output, when replanning);
    raises `PlanError` when the second answer is still invalid."""
    messages = [ChatMessage.system(PLAN_PROMPT), ChatMessage.user(f"GOAL: {goal}")]
    if failure:
        messages.append(
            ChatMessage.user(
                f"The last plan was completed but the acceptance check failed:\n{failure[-2000:]}"
            )
        )
    for attempt in range(2):
        reply = await planner.complete(messages, [])
        try:
            return Plan.parse(reply.text or "")
        except PlanError as exc:
            if attempt == 1:
                raise
            messages += [
                ChatMessage(role="assistant", content=reply.text),
                ChatMessage.user(
                    f"That plan is invalid: {exc}. Answer again with valid JSON only."
                ),
            ]
    raise AssertionError("unreachable")  # pragma: no cover
