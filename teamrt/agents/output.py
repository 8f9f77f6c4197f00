"""Typed answers: what a typed agent asks its model for, and how it checks the answer.

`OutputType(Invoice)` wraps any type a pydantic `TypeAdapter` takes (a `BaseModel`, a dataclass,
a `TypedDict`, `list[int]`, ...). It gives the answer's JSON schema to the model, either as an
`OutputSpec` for a model with structured output or as the parameters of the `final_answer` tool
for one that only does tools, and checks what comes back. A schema whose root is not an object
is wrapped as `{"value": ...}` (providers want an object at the root); the wrapper is removed
before validation.

Pure: no I/O. Checking an answer returns the value or raises `Rejected` with the validation
errors as one line, which the loop gives back to the model once.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticUserError

from teamrt.errors import UsageError
from teamrt.models.base import OutputSpec, ToolSpec

#: The tool a typed agent offers a model without structured output, to give its answer.
FINAL_TOOL = "final_answer"

_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)
_ERRORS_SHOWN = 5


class Rejected(Exception):
    """An answer that does not match the output type; the message says why, in one line."""


@dataclass(frozen=True)
class Accepted:
    """An answer that matched: the value, and its JSON text (what the report's `answer` and
    the journal keep)."""

    value: Any
    json: str


class OutputType:
    """A typed answer's type, its schema as sent, and the check of an answer.

    Answer = OutputType(Invoice)
    Answer.spec          # OutputSpec for a structured-output model
    Answer.tool_spec     # the final_answer tool for a model that only does tools
    Answer.check(text)   # Accepted(value, json), or raises Rejected
    """

    def __init__(self, type_: Any) -> None:
        if isinstance(type_, OutputType):
            type_ = type_.type
        self.type: Any = type_
        try:
            self.adapter: TypeAdapter[Any] = TypeAdapter(type_)
            schema = self.adapter.json_schema()
        except (PydanticUserError, TypeError, ValueError) as exc:
            raise UsageError(
                f"output_type {type_!r} cannot be used for a typed answer: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        self.name = _schema_name(type_, schema)
        self.description = str(schema.get("description", ""))  # a model's docstring
        self.wrapped = schema.get("type") != "object"
        self.schema = _wrap(schema) if self.wrapped else schema

    def __repr__(self) -> str:
        return f"OutputType({self.name})"

    @functools.cached_property
    def spec(self) -> OutputSpec:
        """The answer's schema as a structured-output model is asked for it."""
        return OutputSpec(name=self.name, description=self.description, json_schema=self.schema)

    @functools.cached_property
    def tool_spec(self) -> ToolSpec:
        """The `final_answer` tool, whose arguments are the answer."""
        return ToolSpec(
            name=FINAL_TOOL,
            description=(
                f"Give your final answer ({self.name}) by calling this tool once, when you are "
                f"done; its arguments are the answer. {self.description}"
            ).strip(),
            parameters=self.schema,
        )

    def check(self, text: str) -> Accepted:
        """The answer in `text` (JSON, or a final-answer tool call's arguments), validated.

        Lenient about the form, strict about the content: a JSON value in a Markdown code
        fence is taken out of it, and a wrapped type's value is accepted with or without its
        `{"value": ...}` wrapper. Raises `Rejected` with the errors (at most five) in one line.
        """
        match = _FENCE.match(text)
        raw = match.group(1) if match else text
        try:
            data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
        except (ValueError, RecursionError) as exc:
            raise Rejected(f"the answer is not JSON ({exc}): {text[:80]!r}") from None
        if self.wrapped and isinstance(data, dict) and set(data) == {"value"}:
            data = data["value"]
        try:
            value = self.adapter.validate_json(json.dumps(data))
        except ValidationError as exc:
            raise Rejected(_errors(exc)) from None
        return Accepted(value, self.dump(value))

    def dump(self, value: Any) -> str:
        """A value of the type as JSON text (by alias, so that it validates again)."""
        return self.adapter.dump_json(value, by_alias=True).decode()

    def load(self, text: str) -> Any:
        """A value from the JSON text `dump` made (or that a teammate sent back)."""
        return self.adapter.validate_json(text)

    def jsonable(self, value: Any) -> Any:
        """A value of the type as plain JSON data (for an envelope body)."""
        return json.loads(self.dump(value))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, refused when it is too big for one (`1e999`): taken as
    infinity, it would be accepted, then written out as `null`, which validates no more."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _errors(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:_ERRORS_SHOWN]:
        where = ".".join(str(p) for p in error["loc"]) or "the answer"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - _ERRORS_SHOWN
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    """`{"value": schema}` as an object schema; shared definitions stay at the root, where
    the `$ref`s point."""
    inner = dict(schema)
    defs = inner.pop("$defs", None)
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {"value": inner},
        "required": ["value"],
        "additionalProperties": False,
    }
    if defs is not None:
        wrapped["$defs"] = defs
    return wrapped


def _schema_name(type_: Any, schema: dict[str, Any]) -> str:
    """A name providers accept (letters, digits, `_` and `-`, at most 64): the type's."""
    title = schema.get("title")
    if not isinstance(title, str) or not title:
        plain = get_origin(type_) is None  # list[int] is named by its repr, not "list"
        title = (getattr(type_, "__name__", None) if plain else None) or repr(type_)
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", str(title)).strip("_")
    return (name or "answer")[:64]
