"""Running checks: only commands the policy allows, in the work directory, with a timeout and a
cap on the output kept. The result is evidence, recorded with every decision.

A check that ran says something about the work: exit 0 is green, anything else (a timeout too:
the work may hang) is red. A check that could not run says nothing about the work, so it is a
check error with its reason, never a red check: the policy refused it, the command could not
start (not found, not executable), the program that ran it reported that (exit 126 or 127), or it
was killed by a signal."""

from __future__ import annotations

import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from pydantic import BaseModel

OUTPUT_TAIL = 2000  # characters of output kept as evidence


class Evidence(BaseModel):
    """What a check did: the command, its exit code (None if it did not finish) and its output;
    `error` says why it could not run at all (then it is neither green nor red)."""

    command: str
    exit_code: int | None
    tail: str
    seconds: float = 0.0
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.exit_code == 0

    def describe(self) -> str:
        """One line: how the check ended."""
        if self.error is not None:
            return f"check error: {self.error}"
        if self.exit_code is None:
            return f"did not finish: {self.tail}"
        return f"exit {self.exit_code}"


@dataclass(frozen=True)
class Policy:
    """Which check commands may run. A command runs if its words start with an allowed prefix
    (`["python", "-m", "pytest"]` allows `python -m pytest -q tests/test_a.py`)."""

    allow: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    timeout: float = 120.0
    max_output: int = 1 << 20

    @classmethod
    def prefixes(cls, *commands: str, timeout: float = 120.0) -> Policy:
        return cls(tuple(tuple(shlex.split(c)) for c in commands), timeout)

    def refusal(self, command: str) -> str | None:
        """Why `command` may not run, or None if it may."""
        try:
            words = shlex.split(command)
        except ValueError as exc:
            return f"cannot parse the command: {exc}"
        if not words:
            return "empty command"
        if any(tuple(words[: len(p)]) == p for p in self.allow):
            return None
        allowed = "; ".join(" ".join(p) for p in self.allow) or "nothing"
        return f"not allowed by the policy (allowed prefixes: {allowed})"


async def run_check(command: str, workdir: Path, policy: Policy) -> Evidence:
    """Run `command` (no shell) in `workdir` under the policy."""
    refusal = policy.refusal(command)
    if refusal is not None:
        return Evidence(command=command, exit_code=None, tail=f"refused: {refusal}", error=refusal)
    started = time.monotonic()
    try:
        with anyio.fail_after(policy.timeout):
            result = await anyio.run_process(
                shlex.split(command), cwd=workdir, check=False, stderr=-2
            )  # -2: STDOUT, one stream of evidence
    except TimeoutError:
        return Evidence(
            command=command,
            exit_code=None,
            seconds=policy.timeout,
            tail=f"timed out after {policy.timeout:g}s",
        )
    except OSError as exc:
        reason = f"could not start: {exc}"
        return Evidence(command=command, exit_code=None, tail=reason, error=reason)
    output = result.stdout[-policy.max_output :].decode(errors="replace")
    return Evidence(
        command=command,
        exit_code=result.returncode,
        tail=output[-OUTPUT_TAIL:],
        seconds=round(time.monotonic() - started, 3),
        error=_cannot_run(result.returncode),
    )


def _cannot_run(code: int) -> str | None:
    """Why an exit code means the check could not run, or None if it ran."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"crashed: killed by {name}"
    if code == 126:
        return "exit 126: the command could not be executed"
    if code == 127:
        return "exit 127: the command was not found"
    return None
