"""Deterministic re-runs: an agent's loop run again against its recorded transcript.

The model is replaced by the recording: each call returns the reply recorded for that step, after
checking that the conversation the loop built is the one that was recorded. Tools from the spec
run for real (that is what a code change touches); messaging tools, which would reach other
teammates, return what they returned in the recording. The first step whose conversation differs
is reported, so a change can be checked against a recorded run without any model call.

A typed agent's recording says whether its calls held the model to the answer's schema
(structured output); the recorded model claims the same, so the re-run asks for the answer the
same way (or through the same final-answer tool) and validates it again.

Given a model as well (`rerun(..., model=...)`, and `rerun_team` for every agent of a team), each
step also asks that model, with the same conversation, and compares its reply with the recorded
one: the first step where the new model would have done something else is the divergence. The
recorded reply is what the loop goes on with, so later steps are compared on the same footing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, TypeAdapter, create_model

from teamrt.agents.loop import Agent
from teamrt.agents.output import OutputType
from teamrt.agents.state import AgentState, RunReport
from teamrt.agents.tools import Tool, tool
from teamrt.errors import Divergence as Divergence
from teamrt.errors import UsageError
from teamrt.models.base import (
    ChatMessage,
    Model,
    ModelReply,
    OutputSpec,
    StructuredOutputModel,
    ToolSpec,
)
from teamrt.teamdir import AgentDir

if TYPE_CHECKING:
    from teamrt.team.config import Teammate

_MESSAGES = TypeAdapter(list[ChatMessage])
MESSAGING = ("send_message", "wait_for_messages", "request", "reply", "broadcast")


@dataclass
class Step:
    context: list[ChatMessage]  # what the model was sent
    reply: ModelReply
    output: OutputSpec | None = None  # a typed run's answer schema
    structured: bool = False  # the call held the model to it (else: the final-answer tool)


def load_transcript(path: Path) -> list[Step]:
    """The recorded calls, each with its whole context rebuilt from the recorded deltas."""
    steps: list[Step] = []
    context: list[ChatMessage] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        sent = _MESSAGES.validate_python(record["sent"])
        context = sent if record.get("context") == "replaced" else [*context, *sent]
        output = record.get("output")
        steps.append(
            Step(
                list(context),
                ModelReply.model_validate(record["reply"]),
                OutputSpec.model_validate(output) if output is not None else None,
                record.get("answer_by") == "structured_output",
            )
        )
    return steps


def _show(m: ChatMessage) -> str:
    calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
    text = (m.content or "") + (f" [calls {calls}]" if calls else "")
    return f"{m.role}: {text[:160]!r}"


def first_difference(recorded: list[ChatMessage], now: Sequence[ChatMessage]) -> str | None:
    for i, (a, b) in enumerate(zip(recorded, now, strict=False)):
        if (a.role, a.content, a.tool_call_id, [(c.name, c.arguments) for c in a.tool_calls]) != (
            b.role,
            b.content,
            b.tool_call_id,
            [(c.name, c.arguments) for c in b.tool_calls],
        ):
            return f"message {i}: recorded {_show(a)}, now {_show(b)}"
    if len(recorded) != len(now):
        return f"the conversation has {len(now)} messages, the recording {len(recorded)}"
    return None


def _same_reply(a: ChatMessage, b: ChatMessage) -> bool:
    """Whether two replies say and call the same (tool call ids aside)."""
    return (a.content or "", [(c.name, c.arguments) for c in a.tool_calls]) == (
        b.content or "",
        [(c.name, c.arguments) for c in b.tool_calls],
    )


class RecordedModel:
    """Answers from a recording, and checks the conversation at every call. It does
    structured output when the recorded calls did (a typed agent's, on such a model). With
    `live`, it also asks that model and checks that it replies as recorded."""

    def __init__(
        self, steps: list[Step], name: str = "recorded", live: Model | None = None
    ) -> None:
        self.steps = steps
        self.calls = 0
        self._name = name
        self.live = live
        self._structured = any(step.structured for step in steps)
        self.divergence: Divergence | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def structured_output(self) -> bool:
        return self._structured

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        output: OutputSpec | None = None,
    ) -> ModelReply:
        step = self.calls + 1
        if self.calls >= len(self.steps):
            self.divergence = Divergence(
                step,
                "the re-run wants a model call the recording "
                f"does not have (it has {len(self.steps)})",
            )
            raise self.divergence
        recorded = self.steps[self.calls]
        difference = first_difference(recorded.context, messages)
        if difference is not None:
            self.divergence = Divergence(step, difference)
            raise self.divergence
        if self.live is not None:
            live = self.live
            if (
                output is not None
                and isinstance(live, StructuredOutputModel)
                and live.structured_output
            ):
                now = (await live.complete(messages, tools, output=output)).as_message()
            else:
                now = (await live.complete(messages, tools)).as_message()
            if not _same_reply(recorded.reply.as_message(), now):
                self.divergence = Divergence(
                    step,
                    f"the reply: recorded {_show(recorded.reply.as_message())}, now {_show(now)}",
                )
                raise self.divergence
        self.calls += 1
        return recorded.reply


class _RecordedMail:
    """The mail a teammate's model was shown between steps, as the recording has it: the user
    messages that open the next recorded call beyond the conversation so far."""

    def __init__(self, steps: list[Step], model: RecordedModel) -> None:
        self.steps, self.model = steps, model

    async def before_step(self, state: AgentState) -> list[ChatMessage]:
        if self.model.calls >= len(self.steps):
            return []
        following = self.steps[self.model.calls].context[len(state.messages) :]
        injected = []
        for message in following:
            if message.role != "user":
                break
            injected.append(message)
        return injected

    def handled(self) -> list[str]:
        return []

    def recorded(self) -> None:
        pass


def _recorded_results(steps: list[Step]) -> dict[str, str]:
    """Tool results by call id, from the contexts of later steps."""
    results: dict[str, str] = {}
    for step in steps:
        for m in step.context:
            if m.role == "tool" and m.tool_call_id:
                results[m.tool_call_id] = m.content or ""
    return results


def _stub(name: str, results: dict[str, str], order: list[str]) -> Tool:
    """A messaging tool that answers what it answered in the recording, call by call."""

    async def replayed() -> str:
        if not order:
            raise UsageError(f"no recorded result left for {name}")
        return results.get(order.pop(0), "")

    # any arguments are accepted: the model's calls are replayed verbatim
    arguments = create_model(f"{name}_recorded", __config__=ConfigDict(extra="allow"))
    return Tool(
        name=name,
        description=f"{name}, as recorded",
        fn=replayed,
        args_model=arguments,
        is_async=True,
    )


async def rerun(
    directory: Path,
    name: str,
    tools: Sequence[Tool],
    instructions: str,
    task: str | None = None,
    *,
    output_type: Any = None,
    model: Model | None = None,
) -> tuple[RunReport | None, Divergence | None, int]:
    """Re-run agent `name` from `directory` (its agents/ folder). Returns the report, the
    divergence if any, and the number of recorded steps. `output_type`: the agent's (a typed
    teammate's), so that its answers are asked for and validated as they were. With `model`,
    each step's reply from that model must also match the recorded one."""
    path = AgentDir(directory).transcript(name)
    if not path.exists():
        raise UsageError(f"no transcript at {path}")
    steps = load_transcript(path)
    if not steps:
        raise UsageError(f"{path} records no model call")
    if task is None:
        task = next((m.content or "" for m in steps[0].context if m.role == "user"), "")
    results = _recorded_results(steps)
    order_by_tool: dict[str, list[str]] = {}
    for step in steps:
        for call in step.reply.tool_calls:
            order_by_tool.setdefault(call.name, []).append(call.id)
    kept = [t for t in tools if t.name not in MESSAGING]
    stubs = [_stub(n, results, order_by_tool.get(n, [])) for n in MESSAGING if n in order_by_tool]
    recorded = RecordedModel(steps, live=model)
    agent = Agent(
        name,
        recorded,
        instructions=instructions,
        tools=[*kept, *stubs],
        keep_context=True,
        inbound=_RecordedMail(steps, recorded),
    )
    typed = OutputType(output_type) if output_type is not None else None

    def recorded_typing() -> None:  # a teammate's tasks are typed, its rounds of mail not
        step = steps[recorded.calls] if recorded.calls < len(steps) else None
        agent.output_type = typed if step is not None and step.output is not None else None

    recorded_typing()
    report = await agent.run(task)
    # a teammate's conversation carries across tasks: each later task (or round of mail) is the
    # user message that opens the next recorded call
    while recorded.divergence is None and recorded.calls < len(steps) and agent.state is not None:
        opening = steps[recorded.calls].context[len(agent.state.messages) :]
        if not opening or opening[0].role != "user":
            break
        recorded_typing()
        report = await agent.run(opening[0].content or "")
    divergence = recorded.divergence
    if divergence is None and recorded.calls < len(steps):
        divergence = Divergence(
            recorded.calls + 1,
            f"the re-run stopped after {recorded.calls} model "
            f"calls ({report.stop.reason}); the recording has {len(steps)}",
        )
    return report, divergence, len(steps)


def _recorded_agents(directory: Path) -> list[str]:
    """The agents with a transcript in `directory`."""
    return AgentDir(directory).transcribed()


@dataclass
class AgentRerun:
    """One agent of a team re-run: its recorded steps, and the first divergence (None: the
    same again), or why it was not re-run (`skipped`)."""

    name: str
    steps: int
    divergence: Divergence | None
    report: RunReport | None = None
    skipped: str | None = None


async def rerun_team(
    directory: Path, teammates: Sequence[Teammate], *, models: bool = True
) -> list[AgentRerun]:
    """Re-run every teammate that has a transcript in `directory` (the team's agents/ folder)
    with its tools and instructions as the code has them now and, with `models`, its model
    asked at every step (`Teammate.make_model()`: a scripted model shows whether a changed
    script still does what was recorded). An agent with a transcript and no teammate is
    reported as skipped."""
    results: list[AgentRerun] = []
    named = {t.name: t for t in teammates}
    recorded = _recorded_agents(directory)
    for name in [*named, *(n for n in recorded if n not in named)]:
        if name not in recorded:
            continue
        teammate = named.get(name)
        if teammate is None:
            results.append(AgentRerun(name, 0, None, skipped="no teammate of that name given"))
            continue
        tools = [t if isinstance(t, Tool) else tool(t) for t in teammate.tools]
        model = teammate.make_model() if models else None
        try:
            report, divergence, steps = await rerun(
                directory,
                name,
                tools,
                teammate.instructions,
                output_type=teammate.typed,
                model=model,
            )
        finally:
            close = getattr(model, "aclose", None)
            if close is not None and not isinstance(teammate.model, Model):
                await close()
        results.append(AgentRerun(name, steps, divergence, report))
    return results
