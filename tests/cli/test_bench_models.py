"""`teamrt bench --only models`: the adapter beside the bare openai client, on a local server."""

from __future__ import annotations

from pathlib import Path

import pytest

from teamrt.bench.harness import Bench, Sizes
from teamrt.bench.models import model_figures

pytestmark = pytest.mark.stress  # a benchmark


async def test_model_figures_measure_the_adapter_beside_the_bare_client(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Sizes.pick(quick=False, smoke=True))
    await model_figures(bench)
    names = [f.name for f in bench.figures]
    assert names == [
        "model call through OpenAIModel, p50",
        "streamed model call through OpenAIModel, p50",
    ]
    for figure in bench.figures:
        assert figure.value > 0 and figure.baseline_value and figure.ok is not None
