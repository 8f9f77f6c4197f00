"""Typed teammates for `teamrt run-agent --spec typed_specs:NAME` and `teamrt rerun --spec
tests.support.typed_specs:NAME` in tests/agents/test_typed_answers.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from teamrt.agents import FINAL_TOOL, tool
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, call
from teamrt.team import Teammate


class Invoice(BaseModel):
    """An invoice for one customer."""

    customer: str
    total: int = Field(ge=0)
    note: str | None = None


@tool
def lookup(customer: str) -> dict[str, int]:
    """What a customer owes."""
    return {"owed": {"ACME": 12}[customer]}


Brain = Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], ModelReply | str]


def clerk_brain(structured: bool) -> Brain:
    """A clerk that looks the amount up, answers it wrong once per task, then right; mail is
    answered with a note. Decided by the conversation alone, so a rerun gets the same."""

    def answer(total: int) -> ModelReply | str:
        if structured:
            return json.dumps({"customer": "ACME", "total": total})
        return call(FINAL_TOOL, customer="ACME", total=total)

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
        last = messages[-1]
        if last.role == "user" and (last.content or "").startswith("Bill"):
            return call("lookup", customer="ACME")
        if last.role == "tool" and last.name == "lookup":
            return answer(-1)
        if (last.role == "tool" and last.name == FINAL_TOOL) or "does not match" in (
            last.content or ""
        ):
            return answer(12)
        return "noted"

    return brain


def typed_clerk() -> Teammate:
    """A typed teammate that answers through the final-answer tool."""
    return Teammate("clerk", FunctionModel(clerk_brain(False)), tools=[lookup], output_type=Invoice)


def typed_clerk_structured() -> Teammate:
    """The same through structured output."""
    model = FunctionModel(clerk_brain(True), structured_output=True)
    return Teammate("clerk", model, tools=[lookup], output_type=Invoice)


#: the same as member "w", for `teamrt run-agent` (tests/support/remote.py names its child "w")
remote_clerk = Teammate("w", FunctionModel(clerk_brain(False)), tools=[lookup], output_type=Invoice)
