from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from teamrt import telemetry
from teamrt.models import set_model_requests_allowed
from tests.support import hypothesis_profiles

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="run the tests marked stress (benchmarks, long stress runs) and the process and "
        "crash tests at their larger sizes (make test-slow, make test-all)",
    )


#: A stress test's timeout unless it sets its own: benchmarks run for their rounds whatever the
#: load, so the per-test 60 s (there to catch a hang) would fail them on a busy machine.
STRESS_TIMEOUT = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked stress run only with --stress: the quick suite (`make test`) leaves them out."""
    run = config.getoption("--stress")
    skip = pytest.mark.skip(reason="a stress test (a benchmark or a long run): run with --stress")
    for item in items:
        if item.get_closest_marker("stress") is None:
            continue
        if not run:
            item.add_marker(skip)
        elif item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(STRESS_TIMEOUT))


@pytest.fixture
def stress(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--stress"))


# `fast` unless asked (tests/support/hypothesis_profiles.py); --hypothesis-profile overrides it
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", hypothesis_profiles.FAST))

# No test may call a real model by accident: adapters refuse unless a test allows it explicitly
# (the OpenAI adapter's tests do, against a server they start on 127.0.0.1).
os.environ["TEAMRT_ALLOW_MODEL_REQUESTS"] = "0"
set_model_requests_allowed(False)


@contextlib.contextmanager
def spans_in_memory() -> Iterator[InMemorySpanExporter]:
    """Telemetry on, its finished spans kept in memory; off again after."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    telemetry.enable(provider)
    try:
        yield memory
    finally:
        telemetry.disable()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Telemetry on for the test, its finished spans kept in memory."""
    with spans_in_memory() as memory:
        yield memory
