"""Running checks: only commands the policy allows, in the work directory, with a timeout and a
cap on the output kept. The result is evidence, recorded with every decision."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from pydantic import BaseModel

OUTPUT_TAIL = 2000  # characters of output kept as evidence


class Evidence(BaseModel):
    """What a check did: the command, its exit code (None if it did not run) and its output."""

    command: str
    exit_code: int | None
    tail: str
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


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
        return Evidence(command=command, exit_code=None, tail=f"refused: {refusal}")
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
        return Evidence(command=command, exit_code=None, tail=f"could not start: {exc}")
    output = result.stdout[-policy.max_output :].decode(errors="replace")
    return Evidence(
        command=command,
        exit_code=result.returncode,
        tail=output[-OUTPUT_TAIL:],
        seconds=round(time.monotonic() - started, 3),
    )
