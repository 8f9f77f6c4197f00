from __future__ import annotations

import os

import pytest

from teamrt.models import set_model_requests_allowed


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="run the process and crash tests at their larger sizes",
    )


@pytest.fixture
def stress(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--stress"))


# No test may call a real model by accident: adapters refuse unless a test allows it explicitly
# (the OpenAI adapter's tests do, against a server they start on 127.0.0.1).
os.environ["TEAMRT_ALLOW_MODEL_REQUESTS"] = "0"
set_model_requests_allowed(False)
