from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="run the process and crash tests at their larger sizes",
    )


@pytest.fixture
def stress(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--stress"))
