"""The agent's files: a checkpoint journal that grows by the step, and the transcript.

The journal (`<agent>.state.jsonl`) has one JSON line per event: `start` (the whole initial
state), `step` (the messages the step appended, the tool-call signatures and result digests it
added, and the scalar counters), `replace` (the conversation after memory compacted it) and
`stop`. Replaying the lines rebuilds the state, so a long run never rewrites its history, and a
crash loses at most the step in progress. The transcript (`<agent>.transcript.jsonl`) records
every model call: the messages sent since the previous call and the reply, enough to replay a run
without the model.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from teamrt.agents.state import AgentState, Stop
from teamrt.errors import StoreError
from teamrt.models.base import ChatMessage, ModelReply, Usage

_MESSAGES = TypeAdapter(list[ChatMessage])
_SCALARS = {
    "steps",
    "tool_calls",
    "tool_errors",
    "consecutive_errors",
    "stale_steps",
    "nudges",
    "cost",
    "cost_known",
    "elapsed",
    "context_tokens",
    "compactions",
    "answer",
}


def _append_line(path: Path, record: dict[str, Any]) -> None:
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(exc.errno or 0, f"write {path}: {exc.strerror}") from None


def _prepare(path: Path) -> Path:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class Journal:
    """Writes and replays an agent's checkpoint journal."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def start(self, state: AgentState) -> None:
        _prepare(self.path).unlink(missing_ok=True)
        _append_line(self.path, {"t": "start", "state": state.model_dump(mode="json")})

    def replace(self, messages: list[ChatMessage]) -> None:
        _append_line(
            self.path, {"t": "replace", "messages": [m.model_dump(mode="json") for m in messages]}
        )

    def step(
        self, state: AgentState, appended: list[ChatMessage], calls: list[str], digests: list[str]
    ) -> None:
        _append_line(
            self.path,
            {
                "t": "step",
                "append": [m.model_dump(mode="json", exclude_defaults=True) for m in appended],
                "calls": calls,
                "digests": digests,
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
                "stop": state.stop.model_dump(),
                "scalars": state.model_dump(include=_SCALARS),
            },
        )

    def load(self) -> AgentState | None:
        """The state as of the last complete line, or None if there is no journal.

        A last line cut short by a crash is ignored: that step is simply done again.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
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
                raise StoreError(0, f"{self.path}: journal does not begin with a start record")
            elif kind == "replace":
                state.messages = _MESSAGES.validate_python(record["messages"])
            elif kind == "step":
                state.messages.extend(_MESSAGES.validate_python(record["append"]))
                for signature in record["calls"]:
                    state.count_call(signature)
                for digest in record["digests"]:
                    state.is_new_result(digest)
                state.usage = Usage.model_validate(record["usage"])
                for key, value in record["scalars"].items():
                    setattr(state, key, value)
            elif kind == "stop":
                state.stop = Stop.model_validate(record["stop"])
                for key, value in record["scalars"].items():
                    setattr(state, key, value)
        return state


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
        self._sent = 0

    def record(
        self, step: int, messages: list[ChatMessage], reply: ModelReply, context_replaced: bool
    ) -> None:
        if context_replaced or self._sent > len(messages):
            self._sent = 0
        new = messages[self._sent :]
        self._sent = len(messages)
        _append_line(
            self.path,
            {
                "step": step,
                "ts": time.time(),
                "context": "replaced" if context_replaced else "appended",
                "sent": [m.model_dump(mode="json", exclude_defaults=True) for m in new],
                "reply": reply.model_dump(mode="json", exclude_defaults=True),
            },
        )
