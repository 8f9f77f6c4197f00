"""What examples/eval_cases.jsonl evaluates: `teamrt eval --target eval_target:clerk`.

`clerk` is a function of no arguments returning an agent, so each case starts afresh. Its
model is a function that answers from a small table; put a real model here to evaluate it.
"""

from collections.abc import Sequence

from teamrt import Agent, ChatMessage, FunctionModel, ToolSpec

ANSWERS = {
    "capital": "The capital of France is Paris.",
    "add": "def add(a, b):\n    return a + b\n",
    "json": '{"name": "Ada Lovelace", "age": 36}',
}


def answer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    task = (messages[-1].content or "").lower()
    return next((text for key, text in ANSWERS.items() if key in task), "I do not know.")


def clerk() -> Agent:
    """A fresh agent for each case."""
    return Agent("clerk", FunctionModel(answer), instructions="Answer briefly.")
