"""Pydantic models of teamrt's own, built from values that are valid already.

The agent loop makes a few models every step from parts that were validated before: a tool's
result text, the fields of a validated reply, two usages' sums. Validating them again costs more
than the rest of their making, so `assemble` fills a new instance the way `model_construct`
does, without its per-field Python loop (about 0.5 us against 1.1 us validated, or 3 us through
`model_construct`). It is for models without private attributes, extra fields or a post-init
hook; the caller passes every field, in the declared order, and the fields it was given.
Where this pydantic keeps more per instance than the four slots known here, it is
`model_construct`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")

if getattr(BaseModel, "__slots__", ()) == _SLOTS:
    _new = object.__new__
    # the slots' own setters: BaseModel.__setattr__ would refuse a frozen model
    _set_dict, _set_fields_set, _set_extra, _set_private = (
        BaseModel.__dict__[name].__set__ for name in _SLOTS
    )

    def assemble(cls: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
        """A `cls` holding `values` (every field, valid), with `fields_set`, a set of the
        caller's own, which it keeps."""
        model: M = _new(cls)
        _set_dict(model, values)
        _set_fields_set(model, fields_set)
        _set_extra(model, None)
        _set_private(model, None)
        return model

    def assemble_copy(cls: type[M], values: dict[str, Any], fields_set: Iterable[str]) -> M:
        """`assemble` with a copy of `fields_set` (one that is shared, a frozenset say)."""
        model: M = _new(cls)
        _set_dict(model, values)
        _set_fields_set(model, set(fields_set))
        _set_extra(model, None)
        _set_private(model, None)
        return model

else:  # pragma: no cover - a pydantic this was not written for

    def assemble(cls: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
        """A `cls` holding `values` (every field, valid), with `fields_set` as given."""
        return cls.model_construct(fields_set, **values)

    def assemble_copy(cls: type[M], values: dict[str, Any], fields_set: Iterable[str]) -> M:
        """`assemble` with a copy of `fields_set`."""
        return cls.model_construct(set(fields_set), **values)
