"""OpenTelemetry spans for teams, agent runs, model calls, tool calls and envelopes (optional).

Off by default, and then each hook is one check of `enabled()`. `enable()` (with the `otel` extra,
`pip install 'teamrt[otel]'`) takes the global tracer provider, or the one given; from then on:

- `task <member>`: a teammate handling a task (its parent is the span that sent the task);
- `invoke_agent <agent>`: one agent run;
- `chat <model>`: one model call, with the GenAI semantic conventions (`gen_ai.request.model`,
  `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`);
- `execute_tool <tool>`: one tool call (`gen_ai.tool.name`, `gen_ai.tool.call.id`);
- `send <type>`: one envelope appended to an inbox (`messaging.destination.name`, ...).

The span context travels in each envelope's `traceparent` field (W3C Trace Context), so the spans
of a task handed to a teammate in another process join the sender's trace. Set `TEAMRT_OTEL=1`
to enable it in `teamrt` commands (`run-agent`), which then use the globally configured provider.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

_tracer: Any = None  # an opentelemetry Tracer once enabled
_propagator: Any = None


def enable(provider: Any = None) -> None:
    """Start making spans, with `provider` (an `opentelemetry.trace.TracerProvider`) or the
    global one."""
    global _tracer, _propagator
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        from teamrt.errors import UsageError

        raise UsageError("OpenTelemetry is not installed: pip install 'teamrt[otel]'") from None
    _tracer = (provider or trace.get_tracer_provider()).get_tracer("teamrt")
    _propagator = TraceContextTextMapPropagator()


def disable() -> None:
    """Stop making spans."""
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def enable_from_env() -> None:
    """`TEAMRT_OTEL=1`: enable with the global provider (for the `teamrt` commands)."""
    if os.environ.get("TEAMRT_OTEL", "") not in ("", "0"):
        enable()


@contextlib.contextmanager
def span(
    name: str, attributes: dict[str, Any] | None = None, *, parent: str | None = None
) -> Iterator[Any]:
    """A span around the block (None when telemetry is off); `parent`: a `traceparent` from an
    envelope, for a span whose cause is in another task or process."""
    if _tracer is None:
        yield None
        return
    context = _propagator.extract({"traceparent": parent}) if parent else None
    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    with _tracer.start_as_current_span(name, context=context, attributes=clean) as current:
        yield current


def traceparent() -> str | None:
    """The current span's context as a W3C `traceparent` value (None when off or outside one)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def annotate(current: Any, **attributes: Any) -> None:
    """Set attributes on a span from `span()` (nothing when telemetry is off)."""
    if current is not None:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(key.replace("__", "."), value)
