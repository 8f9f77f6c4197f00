"""Strict-mode tool schemas for the Responses API, and the nulls they bring back."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from teamrt.agents import tool
from teamrt.models.strict_schema import drop_added_nulls, strict_schema


class Address(BaseModel):
    street: str
    zip: str | None = None
    floor: int = 0


@tool
def ship(
    name: str,
    where: Address,
    tags: list[Address],
    mode: Literal["air", "sea"] = "sea",
    note: str | None = None,
    count: int = 1,
) -> str:
    """Ship something."""
    return name


def assert_strict(schema: Any) -> None:
    """What strict mode asks of every object: all properties required, nothing else allowed,
    no defaults."""
    if isinstance(schema, dict):
        assert "default" not in schema
        if schema.get("type") == "object":
            assert schema["additionalProperties"] is False
            assert schema["required"] == list(schema["properties"])
        for value in schema.values():
            assert_strict(value)
    elif isinstance(schema, list):
        for value in schema:
            assert_strict(value)


def test_a_tool_schema_is_made_strict_with_optional_arguments_nullable() -> None:
    original = ship.spec.parameters
    strict = strict_schema(original)
    assert strict is not None
    assert_strict(strict)
    props = strict["properties"]
    assert props["count"]["type"] == ["integer", "null"]
    assert {"type": "null"} in props["mode"]["anyOf"]  # an enum gains null beside it
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Note"}
    assert props["where"] == {"$ref": "#/$defs/Address"}  # required: unchanged
    address = strict["$defs"]["Address"]["properties"]
    assert address["floor"]["type"] == ["integer", "null"]
    assert original["required"] == ["name", "where", "tags"]  # the original is not touched


def test_a_tool_without_arguments_is_strict() -> None:
    assert strict_schema({"type": "object"}) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_schemas_that_cannot_be_strict() -> None:
    mapping = {
        "type": "object",
        "properties": {"m": {"type": "object", "additionalProperties": {}}},
    }
    assert strict_schema(mapping) is None
    assert strict_schema({"type": "object", "properties": {"x": {}}}) is None  # untyped
    assert (
        strict_schema({"type": "object", "properties": {"t": {"type": "array", "items": [{}]}}})
        is None
    )
    assert (
        strict_schema({"type": "object", "patternProperties": {"^x": {"type": "string"}}}) is None
    )


def test_nulls_added_for_optional_arguments_are_dropped_everywhere() -> None:
    schema = ship.spec.parameters
    written = {
        "name": "box",
        "where": {"street": "Main St", "zip": None, "floor": None},
        "tags": [{"street": "a", "zip": "1", "floor": None}],
        "mode": None,
        "note": None,
        "count": None,
    }
    cleaned = json.loads(drop_added_nulls(json.dumps(written), schema))
    assert cleaned == {
        "name": "box",
        "where": {"street": "Main St", "zip": None},  # zip allows null: kept as written
        "tags": [{"street": "a", "zip": "1"}],
        "note": None,
    }
    args = ship.parse(json.dumps(cleaned))
    assert isinstance(args, BaseModel)  # the tool's own validation takes them
    assert args.model_dump()["count"] == 1 and args.model_dump()["mode"] == "sea"

    # without the drop, the tool would refuse them
    assert not isinstance(ship.parse(json.dumps(written)), BaseModel)


def test_arguments_without_added_nulls_are_kept_verbatim() -> None:
    schema = ship.spec.parameters
    for text in ('{"name":  "x"}', '{"name": "x", "note": null}', "not json", "[1, 2]"):
        assert drop_added_nulls(text, schema) == text
