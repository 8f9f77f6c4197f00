"""Eval cases: an input for the agent or team under test, and the checks its answer must pass.

A cases file is JSON Lines, one case per line:

    {"id": "capital", "input": "What is the capital of France?",
     "checks": [{"kind": "contains", "text": "Paris"}]}

or a directory of `*.json` files (each one case, or a list of cases) and `*.jsonl` files, read
in name order. Blank lines and lines starting with `#` in a JSONL file are skipped. A case
without an `id` gets one from where it was read (`line-3`; in a directory `<file>-line-3`, or
the file's name for a `.json` file; `_` for what an id cannot hold). Everything is checked
when the file is read, before any case runs: a malformed line, an unknown check kind, a regular
expression that does not compile, a JSON schema that is not one, two cases with one id: each is
a `CaseError` naming the file and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from teamrt.errors import CaseError as CaseError
from teamrt.errors import InvalidName
from teamrt.names import validate_name
from teamrt.private_files import write_private

#: The note a check derived from a recorded run carries until the user edits it.
DERIVED = "derived from the recorded answer: edit to say what a right answer must have"


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Free text for the reader (e.g. that the check was derived from a recorded run).
    note: str | None = None


class Contains(_Check):
    """The answer contains `text` (`ignore_case` to compare without case)."""

    kind: Literal["contains"] = "contains"
    text: str = Field(min_length=1)
    ignore_case: bool = False

    def describe(self) -> str:
        return f"contains {self.text!r}" + (" (any case)" if self.ignore_case else "")


class NotContains(_Check):
    """The answer does not contain `text`."""

    kind: Literal["not_contains"] = "not_contains"
    text: str = Field(min_length=1)
    ignore_case: bool = False

    def describe(self) -> str:
        return f"does not contain {self.text!r}" + (" (any case)" if self.ignore_case else "")


class Equals(_Check):
    """The answer is `text`, leading and trailing white space aside."""

    kind: Literal["equals"] = "equals"
    text: str
    ignore_case: bool = False

    def describe(self) -> str:
        return f"equals {self.text!r}" + (" (any case)" if self.ignore_case else "")


class Regex(_Check):
    """`pattern` (Python `re` syntax) matches somewhere in the answer (`re.search`)."""

    kind: Literal["regex"] = "regex"
    pattern: str = Field(min_length=1)
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return pattern

    def describe(self) -> str:
        return f"matches /{self.pattern}/" + ("i" if self.ignore_case else "")


class JsonSchema(_Check):
    """The answer is JSON (a fenced ```json block is unwrapped) and valid against `schema`
    (any draft the `jsonschema` package knows; `$schema` picks one, else 2020-12)."""

    kind: Literal["json_schema"] = "json_schema"
    schema_: dict[str, Any] = Field(alias="schema")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _is_a_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        try:
            from jsonschema.exceptions import SchemaError
            from jsonschema.validators import validator_for
        except ImportError:  # checked again when the case runs, with how to install it
            return schema
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"not a JSON schema: {exc.message}") from None
        return schema

    def describe(self) -> str:
        title = self.schema_.get("title")
        return f"JSON matching {title!r}" if title else "JSON matching the schema"


class Command(_Check):
    """The shell command `run` exits 0. It runs in a new empty temporary directory, with the
    answer on its standard input and in `TEAMRT_ANSWER` (the input in `TEAMRT_INPUT`, the case's
    id in `TEAMRT_CASE`), and is killed (with everything it started) after `timeout` seconds."""

    kind: Literal["command"] = "command"
    run: str = Field(min_length=1)
    timeout: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    def describe(self) -> str:
        return f"command `{self.run}` exits 0"


class Judge(_Check):
    """A model (`teamrt eval --judge`) reads the input, the answer and `rubric`, and gives a
    verdict, pass or fail, with its reason."""

    kind: Literal["judge"] = "judge"
    rubric: str = Field(min_length=1)

    def describe(self) -> str:
        first = self.rubric.strip().splitlines()[0]
        return f"judge: {first[:60] + '...' if len(first) > 60 else first}"


Check = Annotated[
    Contains | NotContains | Equals | Regex | JsonSchema | Command | Judge,
    Field(discriminator="kind"),
]
CHECK_KINDS = ("contains", "not_contains", "equals", "regex", "json_schema", "command", "judge")


class Case(BaseModel):
    """One case: the `input` given to the target, the `checks` its answer must pass, and for a
    team, the `member` asked (default: `--member`, else the team's first teammate).

    `recorded` is what a recorded run answered, for a case made by `teamrt eval --from-run`
    (kept for the reader; the checks decide)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    input: str = Field(min_length=1)
    checks: tuple[Check, ...] = Field(min_length=1)
    member: str | None = None
    recorded: dict[str, Any] | None = None

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        try:  # a case's team (--runs DIR) is a directory named after it
            return validate_name(value, what="case id")
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @field_validator("member")
    @classmethod
    def _safe_member(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            return validate_name(value, what="member")
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    def to_json_line(self) -> str:
        """The case as one JSON line, as a cases file holds it (defaults left out)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["checks"] = [
            {"kind": c.kind, **c.model_dump(mode="json", by_alias=True, exclude_defaults=True)}
            for c in self.checks
        ]
        return json.dumps(data, ensure_ascii=False)


_CASES = TypeAdapter(Case)


def _problem(exc: ValidationError) -> str:
    """A pydantic error as one short clause: where in the case, and what."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "union_tag_invalid":
        message = f"unknown check kind (one of {', '.join(CHECK_KINDS)})"
    elif first["type"] == "too_short" and where == "checks":
        message = "a case needs at least one check"
    elif first["type"] == "union_tag_not_found":
        message = f"a check needs a `kind` (one of {', '.join(CHECK_KINDS)})"
    return f"{where}: {message}" if where else message


def _case(data: Any, where: str, default_id: str) -> Case:
    if not isinstance(data, dict):
        raise CaseError(f"{where}: a case is a JSON object, not {type(data).__name__}")
    try:
        return _CASES.validate_python({"id": default_id, **data})
    except ValidationError as exc:
        raise CaseError(f"{where}: {_problem(exc)}") from None


def _default_id(where: str) -> str:
    """An id from where a case without one was read (a file's name, a line): the characters
    an id cannot hold become `_`, within 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", where).lstrip("_-")[:64] or "case"


def _from_jsonl(path: Path, *, in_directory: bool = False) -> list[Case]:
    """A JSON Lines file's cases; one without an id is `line-<n>`, or `<file>-line-<n>` in a
    directory of case files (where every file has a line 1)."""
    cases = []
    prefix = f"{_default_id(path.stem)}-" if in_directory else ""
    for number, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CaseError(f"{path}:{number}: not JSON ({exc.msg}, column {exc.colno})") from None
        cases.append(_case(data, f"{path}:{number}", f"{prefix}line-{number}"))
    return cases


def _from_json(path: Path) -> list[Case]:
    try:
        data = json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise CaseError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    name = _default_id(path.stem)
    if isinstance(data, list):
        return [_case(item, f"{path} (case {i})", f"{name}-{i}") for i, item in enumerate(data, 1)]
    return [_case(data, str(path), name)]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte order mark is not a case
    except UnicodeDecodeError:
        raise CaseError(f"{path}: not UTF-8 text") from None


def load_cases(source: str | Path) -> list[Case]:
    """The cases in a JSONL file, or in a directory of `*.json` and `*.jsonl` files.

    Raises `CaseError` (a `UsageError`) naming the file and line of the first problem, and for
    a missing path, an empty file or two cases with the same id."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
        if not files:
            raise CaseError(f"{path}: no case files (*.json, *.jsonl) in this directory")
        cases = [
            c
            for f in files
            for c in (_from_jsonl(f, in_directory=True) if f.suffix == ".jsonl" else _from_json(f))
        ]
    elif path.is_file():
        cases = _from_json(path) if path.suffix == ".json" else _from_jsonl(path)
    else:
        raise CaseError(f"{path}: no such file or directory (give a .jsonl file or a directory)")
    if not cases:
        raise CaseError(f"{path}: no cases in it")
    check_unique(cases, str(path))
    return cases


def check_unique(cases: Iterable[Case], where: str) -> None:
    """Raise `CaseError` if two cases share an id (a comparison matches cases by id)."""
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise CaseError(f"{where}: two cases have the id {case.id!r}; ids must be unique")
        seen.add(case.id)


def write_cases(cases: Sequence[Case], path: str | Path) -> None:
    """Write `cases` as a JSONL cases file (one case per line)."""
    write_private(path, "".join(c.to_json_line() + "\n" for c in cases))
