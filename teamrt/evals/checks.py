"""Running a case's checks against its answer: each gives a `CheckResult`, pass or fail with
a one-line reason. A check never raises: a command that cannot start, a judge that fails or
answers nonsense, an answer that is not JSON, all fail the check, saying why."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ValidationError

from teamrt.errors import TeamrtError, UsageError
from teamrt.evals.cases import (
    Case,
    Command,
    Contains,
    Equals,
    JsonSchema,
    Judge,
    NotContains,
    Regex,
)
from teamrt.evals.cases import Check as AnyCheck
from teamrt.models.base import ChatMessage, Model, ToolSpec

#: What of an answer a failure's detail quotes.
QUOTE = 80
#: The answer goes into `TEAMRT_ANSWER` only up to this many bytes (the kernel refuses larger
#: variables) and without a NUL (which no variable can hold); another is on standard input
#: alone, and the variable is empty. So does the input in `TEAMRT_INPUT`.
ENV_LIMIT = 100_000
#: How long a judge may take to give its verdict.
JUDGE_TIMEOUT = 120.0


class CheckResult(BaseModel):
    """How one check went: its kind, what it checks, pass or fail, and why."""

    kind: str
    check: str  # what it checks, e.g. "contains 'Paris'"
    passed: bool
    detail: str = ""  # why it failed (or the judge's reason)
    note: str | None = None  # the check's own note, e.g. that it was derived from a recording
    tokens: int = 0  # a judge's: the tokens its verdict took


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= QUOTE else flat[: QUOTE - 3] + "...")


def _fold(text: str, ignore_case: bool) -> str:
    return text.casefold() if ignore_case else text


def _text_check(check: Contains | NotContains | Equals | Regex, answer: str) -> tuple[bool, str]:
    if isinstance(check, Regex):
        flags = re.IGNORECASE if check.ignore_case else 0
        if re.search(check.pattern, answer, flags | re.MULTILINE):
            return True, ""
        return False, f"no match in the answer {_quote(answer)}"
    if isinstance(check, Equals):
        if _fold(answer.strip(), check.ignore_case) == _fold(check.text.strip(), check.ignore_case):
            return True, ""
        return False, f"the answer is {_quote(answer)}"
    found = _fold(check.text, check.ignore_case) in _fold(answer, check.ignore_case)
    if isinstance(check, Contains):
        return found, "" if found else f"not in the answer {_quote(answer)}"
    return not found, "" if not found else f"found in the answer {_quote(answer)}"


_FENCE = re.compile(r"^```[\w-]*\s*\n(.*?)\n?```$", re.S)


def answer_json(answer: str) -> Any:
    """The answer parsed as JSON; a fenced block (```json ... ```) is unwrapped first.
    Raises `ValueError` saying why it is not JSON."""
    text = answer.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    return json.loads(text)


def _schema_check(check: JsonSchema, answer: str) -> tuple[bool, str]:
    try:
        from jsonschema.exceptions import best_match
        from jsonschema.validators import validator_for
        from referencing.exceptions import Unresolvable  # jsonschema's own dependency
    except ImportError:
        raise UsageError(
            "json_schema checks need the jsonschema package: pip install 'teamrt[eval]'"
        ) from None
    try:
        value = answer_json(answer)
    except ValueError as exc:
        return False, f"the answer is not JSON ({exc}): {_quote(answer)}"
    validator = validator_for(check.schema_)(check.schema_)
    try:
        error = best_match(validator.iter_errors(value))
    except Unresolvable as exc:  # another document (never fetched), or a missing definition
        return False, f"the schema's $ref cannot be resolved: {exc.ref}"
    if error is None:
        return True, ""
    where = "/".join(str(p) for p in error.absolute_path) or "(the whole answer)"
    return False, f"{where}: {error.message}"


async def _command_check(check: Command, answer: str, case: Case) -> tuple[bool, str]:
    data = answer.encode()
    env = {
        **os.environ,
        "TEAMRT_ANSWER": _variable(answer),
        "TEAMRT_INPUT": _variable(case.input),
        "TEAMRT_CASE": case.id,
    }
    output = bytearray()
    with tempfile.TemporaryDirectory(prefix="teamrt-check-") as workdir:
        try:
            process = await anyio.open_process(
                check.run,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,  # its own group: a timeout kills what it started too
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the command
            return False, f"could not start: {exc}"
        async with process:
            with anyio.move_on_after(check.timeout) as deadline:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_feed, process, data)
                    tg.start_soon(_drain, process, output)
                code = await process.wait()
            if deadline.cancelled_caught:
                _kill_group(process.pid)
                with anyio.CancelScope(shield=True):
                    await process.wait()
                return False, f"timed out after {check.timeout:g}s{_tail(output)}"
    if code == 0:
        return True, ""
    how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"
    return False, how + _tail(output)


def _variable(text: str) -> str:
    """`text` as an environment variable's value, or empty when it cannot be one: longer than
    `ENV_LIMIT` bytes, or holding a NUL."""
    return text if len(text.encode()) <= ENV_LIMIT and "\0" not in text else ""


async def _feed(process: Any, data: bytes) -> None:
    try:
        await process.stdin.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # it did not read all of it: its exit status says what it thought
    finally:
        await process.stdin.aclose()


async def _drain(process: Any, output: bytearray) -> None:
    async for chunk in process.stdout:
        output += chunk
        del output[:-4096]  # keep the end: that is where a failure says why


def _tail(output: bytearray) -> str:
    lines = [ln for ln in output.decode(errors="replace").splitlines() if ln.strip()]
    return f": {' | '.join(lines[-3:])[-300:]}" if lines else ""


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- the judge --------------------------------------------------------------------------------

JUDGE_INSTRUCTIONS = (
    "You grade the answer an AI agent gave to a task, against a rubric. Judge only by the "
    "rubric. Give your verdict by calling the `verdict` tool once, with verdict 'pass' or "
    "'fail' and a one-sentence reason. If you cannot call tools, answer with only a JSON "
    'object: {"verdict": "pass" or "fail", "reason": "..."}.'
)
VERDICT_TOOL = ToolSpec(
    name="verdict",
    description="Give the verdict: does the answer meet the rubric?",
    parameters={
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "reason": {"type": "string", "description": "one sentence: why"},
        },
        "required": ["verdict", "reason"],
        "additionalProperties": False,
    },
)


class Verdict(BaseModel):
    """A judge's structured verdict."""

    verdict: Literal["pass", "fail"]
    reason: str


def judge_messages(case: Case, answer: str, rubric: str) -> list[ChatMessage]:
    """What the judge is sent: its instructions, then the task, the answer and the rubric."""
    return [
        ChatMessage.system(JUDGE_INSTRUCTIONS),
        ChatMessage.user(
            f"The task given to the agent:\n{case.input}\n\n"
            f"The agent's answer:\n{answer}\n\n"
            f"The rubric:\n{rubric}"
        ),
    ]


def parse_verdict(arguments: str) -> Verdict:
    """A verdict from the judge's tool arguments or its text: a JSON object, perhaps inside
    other text or a fenced block. Raises `ValueError` when there is none."""
    start, end = arguments.find("{"), arguments.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in it")
    try:
        data = json.loads(arguments[start : end + 1])
        if isinstance(data, dict) and isinstance(data.get("verdict"), str):
            data["verdict"] = data["verdict"].strip().lower()
        return Verdict.model_validate(data)
    except (ValueError, ValidationError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


async def _judge_check(
    check: Judge, answer: str, case: Case, judge: Model | None
) -> tuple[bool, str, int]:
    if judge is None:
        raise UsageError(
            f"case {case.id} has a judge check: name the judge model with --judge "
            "(openai, or module:object)"
        )
    try:
        with anyio.fail_after(JUDGE_TIMEOUT):
            reply = await judge.complete(judge_messages(case, answer, check.rubric), [VERDICT_TOOL])
    except TimeoutError:
        return False, f"the judge gave no verdict within {JUDGE_TIMEOUT:g}s", 0
    except TeamrtError as exc:
        return False, f"the judge failed: {exc}", 0
    except Exception as exc:  # a judge of the user's own (module:object) that raised
        return False, f"the judge failed: {type(exc).__name__}: {exc}", 0
    tokens = reply.usage.total_tokens
    said = next((c.arguments for c in reply.tool_calls if c.name == "verdict"), reply.text or "")
    try:
        verdict = parse_verdict(said)
    except ValueError as exc:
        return False, f"the judge's reply is not a verdict ({exc}): {_quote(said)}", tokens
    return verdict.verdict == "pass", verdict.reason, tokens


async def run_check(
    check: AnyCheck, answer: str, case: Case, judge: Model | None = None
) -> CheckResult:
    """Run one check on `answer` (the answer `case` got)."""
    tokens = 0
    if isinstance(check, JsonSchema):
        passed, detail = _schema_check(check, answer)
    elif isinstance(check, Command):
        passed, detail = await _command_check(check, answer, case)
    elif isinstance(check, Judge):
        passed, detail, tokens = await _judge_check(check, answer, case, judge)
    else:
        passed, detail = _text_check(check, answer)
    return CheckResult(
        kind=check.kind,
        check=check.describe(),
        passed=passed,
        detail=detail,
        note=check.note,
        tokens=tokens,
    )


async def run_checks(case: Case, answer: str, judge: Model | None = None) -> list[CheckResult]:
    """Every check of `case`, in order."""
    return [await run_check(check, answer, case, judge) for check in case.checks]


def needs_judge(cases: Sequence[Case]) -> bool:
    """Whether any of `cases` has a judge check."""
    return any(isinstance(c, Judge) for case in cases for c in case.checks)
