"""`module:object` specs: how the command line names a user's Python object (a teammate, a
team, an eval target, a judge) without teamrt importing the user's code itself."""

from __future__ import annotations

import importlib
from typing import Any

from teamrt.errors import TeamrtError, UsageError


def load_object(spec: str, option: str, example: str) -> Any:
    """The object `spec` (`module:object`, the object may be dotted: `module:Class.attr`) names,
    for the command-line option `option`. A spec that names nothing is a `UsageError` (with
    `example` as a well-formed one); a module that fails to import is a `TeamrtError` saying
    why."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{option} {spec!r} must be module:object, e.g. {example}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(
                f"{option} {spec}: no module named {exc.name!r}; check the spelling, and that "
                "it is importable from here (installed, or on PYTHONPATH)"
            ) from None
        raise TeamrtError(f"{option} {spec}: importing {module_name} failed: {exc}") from None
    except Exception as exc:
        raise TeamrtError(
            f"{option} {spec}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    value: Any = module
    for part in attribute.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise UsageError(f"{option} {spec}: module {module_name} has no {attribute!r}")
    return value
