"""Tool schemas for the Responses API's strict mode, and the nulls it brings back.

Strict mode wants every property required and `additionalProperties: false` on every object, so
an optional argument is sent as required-but-nullable; the model then writes `null` for an
argument it leaves out, and `drop_added_nulls` removes exactly those nulls again before the tool
sees them (so the tool's own default applies). Pure functions over JSON values: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

# keywords strict mode refuses, and which we cannot translate: such a schema is sent non-strict
_UNSUPPORTED = frozenset(
    {"patternProperties", "unevaluatedProperties", "propertyNames", "dependentSchemas", "not"}
)
_DROPPED = frozenset({"default"})  # strict mode refuses it; the tool applies its own default


class _NotStrict(Exception):
    """This schema cannot be expressed in strict mode."""


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of a tool's argument schema that strict mode accepts, or None when it cannot be made
    strict (free-form objects, tuple items, untyped properties): such a tool is sent with
    `strict: false` instead."""
    try:
        converted: dict[str, Any] = _strict(schema, top=True)
    except _NotStrict:
        return None
    return converted


def _strict(schema: Any, top: bool = False) -> Any:
    if not isinstance(schema, dict):
        raise _NotStrict
    if _UNSUPPORTED & schema.keys():
        raise _NotStrict
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED:
            continue
        if key in ("$defs", "definitions"):
            if not isinstance(value, dict):
                raise _NotStrict
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in ("anyOf", "oneOf", "allOf"):
            if not isinstance(value, list) or not value:
                raise _NotStrict
            # oneOf is not accepted; for arguments anyOf means the same in practice
            out["anyOf" if key == "oneOf" else key] = [_strict(sub) for sub in value]
        elif key == "items":
            out[key] = _strict(value)  # a list (tuple validation) is refused by _strict
        elif key not in ("properties", "required", "additionalProperties"):
            out[key] = value
    is_object = schema.get("type") == "object" or "properties" in schema
    if is_object:
        if schema.get("additionalProperties", False) is not False:
            raise _NotStrict  # a free-form mapping has no fixed property list
        if "properties" not in schema and not top and "additionalProperties" not in schema:
            raise _NotStrict  # any object at all (a tool without arguments is fine)
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise _NotStrict
        out["type"] = "object"
        out["properties"] = {
            name: _strict(sub) if name in required else _nullable(_strict(sub))
            for name, sub in properties.items()
        }
        out["required"] = list(properties)
        out["additionalProperties"] = False
    elif not ({"type", "$ref", "anyOf", "allOf", "enum", "const"} & out.keys()):
        raise _NotStrict  # an untyped value: strict mode needs a type
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if _allows_null(schema):
        return schema
    kind = schema.get("type")
    if isinstance(kind, str) and "enum" not in schema:
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in schema:
        return {**schema, "type": [*kind, "null"]}
    if "anyOf" in schema and len(schema) == 1:
        return {"anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def _allows_null(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if "enum" in schema and isinstance(schema["enum"], list) and None in schema["enum"]:
        return True
    branches = schema.get("anyOf", schema.get("oneOf"))
    return isinstance(branches, list) and any(_allows_null(b) for b in branches)


def drop_added_nulls(arguments: str, schema: dict[str, Any]) -> str:
    """The arguments without the nulls strict mode made the model write for optional properties
    whose own schema does not allow null. Anything else (including text that is not JSON) is
    returned exactly as written."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    defs = schema.get("$defs", schema.get("definitions", {}))
    cleaned, changed = _drop(value, schema, defs if isinstance(defs, dict) else {}, 0)
    return json.dumps(cleaned) if changed else arguments


def _drop(value: Any, schema: Any, defs: dict[str, Any], depth: int) -> tuple[Any, bool]:
    if depth > 32 or not isinstance(schema, dict):
        return value, False
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        return _drop(value, defs.get(ref.rsplit("/", 1)[1]), defs, depth + 1)
    if isinstance(value, list):
        changed = False
        items = []
        for item in value:
            item, dropped = _drop(item, schema.get("items"), defs, depth + 1)
            items.append(item)
            changed |= dropped
        return items, changed
    properties = schema.get("properties")
    if not isinstance(value, dict) or not isinstance(properties, dict):
        return value, False
    required = schema.get("required", [])
    out: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        sub = properties.get(key)
        if item is None and key not in required and sub is not None and not _allows_null(sub):
            changed = True
            continue
        out[key], dropped = _drop(item, sub, defs, depth + 1)
        changed |= dropped
    return out, changed
