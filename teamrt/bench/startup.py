"""Startup figures for `teamrt bench`: how long a fresh process takes to import teamrt (and to
run `teamrt --version`), beside `python -c pass` measured in the same run, runs interleaved so
that both see the same machine. The target is the import's own cost: under 300 ms above the
interpreter's start. The OpenAI SDK is imported only by a program that makes an OpenAI model;
the last figure shows what that costs when it does."""

from __future__ import annotations

import sys
import time

import anyio

from teamrt.bench.harness import Bench
from teamrt.bench.stats import Figure

IMPORT_TARGET_MS = 300.0

_PROGRAMS = {
    "import teamrt, fresh process": ["-c", "import teamrt"],
    "import teamrt.agents.limits, fresh process": ["-c", "import teamrt.agents.limits"],
    "teamrt --version, fresh process": ["-m", "teamrt", "--version"],
    "import teamrt.models.OpenAIModel (loads openai)": [
        "-c",
        "from teamrt.models import OpenAIModel",
    ],
}


async def _once(args: list[str], cwd: str) -> float:
    """Milliseconds for one fresh interpreter to run `args` to the end."""
    started = time.perf_counter()
    await anyio.run_process([sys.executable, *args], cwd=cwd, check=True)
    return (time.perf_counter() - started) * 1000


async def startup_figures(bench: Bench) -> None:
    """The `startup` group: each of `_PROGRAMS` in fresh processes beside `python -c pass`."""
    # each run of every program is a round; smoke sizes: a check that it works
    runs = max(bench.rounds, 3 if bench.smoke else 5 if bench.quick else 9)
    cwd = str(bench.root)  # outside any checkout: the installed teamrt is what is imported
    times: dict[str, list[float]] = {name: [] for name in ["baseline", *_PROGRAMS]}
    await _once(["-c", "import teamrt.models.openai_model"], cwd)  # warm the file cache
    for _ in range(runs):
        times["baseline"].append(await _once(["-c", "pass"], cwd))
        for name, args in _PROGRAMS.items():
            times[name].append(await _once(args, cwd))
    for name in _PROGRAMS:
        lazy = "openai" not in name
        bench.add(
            Figure.of(
                f"{name}, median of {runs}",
                *(times[name], "ms", "python -c pass", times["baseline"]),
                target=f"< {IMPORT_TARGET_MS:.0f} ms above it" if lazy else "",
                check=(
                    (lambda f: f.value - (f.baseline_value or 0) < IMPORT_TARGET_MS)
                    if lazy
                    else None
                ),
            )
        )
