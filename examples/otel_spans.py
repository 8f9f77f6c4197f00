"""OpenTelemetry: spans for each task, agent run, model call, tool call and envelope sent.

Needs the SDK: pip install 'teamrt[otel]'. Here the spans go to the console's exporter; point
a TracerProvider at your collector instead. (The teamrt commands take TEAMRT_OTEL=1.)
Run it: python examples/otel_spans.py
"""

import anyio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from teamrt import MemoryMailboxes, ScriptedModel, Team, Teammate, call, telemetry, tool


@tool
def check_stock(sku: str) -> dict[str, int]:
    """How many of a SKU are in stock."""
    return {"quantity": 14}


async def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.enable(provider)

    clerk = Teammate(
        "clerk", ScriptedModel([call("check_stock", sku="EARBUDS"), "14."]), tools=[check_stock]
    )
    async with MemoryMailboxes() as mail, Team(mail, [clerk]) as team:
        await team.ask("clerk", "How many earbuds?", timeout=30)
    provider.shutdown()
    for span in exporter.get_finished_spans():
        print(span.name)  # send task, task clerk, invoke_agent clerk, chat ..., execute_tool ...


if __name__ == "__main__":
    anyio.run(main)
