"""Tools: plain functions, described to the model by a JSON schema from their type hints.

    @tool
    def check_inventory(sku: str) -> dict[str, int]:
        "How many of `sku` are in stock."
        ...

Arguments are validated against the schema before the function runs, so it never sees bad
input; a validation error, an exception raised by the tool, or an unknown tool name goes back to
the model as data (`{"error": "Type: message"}`), never as a crash. Output is capped in size.

Several calls in one model reply run concurrently unless a tool says `sequential=True`. A tool
that must not repeat a side effect when a run is resumed after a crash uses `current_call_id()`
as its idempotency key: a call that was in flight at a crash runs again with the same id.
A tool that writes to a system of its own can pass `current_fence()` along, the fencing token of
the lease its teammate runs under: it grows with every incarnation, so that system can refuse a
write carrying a token lower than one it has seen (a stale incarnation that was paused, lost its
lease and resumed mid-call).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, get_type_hints, overload

import anyio
import anyio.to_process
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from teamrt.errors import ToolCrashed, UsageError
from teamrt.models.base import ToolCall, ToolSpec

DEFAULT_MAX_OUTPUT = 8000  # characters of a tool result the model gets to see

# what `json.dumps(value, default=str, ensure_ascii=False)` makes, without a new encoder each time
_RESULT_JSON = json.JSONEncoder(default=str, ensure_ascii=False)
# the same encoder's C core, made per result (a fresh `markers` dict finds cycles) without the
# Python set-up `JSONEncoder.encode` does each time; None where the C accelerator is missing
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)


def _result_json(value: Any) -> str:
    """`json.dumps(value, default=str, ensure_ascii=False)`, byte for byte."""
    if _make_encoder is None:
        return _RESULT_JSON.encode(value)
    chunks = _make_encoder(
        {}, str, json.encoder.encode_basestring, None, ": ", ", ", False, False, True
    )
    return "".join(chunks(value, 0))


_current_call: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar(
    "teamrt_current_call", default=None
)


def current_call_id() -> str | None:
    """The id of the tool call running now (None outside a tool).

    Use it as an idempotency key for side effects: when a run resumes after a crash, a call
    that was in flight runs again with the same id, and calls that had finished do not run.
    """
    call = _current_call.get()
    return call.id if call is not None else None


_current_fence: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "teamrt_current_fence", default=None
)


def current_fence() -> int | None:
    """The fencing token of the lease the running tool's teammate holds (None outside a tool,
    or for an agent that runs under no lease, such as one run on its own).

    The token grows with every incarnation of the member. Before each tool call the teammate
    checks with the store that its lease is still held, and a call whose lease is lost does not
    run; what the check cannot stop is a call already running when the process was paused. A
    tool that writes somewhere else guards against that by sending the token with each write
    and having the other side refuse one lower than the highest it has seen.
    """
    return _current_fence.get()


class Fence(Protocol):
    """What an agent checks before each tool call: the lease it acts under."""

    @property
    def token(self) -> int:
        """The fencing token, shown to tools as `current_fence()`."""
        ...

    async def check(self) -> None:
        """Raise (`LeaseLost`) if the lease is lost: the call must not run."""
        ...


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced, as the text the model will read."""

    content: str
    ok: bool


def _error(kind: str, message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": f"{kind}: {message}"}), ok=False)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    is_async: bool
    thread: bool = False
    max_output: int = DEFAULT_MAX_OUTPUT
    sequential: bool = False  # never runs beside other calls of the same reply
    waits: bool = False  # waits for others (wait_for_messages): idle time, not lack of progress
    process: bool = False  # runs in a worker process, killed at a deadline
    gate: Callable[[], str | None] | None = None  # says why the tool may not run now, if so

    @functools.cached_property
    def spec(self) -> ToolSpec:
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    @functools.cached_property
    def _arg_names(self) -> tuple[str, ...]:
        return tuple(self.args_model.model_fields)

    def parse(self, arguments: str) -> BaseModel | ToolResult:
        """Validate the model's argument text; a `ToolResult` error if it does not fit."""
        try:
            return self.args_model.model_validate_json(arguments or "{}")
        except ValidationError as exc:
            return _error("ValidationError", _validation_message(exc))

    @functools.cached_property
    def inline(self) -> bool:
        """Whether a call runs on the event loop to its end without awaiting: a plain sync
        function (not `thread`, not `process`)."""
        return not (self.is_async or self.thread or self.process)

    async def call(self, args: BaseModel) -> ToolResult:
        """Run the tool on validated arguments; exceptions come back as an error result.

        A `BaseException` that is not cancellation (`SystemExit`, say) is not data for the
        model: it raises `ToolCrashed`, a crash of the agent. At a deadline, a `thread=True`
        tool is abandoned (Python cannot stop a thread: its late result is discarded) and a
        `process=True` tool's worker process is killed.
        """
        if self.inline:
            return self.call_now(args)
        if self.gate is not None and (refusal := self.gate()) is not None:
            return _error("PermissionError", refusal)
        kwargs = {name: getattr(args, name) for name in self._arg_names}
        try:
            if self.is_async:
                result = await self.fn(**kwargs)
            elif self.process:
                target = (self.fn.__module__, self.fn.__qualname__)
                result = await anyio.to_process.run_sync(
                    _run_in_process,
                    target,
                    kwargs,
                    _current_call.get(),
                    _current_fence.get(),
                    cancellable=True,
                )
            else:
                result = await anyio.to_thread.run_sync(
                    lambda: self.fn(**kwargs), abandon_on_cancel=True
                )
        except Exception as exc:  # the tool's failure is data for the model, by design
            return _error(type(exc).__name__, str(exc))
        except BaseException as exc:
            self._crashed(exc)
        if isinstance(result, _Exited):  # from a worker process, which stays alive
            raise ToolCrashed(f"tool {self.name} raised {result.kind}: {result.message}")
        return self._result(result)

    def call_now(self, args: BaseModel) -> ToolResult:
        """`call` for a plain sync function: run here, with no coroutine of its own."""
        if self.gate is not None and (refusal := self.gate()) is not None:
            return _error("PermissionError", refusal)
        kwargs = {name: getattr(args, name) for name in self._arg_names}
        try:
            result = self.fn(**kwargs)
        except Exception as exc:  # the tool's failure is data for the model, by design
            return _error(type(exc).__name__, str(exc))
        except BaseException as exc:
            self._crashed(exc)
        return self._result(result)

    def _crashed(self, exc: BaseException) -> NoReturn:
        """A `BaseException` out of the tool: a cancellation of this task goes on as it is;
        anything else (`SystemExit`, a cancellation the tool raised itself) is a crash."""
        if isinstance(exc, anyio.get_cancelled_exc_class()) and cancelled_for_real():
            raise exc
        raise ToolCrashed(f"tool {self.name} raised {type(exc).__name__}: {exc}") from exc

    def _result(self, result: Any) -> ToolResult:
        """The tool's return value as the model reads it; one that does not encode is the
        tool's failure, as data: a cycle (ValueError), a key JSON cannot have (TypeError), a
        nesting too deep (RecursionError), an object whose `str()` fails (its own error)."""
        try:
            return ToolResult(self._render(result), ok=True)
        except Exception as exc:
            return _error(type(exc).__name__, f"the result could not be encoded as JSON: {exc}")

    def _render(self, result: Any) -> str:
        if isinstance(result, str):
            text = result
        elif isinstance(result, BaseModel):
            text = result.model_dump_json()
        else:
            text = _result_json(result)
        if len(text) > self.max_output:
            dropped = len(text) - self.max_output
            text = f"{text[: self.max_output]}... [cut {dropped} of {len(text)} characters]"
        return text


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = False,
    max_output: int = DEFAULT_MAX_OUTPUT,
    sequential: bool = False,
    waits: bool = False,
    process: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    thread: bool = False,
    max_output: int = DEFAULT_MAX_OUTPUT,
    sequential: bool = False,
    waits: bool = False,
    process: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function (sync or async) into a `Tool`. Use bare (`@tool`) or with options.

    `thread=True` runs a sync function in a worker thread (for blocking I/O); otherwise a sync
    tool runs on the event loop and should be quick. `sequential=True` keeps the tool from
    running beside other calls of the same model reply (calls before it finish first, calls
    after it wait). `waits=True` marks a tool that waits for other agents: its time counts as
    idle time (`Limits.max_idle`) and an empty answer is not a lack of progress.
    `process=True` runs a sync function in a worker process, which is killed when the run's
    deadline passes or the teammate is stopped (the function must be defined at the top level
    of a module, and its arguments and result must pickle).
    """

    def make(fn: Callable[..., Any]) -> Tool:
        if process and (inspect.iscoroutinefunction(fn) or "<locals>" in fn.__qualname__):
            raise UsageError(
                f"tool {fn.__name__}: process=True needs a plain function defined at the top "
                "level of a module"
            )
        signature = inspect.signature(fn)
        hints = _type_hints(fn)
        fields: dict[str, Any] = {}
        for param in signature.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise UsageError(f"tool {fn.__name__}: *args and **kwargs cannot be described")
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        args_model = _arguments_model(fn, fields)
        doc = inspect.getdoc(fn) or ""
        return Tool(
            name=name or fn.__name__,
            description=description or doc.split("\n\n")[0].replace("\n", " "),
            fn=fn,
            args_model=args_model,
            is_async=inspect.iscoroutinefunction(fn),
            thread=thread,
            max_output=max_output,
            sequential=sequential,
            waits=waits,
            process=process,
        )

    return make(fn) if fn is not None else make


#: Arguments models by function code and fields, and type hints by function code: a team makes
#: the same messaging tools (closures of one function) for each of its members, and they share
#: one arguments model rather than each making its own. Each cache starts afresh past `_KEPT`
#: entries.
_ARGUMENT_MODELS: dict[tuple[Any, ...], type[BaseModel]] = {}
_KEPT = 1024
_HINTS: dict[Any, tuple[Any, dict[str, Any], dict[str, Any]]] = {}


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """`get_type_hints(fn)`, kept per function code: closures of one function share their
    module and, unless one was changed, their annotations. The module is the one
    `get_type_hints` resolves names in: the wrapped function's, for a `functools.wraps`
    wrapper (one code for every function its decorator wraps)."""
    code = getattr(fn, "__code__", None)
    annotations = getattr(fn, "__annotations__", None)
    inner = inspect.unwrap(fn)
    module = getattr(inner, "__globals__", None)
    kept = _HINTS.get(code) if code is not None else None
    if kept is not None and kept[0] is module and kept[1] == annotations:
        return kept[2]
    hints = get_type_hints(fn)
    if code is not None and isinstance(annotations, dict):
        if len(_HINTS) >= _KEPT:
            _HINTS.clear()
        _HINTS[code] = (module, dict(annotations), hints)
    return hints


def _arguments_model(fn: Callable[..., Any], fields: dict[str, Any]) -> type[BaseModel]:
    """The model of `fn`'s arguments (fields: name -> (annotation, default)), shared by every
    function of the same code and the same fields. Defaults match by type, value and repr:
    equal ones can differ (`(1,) == (True,)`, `0.0 == -0.0`), and the model hands its own out."""
    code = getattr(fn, "__code__", None)
    try:
        key = (
            code,
            fn.__name__,
            tuple((n, a, type(d), d, repr(d)) for n, (a, d) in fields.items()),
        )
        found = _ARGUMENT_MODELS.get(key) if code is not None else None
    except Exception:  # an unhashable default or annotation (or a repr that fails): made afresh
        code = None
        found = None
    if found is not None:
        return found
    model = create_model(
        f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    if code is not None:
        if len(_ARGUMENT_MODELS) >= _KEPT:
            _ARGUMENT_MODELS.clear()
        _ARGUMENT_MODELS[key] = model
    return model


def cancelled_for_real() -> bool:
    """Whether this task is being cancelled (a deadline, a shutdown), as opposed to a tool
    raising a cancellation exception of its own, which is a fault of that tool."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio: trust the exception
        return True
    return task is None or task.cancelling() > 0


def _run_in_process(
    target: tuple[str, str],
    kwargs: dict[str, Any],
    call: ToolCall | None = None,
    fence: int | None = None,
) -> Any:
    """In a worker process: find a `process=True` tool's function by name and call it, with
    the call's id as `current_call_id()` and its fencing token as `current_fence()`."""
    module, qualname = target
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    fn = found.fn if isinstance(found, Tool) else found
    token = _current_call.set(call)
    fence_token = _current_fence.set(fence)
    try:
        return fn(**kwargs)
    except Exception:
        raise  # pickled back to the parent, which makes it data for the model
    except BaseException as exc:  # SystemExit and the like: keep the worker process alive
        return _Exited(type(exc).__name__, str(exc))
    finally:
        _current_fence.reset(fence_token)
        _current_call.reset(token)


@dataclass(frozen=True)
class _Exited:
    """What a `process=True` tool's worker sends back when the tool raised a BaseException."""

    kind: str
    message: str


class Toolbox:
    """The tools an agent has, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item if isinstance(item, Tool) else tool(item))

    def add(self, item: Tool) -> None:
        if item.name in self._tools:
            raise UsageError(f"two tools are named {item.name!r}")
        self._tools[item.name] = item

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    async def run(self, call: ToolCall) -> ToolResult:
        """Validate and run one call; every failure comes back as an error result."""
        found = self._tools.get(call.name)
        if found is None:
            available = ", ".join(self._tools) or "none"
            return _error("UnknownTool", f"no tool named {call.name!r}; available: {available}")
        if found.inline:
            return self.run_now(call, found)
        args = found.parse(call.arguments)
        if isinstance(args, ToolResult):
            return args
        token = _current_call.set(call)
        try:
            return await found.call(args)
        finally:
            _current_call.reset(token)

    def run_now(self, call: ToolCall, found: Tool) -> ToolResult:
        """`run` for a call of `found`, a plain sync tool (`Tool.inline`): nothing to await."""
        args = found.parse(call.arguments)
        if isinstance(args, ToolResult):
            return args
        token = _current_call.set(call)
        try:
            return found.call_now(args)
        finally:
            _current_call.reset(token)


ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]
