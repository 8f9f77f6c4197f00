"""A teammate in a child process with OpenTelemetry on, recording its spans in memory and
writing them to a file when it stops: `python tests/support/otel_child.py DIR OUT`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from teamrt import FileMailboxes, telemetry
from teamrt.team import Team

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.* imports
from tests.support.remote_specs import looker


async def main(directory: str, out: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.enable(provider)
    async with (
        FileMailboxes(directory) as mail,
        Team(mail, [looker], lead_here=False) as team,
    ):
        Path(out + ".ready").touch()
        await team.wait()
    spans = [
        {
            "name": s.name,
            "trace": format(s.context.trace_id, "032x"),
            "span": format(s.context.span_id, "016x"),
            "parent": format(s.parent.span_id, "016x") if s.parent else None,
            "attributes": dict(s.attributes or {}),
        }
        for s in exporter.get_finished_spans()
    ]
    Path(out).write_text(json.dumps(spans, default=str))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
