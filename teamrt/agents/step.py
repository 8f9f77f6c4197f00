"""The agent's step as a pure state machine: what a model reply means and what comes next.

`StepMachine` never awaits and does no I/O, in the spirit of h11's `Connection`: it is given
the agent's state, its limits, the tools' descriptions and the time elapsed (a value, not a
clock), changes the state, and says what the driver (`teamrt.agents.loop.Agent`) is to do next:

- `next(state, elapsed)` before a model call: `RESUME_STEP` (a resumed run stopped between a
  reply and its results), `CALL_MODEL`, or `STOPPED` (a limit was reached: `state.stop` says
  which);
- `take(state, step, work)` on a recorded reply: the admitted calls still to run (all of them
  are in `work.admitted`), or None when the step needs no tool (an answer, a nudge, a request
  to continue, a stop);
- `account(state, work)` on the results of those calls: the counters of progress and
  errors, and the limits checked after tools;
- `close(state, step, work)`: the step's messages added to the conversation.

What the driver writes to the journal and the transcript, the model call, the tools, the
events and the telemetry are the driver's. The step machine's tests are table tests with no
event loop (tests/test_agent_step_machine.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from teamrt.agents.limits import Limits, cost_of
from teamrt.agents.memory import context_tokens
from teamrt.agents.output import FINAL_TOOL, Accepted, OutputType, Rejected
from teamrt.agents.state import HANDLED_MEMORY, AgentState, OpenStep, RunReport, Stop
from teamrt.agents.tools import Toolbox
from teamrt.errors import LimitExceeded
from teamrt.models.base import ChatMessage, ModelReply, ToolCall, Usage, message_tokens

log = logging.getLogger("teamrt.agents")

CONTINUE = (
    "Your last reply was cut off by the output length limit. Continue exactly where it "
    "stopped, without repeating anything."
)
NUDGE = (
    "Your last reply could not be used: {reason}. Reply with a valid tool call (arguments "
    "must be a JSON object matching the tool's schema) or with {answer}."
)
#: How a nudge asks for the answer: untyped, typed with structured output, typed with the tool.
ANSWER_AS_TEXT = "your final answer as text"
ANSWER_AS_JSON = "your final answer as JSON matching the required schema"
ANSWER_BY_TOOL = f"a call of {FINAL_TOOL} with your final answer"
#: The user message that gives a rejected typed answer back to the model (structured output).
REJECTED = (
    "Your answer does not match the required {name} schema: {errors}. Reply with the corrected "
    "answer: only JSON that matches the schema."
)
#: The same, to a model that was to answer through the final-answer tool and wrote text.
REJECTED_TEXT = (
    "Give your final answer by calling " + FINAL_TOOL + " with arguments that match its "
    "schema ({name}); your reply was not such a call and its text is not a valid answer: "
    "{errors}."
)
#: Typed answers rejected in one task that go back to the model; the next one stops the run.
OUTPUT_RETRIES = 1
#: The result of an accepted final-answer call, and of the other calls of its reply (not run).
ACCEPTED = {"ok": "answer accepted"}
NOT_RUN_ENDED = "NotRun: the final answer ended the task"
NOT_RUN_BESIDE = (
    "NotRun: calls beside a final answer are not run; make them again if they are still needed"
)


# --- what a reply means ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class CallTools:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Malformed:
    reason: str


@dataclass(frozen=True)
class Truncated:
    text: str


Decision = Answer | CallTools | Malformed | Truncated


def decide(reply: ModelReply) -> Decision:
    """What a model reply means. Tool calls win over text (the text is a note to itself); text
    cut off by the length limit is not an answer."""
    return decide_parts(reply.text, reply.tool_calls, reply.finish_reason, [])


def decide_parts(
    text: str | None,
    tool_calls: tuple[ToolCall, ...],
    finish_reason: str | None,
    parsed: list[dict[str, Any]],
) -> Decision:
    """`decide` on a reply's parts (a recorded step has them as a message, not a reply); the
    calls' arguments, parsed on the way, are appended to `parsed` (for their signatures)."""
    if tool_calls:
        for call in tool_calls:
            try:
                arguments = json.loads(call.arguments or "{}")
            except ValueError as exc:
                return Malformed(f"the arguments of {call.name} are not valid JSON ({exc})")
            if not isinstance(arguments, dict):
                return Malformed(f"the arguments of {call.name} are not a JSON object")
            parsed.append(arguments)
        return CallTools(tool_calls)
    if finish_reason == "length":
        return Truncated(text or "")
    if text and text.strip():
        return Answer(text)
    return Malformed("it had neither text nor a tool call")


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(value, sort_keys=True)
# The same encoder's C part, made once rather than by every `encode`. No cycle markers: what
# it is given comes from json.loads, which makes no cycles.
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_canonical_chunks: Any = (
    _make_encoder(
        None,
        _CANONICAL_JSON.default,
        json.encoder.encode_basestring_ascii,
        None,
        ": ",
        ", ",
        True,
        False,
        True,
    )
    if _make_encoder is not None
    else None
)


def signature(call: ToolCall) -> str:
    """A tool call's identity for loop detection: name and canonical arguments."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return f"{call.name}({call.arguments})"
    return signature_of(call, arguments)


def signature_of(call: ToolCall, arguments: Any) -> str:
    """`signature(call)` given its arguments as parsed already."""
    if _canonical_chunks is None:
        return f"{call.name}({_CANONICAL_JSON.encode(arguments)})"
    return f"{call.name}({''.join(_canonical_chunks(arguments, 0))})"


def digest(text: str) -> str:
    """A tool result's identity for the no-progress check."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class ResultIndex:
    """A state's recent result digests (`AgentState.seen_results`, a list: what is saved) as a
    set as well, for the no-progress check, which a long list would slow. Made again when the
    state, or its list, is another one."""

    __slots__ = ("_results", "_set")

    def __init__(self) -> None:
        self._results: list[str] | None = None
        self._set: set[str] = set()

    def is_new(self, state: AgentState, digest: str) -> bool:
        """`state.is_new_result(digest)`, by the set."""
        results = state.seen_results
        seen = self._set
        if results is not self._results or len(seen) != len(results):
            self._results, seen = results, set(results)
            self._set = seen
        if digest in seen:
            return False
        seen.add(digest)
        dropped = state.remember_result(digest)
        if dropped is not None:
            seen.discard(dropped)
        return True


_NONE: list[ToolCall] = []  # (never appended to: an admission makes its own list)
_NO_IDS: set[str] = set()


class StepWork:
    """What one step's tool calls produced, in call order."""

    __slots__ = (
        "admitted",
        "appended",
        "arguments",
        "calls",
        "checkpointed",
        "digests",
        "fresh",
        "reply_calls",
        "results",
        "waiting",
    )

    def __init__(
        self,
        results: dict[str, ChatMessage],
        reply_calls: tuple[ToolCall, ...],
        checkpointed: bool = False,
    ):
        self.results = results
        self.reply_calls = reply_calls
        # a checkpoint was passed since the last tool call (the step's model call suspended)
        self.checkpointed = checkpointed
        self.appended: list[ChatMessage] = []  # after the results
        self.arguments: list[dict[str, Any]] = []  # of the calls, parsed
        self.calls: list[str] = []  # signatures counted for repeats
        self.digests: list[str] = []
        # results the step machine made (not run), for the driver to journal
        self.fresh: list[tuple[str, ChatMessage]] | None = None
        # the calls admitted to run (see `StepMachine.take`), and of them the ids of calls to
        # tools that wait for others
        self.admitted: list[ToolCall] = _NONE
        self.waiting: set[str] = _NO_IDS

    def record(self, call: ToolCall, message: ChatMessage) -> None:
        """A result the step machine made for `call` (the driver journals `fresh`)."""
        self.results[call.id] = message
        if self.fresh is None:
            self.fresh = []
        self.fresh.append((call.id, message))


# --- the actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumeStep:
    """Finish the open step (`state.open_step`): a resumed run stopped between a reply and its
    results."""


@dataclass(frozen=True)
class CallModel:
    """Call the model with the conversation (`state.messages`)."""


@dataclass(frozen=True)
class Stopped:
    """The run is over: `state.stop` says why."""


RESUME_STEP = ResumeStep()
CALL_MODEL = CallModel()
STOPPED = Stopped()

Next = ResumeStep | CallModel | Stopped


def stop_at_limit(state: AgentState, exc: LimitExceeded) -> None:
    """End the run at the limit `exc` names."""
    level = logging.WARNING if exc.limit.startswith("team_") else logging.INFO
    log.log(level, "%s stopped at a limit: %s", state.agent, exc)
    state.stop = Stop(
        reason="limit", detail=str(exc), limit=exc.limit, value=exc.value, used=exc.used
    )


def count(
    state: AgentState, usage: Usage, model: str, prices: dict[str, tuple[float, float]]
) -> float | None:
    """Add a call's usage and cost (by `prices`) to the run's; its cost (None: unknown)."""
    state.usage = state.usage + usage
    cost = cost_of(usage, model, prices)
    if cost is None:
        if state.cost_known:
            state.cost_known = False
    elif cost:
        state.cost += cost
    return cost


# --- the machine ----------------------------------------------------------------------------------


class StepMachine:
    """One run's steps, pure: see the module docstring.

    `structured`: a typed run whose model takes the answer's schema as structured output (so
    a nudge asks for JSON, not for the final-answer tool). `results`: the agent's index of
    recent results (it outlives a run). `accepted`: the last typed answer accepted, with its
    value.
    """

    def __init__(
        self,
        limits: Limits,
        toolbox: Toolbox,
        *,
        prices: dict[str, tuple[float, float]],
        output: OutputType | None = None,
        structured: bool = False,
        results: ResultIndex | None = None,
        accepted: Accepted | None = None,
    ) -> None:
        self.limits = limits
        self.toolbox = toolbox
        self.prices = prices
        self.output = output
        self.structured = structured
        self.results = results if results is not None else ResultIndex()
        self.accepted = accepted

    def next(self, state: AgentState, elapsed: float) -> Next:
        """What to do before the next model call, `elapsed` seconds into the run."""
        if state.stop is not None:
            return STOPPED
        if state.open_step is not None:
            return RESUME_STEP
        try:
            self.limits.check_model_call(
                steps=state.steps,
                tokens=state.usage.total_tokens,
                cost=state.cost,
                elapsed=elapsed,
                idle=state.idle,
                model_time=state.model_time,
            )
        except LimitExceeded as exc:
            stop_at_limit(state, exc)
            return STOPPED
        return CALL_MODEL

    def count(self, state: AgentState, usage: Usage, model: str) -> float | None:
        """Add a call's usage and cost to the run's; its cost (None: unknown)."""
        return count(state, usage, model, self.prices)

    def take(self, state: AgentState, step: OpenStep, work: StepWork) -> list[ToolCall] | None:
        """Act on a recorded reply: the tool calls to run (the admitted ones without a result
        yet), or None when the step is decided without running any (its messages are in
        `work`, a stop in `state.stop`); then `account` for the admitted calls' results."""
        reply = step.reply
        decision = decide_parts(reply.content, reply.tool_calls, step.finish_reason, work.arguments)
        if self.output is not None and any(c.name == FINAL_TOOL for c in reply.tool_calls):
            state.nudges = 0
            self._final_call(state, reply.tool_calls, work)
        elif isinstance(decision, CallTools):
            if state.nudges:
                state.nudges = 0
            return self._admit(state, decision.calls, work)
        elif isinstance(decision, Answer):
            state.nudges = 0
            text = state.truncated + decision.text
            state.truncated = ""
            if self.output is None:
                state.answer = text
                state.stop = Stop(reason="answer", detail="the model gave its answer")
            else:
                self._typed_text(state, text, work)
        elif isinstance(decision, Truncated):
            self._truncated(state, decision, work)
        else:
            self._malformed(state, reply, decision, work)
        return None

    def _truncated(self, state: AgentState, decision: Truncated, work: StepWork) -> None:
        if state.truncated:  # cut off again after being asked to continue
            state.truncated += decision.text
            state.stop = Stop(
                reason="truncated",
                detail="the reply was cut off by the output length limit again after "
                "one request to continue; the partial text is kept",
            )
        else:
            state.truncated = decision.text
            work.appended.append(ChatMessage.user(CONTINUE))

    def _malformed(
        self, state: AgentState, reply: ChatMessage, decision: Malformed, work: StepWork
    ) -> None:
        for call in reply.tool_calls:  # every call needs a result, even an unusable one
            work.appended.append(
                ChatMessage.tool_result(
                    call, json.dumps({"error": f"MalformedToolCall: {decision.reason}"})
                )
            )
        if state.nudges >= 1:
            state.stop = Stop(
                reason="malformed_reply",
                detail=f"malformed again after a nudge: {decision.reason}",
            )
        else:
            state.nudges += 1
            nudge = NUDGE.format(reason=decision.reason, answer=self.answer_hint())
            work.appended.append(ChatMessage.user(nudge))

    def _admit(
        self, state: AgentState, tool_calls: tuple[ToolCall, ...], work: StepWork
    ) -> list[ToolCall] | None:
        """Admit the calls in order against the limits; the first refused one stops the run,
        and it and the calls after it get a NotRun result."""
        admitted: list[ToolCall] = []
        waiting: set[str] = set()  # ids of admitted calls to tools that wait for others
        for i, call in enumerate(tool_calls):
            found = self.toolbox.get(call.name)
            waits = found is not None and found.waits
            sig = (
                signature_of(call, work.arguments[i])
                if i < len(work.arguments)
                else signature(call)
            )
            try:
                self.limits.check_tool_call(
                    tool_calls=state.tool_calls,
                    repeats=0 if waits else state.call_counts.get(sig, 0),
                    signature=sig,
                )
            except LimitExceeded as exc:
                for skipped in tool_calls[i:]:  # keep the conversation well formed for a resume
                    work.appended.append(
                        ChatMessage.tool_result(skipped, json.dumps({"error": f"NotRun: {exc}"}))
                    )
                stop_at_limit(state, exc)
                break
            if waits:
                waiting.add(call.id)
            else:
                state.count_call(sig)
                work.calls.append(sig)
            state.tool_calls += 1
            admitted.append(call)
        if not admitted:  # (the first call was refused: the run is stopped)
            return None
        work.admitted, work.waiting = admitted, waiting
        results = work.results
        return [c for c in admitted if c.id not in results] if results else admitted

    def account(self, state: AgentState, work: StepWork) -> None:
        """Count the admitted calls' results, in call order: errors, and whether anything new
        was learned (a waiting tool's result is neither); then the limits after tools."""
        learned = waited = False
        waiting = work.waiting
        for call in work.admitted:
            message = work.results[call.id]
            if waiting and call.id in waiting:
                waited = True
                continue
            content = message.content or ""
            if content.startswith('{"error"'):
                state.tool_errors += 1
                state.consecutive_errors += 1
            elif state.consecutive_errors:  # (a pydantic field: set only when it changes)
                state.consecutive_errors = 0
            seen = digest(content)
            if self.results.is_new(state, seen):
                work.digests.append(seen)
                learned = True
        if state.stop is not None:
            return
        if learned:
            if state.stale_steps:
                state.stale_steps = 0
        elif not waited:  # waiting for others is not a lack of progress
            state.stale_steps += 1
        try:
            self.limits.check_after_tools(
                consecutive_errors=state.consecutive_errors, stale_steps=state.stale_steps
            )
        except LimitExceeded as exc:
            stop_at_limit(state, exc)

    def close(self, state: AgentState, step: OpenStep, work: StepWork) -> None:
        """The step's reply, its results in call order and what follows them, added to the
        conversation; the step is no longer open."""
        reply = step.reply
        added = [reply]
        results = work.results
        for c in reply.tool_calls:
            if c.id in results:
                added.append(results[c.id])
        added += work.appended
        state.messages.extend(added)
        tokens = 0
        for m in added:
            tokens += message_tokens(m)
        state.context_tokens += tokens
        state.open_step = None

    # -- typed answers --

    def answer_hint(self) -> str:
        """How a nudge asks for the answer."""
        if self.output is None:
            return ANSWER_AS_TEXT
        return ANSWER_AS_JSON if self.structured else ANSWER_BY_TOOL

    def _final_call(
        self, state: AgentState, tool_calls: tuple[ToolCall, ...], work: StepWork
    ) -> None:
        """A reply that calls the final-answer tool: its first such call is the answer. Every
        call gets a result (the others are not run), so the conversation stays well formed."""
        assert self.output is not None
        final = next(c for c in tool_calls if c.name == FINAL_TOOL)
        accepted: Accepted | None = None
        error = ""
        try:
            accepted = self.output.check(final.arguments or "{}")
            result = ACCEPTED
        except Rejected as exc:
            error = str(exc)
            result = {"error": f"ValidationError: {error}"}
        for call in tool_calls:
            if call is final:
                content = json.dumps(result)
            else:
                content = json.dumps({"error": NOT_RUN_ENDED if accepted else NOT_RUN_BESIDE})
            if work.results.get(call.id) is None:
                work.record(call, ChatMessage.tool_result(call, content))
        if accepted is not None:
            self._accept(state, accepted)
        else:
            self._reject(state, error)  # the call's error result is what the model reads

    def _typed_text(self, state: AgentState, text: str, work: StepWork) -> None:
        """A typed run's text answer: the answer itself (structured output), or, from a model
        that was to call the final-answer tool, accepted if it is valid JSON of the type."""
        assert self.output is not None
        try:
            accepted = self.output.check(text)
        except Rejected as exc:
            if self._reject(state, str(exc)):
                template = REJECTED if self.structured else REJECTED_TEXT
                feedback = template.format(name=self.output.name, errors=exc)
                work.appended.append(ChatMessage.user(feedback))
            return
        self._accept(state, accepted)

    def _accept(self, state: AgentState, accepted: Accepted) -> None:
        self.accepted = accepted
        state.answer = accepted.json
        state.stop = Stop(reason="answer", detail="the model gave its answer")

    def _reject(self, state: AgentState, error: str) -> bool:
        """An answer that did not validate: True while the model gets its one correction
        (the caller gives it the errors); after that the run stops as `invalid_output`."""
        assert self.output is not None
        state.output_errors += 1
        if state.output_errors <= OUTPUT_RETRIES:
            return True
        name = self.output.name
        log.info("%s stopped: its answer did not match %s twice", state.agent, name)
        state.stop = Stop(
            reason="invalid_output",
            detail=f"the answer did not match {name} again after one correction: {error}",
        )
        return False

    def report(self, state: AgentState) -> RunReport:
        """The report of a stopped run."""
        return report_of(state, self.output, self.accepted)


# --- a task's state, and its report ---------------------------------------------------------------


def begin(
    last: AgentState | None,
    *,
    agent: str,
    instructions: str,
    keep_context: bool,
    task: str,
    task_id: str | None,
) -> AgentState:
    """The state of a new task after `last` (the agent's previous one, if any): its
    conversation carried on (`keep_context`) or begun afresh under `instructions`."""
    handled = list(last.handled) if last is not None else []
    if last is not None and last.task_id is not None and last.task_id not in handled:
        handled.append(last.task_id)  # a redelivery of it is recognised, not run again
    previous = last if keep_context else None
    if previous is None:
        messages = [ChatMessage.system(instructions)] if instructions else []
        pinned, tasks, tokens = len(messages), 1, context_tokens(messages)
    else:
        messages = closed(previous)
        pinned, tasks = previous.pinned, previous.tasks + 1
        tokens = previous.context_tokens + context_tokens(messages[len(previous.messages) :])
        messages, pinned, tokens = instructed(instructions, messages, pinned, tokens)
    index = None
    if task:
        index = len(messages)
        messages.append(ChatMessage.user(task))
        tokens += message_tokens(messages[-1])
        if previous is None and not keep_context:
            pinned = len(messages)  # a one-task conversation pins its task (a kept
            # conversation protects only the current task: older ones may be summarised)
    return AgentState(
        agent=agent,
        task=task,
        task_id=task_id,
        task_index=index,
        tasks=tasks,
        messages=messages,
        pinned=pinned,
        handled=handled[-HANDLED_MEMORY:],
        context_tokens=tokens,
    )


def instructed(
    instructions: str, messages: list[ChatMessage], pinned: int, tokens: int
) -> tuple[list[ChatMessage], int, int]:
    """A kept conversation under the agent's current instructions (they may have changed
    since it was journaled: a teammate restarted with new configuration)."""
    has_system = bool(messages) and messages[0].role == "system"
    current = messages[0].content if has_system else None
    wanted = instructions or None
    if current == wanted:
        return messages, pinned, tokens
    if has_system:
        tokens -= message_tokens(messages[0])
        messages, pinned = messages[1:], max(0, pinned - 1)
    if wanted is not None:
        system = ChatMessage.system(wanted)
        messages, pinned = [system, *messages], pinned + 1
        tokens += message_tokens(system)
    return messages, pinned, tokens


def closed(state: AgentState) -> list[ChatMessage]:
    """The conversation of `state`, well formed to build on: an interrupted step's reply is
    closed with its results, and a call that never finished says so."""
    messages = list(state.messages)
    step = state.open_step
    if step is not None:
        messages.append(step.reply)
        for call in step.reply.tool_calls:
            result = step.results.get(call.id)
            if result is None:
                error = "Interrupted: this call did not finish before the run stopped"
                result = ChatMessage.tool_result(call, json.dumps({"error": error}))
            messages.append(result)
    return messages


def same_task(saved: AgentState, task: str, task_id: str | None) -> bool:
    """Whether `saved` is the state of this task (by id when there is one, else by text)."""
    return saved.task_id == task_id if task_id is not None else saved.task == task


def report_of(
    state: AgentState, output: OutputType | None, accepted: Accepted | None = None
) -> RunReport:
    """The report of a stopped run (`accepted`: the typed answer accepted last, if any)."""
    assert state.stop is not None
    partial = state.truncated or None
    if state.stop.reason == "invalid_output":
        partial = rejected_answer(state)
    if state.answer is None and partial is None:
        start = state.task_index if state.task_index is not None else state.pinned
        for m in reversed(state.messages[start:]):
            if m.content and m.role in ("assistant", "tool"):
                partial = m.content
                break
    return RunReport(
        agent=state.agent,
        task=state.task,
        task_id=state.task_id,
        stop=state.stop,
        answer=state.answer,
        partial=partial,
        steps=state.steps,
        tool_calls=state.tool_calls,
        tool_errors=state.tool_errors,
        usage=state.usage,
        cost=state.cost if state.cost_known else None,
        elapsed=state.elapsed,
        idle=state.idle,
        compactions=state.compactions,
        model_time=state.model_time,
        attempts=state.attempts,
        rate_limited=state.rate_limited,
        usage_estimated=state.usage_estimated,
        output=value_of(state, output, accepted),
        output_name=output.name if output is not None else None,
    )


def value_of(state: AgentState, output: OutputType | None, accepted: Accepted | None) -> Any:
    """A typed run's answer as a value (validated again from its JSON after a restore)."""
    if output is None or state.stop is None or state.stop.reason != "answer":
        return None
    if state.answer is None:  # cannot happen after an answer; for the type checker
        return None
    if accepted is not None and accepted.json == state.answer:
        return accepted.value
    try:
        return output.load(state.answer)
    except ValueError:  # pydantic's ValidationError: an answer of another type
        log.warning("%s: its answer does not load as %s", state.agent, output.name)
        return None


def rejected_answer(state: AgentState) -> str | None:
    """The answer a typed run rejected last: its final-answer call's arguments, or its text."""
    for message in reversed(state.messages):
        if message.role == "assistant":
            for call in message.tool_calls:
                if call.name == FINAL_TOOL:
                    return call.arguments
            return message.content
    return None
