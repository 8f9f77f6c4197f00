"""The agent's files: a checkpoint journal that grows by the step, and the transcript.

The journal (`<agent>.state.jsonl`) has one JSON line per event:

- `start`: the whole state at the start of a task (or of a round of mail). A teammate's
  conversation carries across tasks, so each task begins by rewriting the journal as one
  snapshot (written to a temporary file and renamed over the journal: never half a journal);
- `call`: a model reply, with the messages injected before it and the ids of the inputs
  (envelopes) they came from; written before any of the reply's tool calls runs;
- `result`: one tool call's result, as soon as that call finishes;
- `step`: the end of a step (messages it added beyond the reply and the results, counters);
- `replace`: the conversation after memory compacted it; `stop`: how the task ended.

Every line carries `ts`, when it was written. The journal a task start replaces is kept as
`<agent>.state.prev.jsonl`, so that the agent's state at any moment of its current or previous
task can be rebuilt (`teamrt fork`). Replaying the lines rebuilds the state, so a long run never
rewrites its history. A crash loses at most the call in progress: a resumed run re-runs only the
tool calls of the last reply that have no `result` line, with the same call ids. The transcript
(`<agent>.transcript.jsonl`) records every model call: the messages sent since the previous call
and the reply, enough to replay a run without the model.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter

from teamrt.agents.state import AgentState, OpenStep, Stop
from teamrt.errors import StoreError
from teamrt.models.base import ChatMessage, ModelReply, OutputSpec, Usage
from teamrt.private_files import make_dirs
from teamrt.teamdir import previous_journal

_MESSAGES = TypeAdapter(list[ChatMessage])
_SCALARS = {
    "steps",
    "tool_calls",
    "tool_errors",
    "consecutive_errors",
    "stale_steps",
    "nudges",
    "output_errors",
    "cost",
    "cost_known",
    "elapsed",
    "idle",
    "model_time",
    "attempts",
    "rate_limited",
    "usage_estimated",
    "truncated",
    "context_tokens",
    "compactions",
    "answer",
    "task_index",
}


def _encode(record: dict[str, Any]) -> bytes:
    """One journal line. orjson, because a journal line holds whole conversations: a teammate
    that journals a 65 MiB answer spends seconds in the stdlib encoder, in its event loop,
    where its lease's heartbeat waits. What orjson does not take (an int beyond 64 bits, a
    lone surrogate) goes through `_encode_plainly`, which raises for what cannot be written."""
    try:
        return orjson.dumps(record, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        return _encode_plainly(record)


_ORJSON_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


def _encode_plainly(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _append_line(path: Path, record: dict[str, Any]) -> None:
    data = _encode(record)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(f"write {path}: {exc.strerror}", errno=exc.errno or 0) from None


def _replace_file(path: Path, data: bytes) -> None:
    """Write `data` as the whole of `path`, atomically (a crash leaves the old or the new)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"write {path}: {exc.strerror}", errno=exc.errno or 0) from None


def _keep(path: Path, kept: Path) -> None:
    """Keep the file at `path` under the name `kept` too (replacing what was there), by a hard
    link renamed into place: at every instant both names hold a whole journal."""
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.link(path, tmp, follow_symlinks=False)
        except FileNotFoundError:
            return  # no journal yet: nothing to keep
        os.replace(tmp, kept)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"keep {path} as {kept}: {exc.strerror}", errno=exc.errno or 0) from None


def _truncate(path: Path, length: int) -> None:
    try:
        os.truncate(path, length)
    except OSError as exc:
        raise StoreError(f"repair {path}: {exc.strerror}", errno=exc.errno or 0) from None


def _prepare(path: Path) -> Path:
    make_dirs(path.parent)
    return path


def _dump(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_defaults=True) for m in messages]


class Journal:
    """Writes and replays an agent's checkpoint journal."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def previous_path(self) -> Path:
        """Where the journal of the task before the current one is kept
        (`<agent>.state.prev.jsonl` beside `<agent>.state.jsonl`)."""
        return previous_journal(self.path)

    def start(self, state: AgentState) -> None:
        """Begin a task: the journal becomes one snapshot of `state`. The journal it replaces
        (the previous task's) is kept as `previous_path`, so that a fork can go back into it."""
        _prepare(self.path)
        _keep(self.path, self.previous_path)
        _replace_file(
            self.path,
            _encode({"t": "start", "ts": time.time(), "state": state.model_dump(mode="json")}),
        )

    def replace(self, messages: list[ChatMessage], task_index: int | None = None) -> None:
        _append_line(
            self.path,
            {
                "t": "replace",
                "ts": time.time(),
                "messages": [m.model_dump(mode="json") for m in messages],
                "task_index": task_index,
            },
        )

    def call(
        self,
        state: AgentState,
        injected: list[ChatMessage],
        handled: list[str],
        reply: ChatMessage,
        usage: Usage,
        finish_reason: str | None = None,
    ) -> None:
        """A model reply, before its tool calls run."""
        _append_line(
            self.path,
            {
                "t": "call",
                "ts": time.time(),
                "inject": _dump(injected),
                "handled": handled,
                "reply": reply.model_dump(mode="json", exclude_defaults=True),
                "finish": finish_reason,
                "usage": usage.model_dump(),
                "scalars": state.model_dump(include=_SCALARS),
            },
        )

    def result(self, call_id: str, message: ChatMessage) -> None:
        """One tool call finished: a resumed run will not run it again."""
        _append_line(
            self.path,
            {
                "t": "result",
                "ts": time.time(),
                "id": call_id,
                "message": message.model_dump(mode="json"),
            },
        )

    def step(
        self,
        state: AgentState,
        appended: list[ChatMessage],
        calls: list[str],
        digests: list[str],
        handled: Sequence[str] = (),
    ) -> None:
        """The end of a step: `appended` are the messages it added after the reply's results."""
        _append_line(
            self.path,
            {
                "t": "step",
                "ts": time.time(),
                "append": _dump(appended),
                "calls": calls,
                "digests": digests,
                "handled": list(handled),
                "usage": state.usage.model_dump(),
                "scalars": state.model_dump(include=_SCALARS),
            },
        )

    def stop(self, state: AgentState) -> None:
        assert state.stop is not None
        _append_line(
            self.path,
            {
                "t": "stop",
                "ts": time.time(),
                "stop": state.stop.model_dump(),
                "scalars": state.model_dump(include=_SCALARS),
            },
        )

    def incident(self, kind: str, detail: str) -> None:
        """Record what ended an incarnation from outside the loop (`crash`: an exception;
        `cancel`: stopped by the team, at a shutdown deadline or as hung; `outage`: stopped by a
        store outage longer than the tolerance), so that the agent's files say what happened;
        replaying the journal skips these lines."""
        if self.path.exists():
            _append_line(self.path, {"t": kind, "ts": time.time(), "detail": detail})

    def load(self) -> AgentState | None:
        """The state as of the last complete line, or None if there is no journal.

        A last line cut short by a crash is ignored: that event simply happens again. A step
        whose reply is recorded but which did not end comes back as `state.open_step`.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        end = raw.rfind(b"\n") + 1
        if end < len(raw):  # a line cut short by a crash: cut it off, so that the next
            _truncate(self.path, end)  # record starts a line of its own
            raw = raw[:end]
        state: AgentState | None = None
        for line in raw.split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # the torn last line of a crashed write
            kind = record.get("t")
            if kind == "start":
                state = AgentState.model_validate(record["state"])
            elif state is None:
                raise StoreError(
                    f"{self.path}: journal does not begin with a start record", errno=0
                )
            else:
                _apply(state, kind, record)
        return state


def _apply(state: AgentState, kind: str, record: dict[str, Any]) -> None:
    if kind == "replace":
        state.messages = _MESSAGES.validate_python(record["messages"])
        if "task_index" in record:
            state.task_index = record["task_index"]
    elif kind == "call":
        state.messages.extend(_MESSAGES.validate_python(record["inject"]))
        state.remember_handled(record["handled"])
        reply = ChatMessage.model_validate(record["reply"])
        state.open_step = OpenStep(reply=reply, finish_reason=record.get("finish"))
        state.usage = state.usage + Usage.model_validate(record["usage"])
        _scalars(state, record)
    elif kind == "result" and state.open_step is not None:
        message = ChatMessage.model_validate(record["message"])
        state.open_step.results[record["id"]] = message
    elif kind == "step":
        open_step, state.open_step = state.open_step, None
        if open_step is not None:
            state.messages.append(open_step.reply)
            state.messages.extend(
                open_step.results[c.id]
                for c in open_step.reply.tool_calls
                if c.id in open_step.results
            )
        state.messages.extend(_MESSAGES.validate_python(record["append"]))
        for signature in record["calls"]:
            state.count_call(signature)
        for digest in record["digests"]:
            state.is_new_result(digest)
        state.remember_handled(record.get("handled", []))
        state.usage = Usage.model_validate(record["usage"])
        _scalars(state, record)
    elif kind == "stop":
        state.stop = Stop.model_validate(record["stop"])
        _scalars(state, record)


def _scalars(state: AgentState, record: dict[str, Any]) -> None:
    for key, value in record["scalars"].items():
        setattr(state, key, value)


def summarise(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last run in an agent's journal: task, stop, steps, tool calls, tokens, cost."""
    state = Journal(path).load()
    if state is None:
        return None
    return {
        "task": state.task[:200],
        "stop_reason": state.stop.reason if state.stop else "running or interrupted",
        "detail": state.stop.detail if state.stop else "",
        "steps": state.steps,
        "tool_calls": state.tool_calls,
        "tokens": state.usage.total_tokens,
        "cost": state.cost if state.cost_known else None,
    }


class Transcript:
    """Appends every model call and reply to the agent's transcript file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = _prepare(Path(path))
        self._sent = 0  # messages of the current context already written

    def reset(self) -> None:
        """The next record carries the whole context (a new conversation)."""
        self._sent = 0

    def record(
        self,
        step: int,
        messages: list[ChatMessage],
        reply: ModelReply,
        context_replaced: bool,
        output: OutputSpec | None = None,
        structured: bool = False,
    ) -> None:
        """One model call: the messages sent since the last, the reply, and for a typed run
        the answer's schema and whether the model was held to it (`structured`) or offered
        the final-answer tool."""
        if context_replaced or self._sent > len(messages):
            self._sent = 0
        whole = self._sent == 0
        new = messages[self._sent :]
        self._sent = len(messages)
        record: dict[str, Any] = {
            "step": step,
            "ts": time.time(),
            "context": "replaced" if whole else "appended",
            "sent": [m.model_dump(mode="json", exclude_defaults=True) for m in new],
            "reply": reply.model_dump(mode="json", exclude_defaults=True),
        }
        if output is not None:
            record["output"] = output.model_dump(mode="json")
            record["answer_by"] = "structured_output" if structured else "tool"
        _append_line(self.path, record)
