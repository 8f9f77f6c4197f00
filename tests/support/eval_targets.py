"""Targets and judges for `teamrt eval --target tests.support.eval_targets:NAME` in the eval tests:
offline models that answer from a small table, so that each case's outcome is known."""

from __future__ import annotations

import json
from collections.abc import Sequence

from teamrt.agents import Agent, Limits
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage, call, reply
from teamrt.team import Teammate

#: What the solver answers, by a word of the question; Germany's is wrong on purpose.
ANSWERS = {
    "France": "The capital of France is Paris.",
    "Germany": "The capital of Germany is Munich.",
    "sum": "4",
    "json": '```json\n{"name": "Ada", "age": 36}\n```',
}


def _task(messages: Sequence[ChatMessage]) -> str:
    return next(m.content or "" for m in reversed(messages) if m.role == "user")


def solve(question: str) -> str:
    """The answer the table has for `question` (the first key it mentions)."""
    return next((a for key, a in ANSWERS.items() if key in question), "I do not know.")


def _solver(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    text = solve(_task(messages))
    return reply(text).model_copy(
        update={"usage": Usage(requests=1, input_tokens=10, output_tokens=5)}
    )


def agent() -> Agent:
    """A fresh solver agent (the eval calls this once per case)."""
    return Agent("solver", FunctionModel(_solver, name="solver"), prices={"solver": (1.0, 2.0)})


def better_agent() -> Agent:
    """The solver after a fix: Germany right, and the sum wrong."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        task = _task(messages)
        if "Germany" in task:
            return "The capital of Germany is Berlin."
        if "sum" in task:
            return "5"
        return solve(task)

    return Agent("solver", FunctionModel(brain))


def looping_agent() -> Agent:
    """Mentions Paris in a tool call for ever: stops at its step limit, with partial work."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
        return call("think", thought=f"Paris, step {len(messages)}")

    def think(thought: str) -> str:
        """Think."""
        return thought

    return Agent("looper", FunctionModel(brain), tools=[think], limits=Limits(max_steps=2))


async def echo(question: str) -> str:
    """A function target: the question back."""
    return question


def team() -> list[Teammate]:
    """A solver and a shouter: a team of two (the solver is asked unless a case names one)."""
    return [
        Teammate("solver", FunctionModel(_solver, name="solver")),
        Teammate("shouter", FunctionModel(lambda m, t: _task(m).upper())),
    ]


def _judge(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    """Passes an answer that names Paris or Berlin, through the verdict tool."""
    answer = _task(messages).split("The agent's answer:\n", 1)[1].split("\n\nThe rubric:")[0]
    right = "Paris" in answer or "Berlin" in answer
    verdict = {"verdict": "pass" if right else "fail", "reason": f"the answer says {answer!r}"}
    return call("verdict", json.dumps(verdict))


def judge() -> FunctionModel:
    """The judge for `--judge tests.support.eval_targets:judge`."""
    return FunctionModel(_judge, name="judge")
