"""Model figures for `teamrt bench`: the time of one model call through `OpenAIModel` beside the
same call made with the bare `openai` client, in the same run, against one scripted
OpenAI-compatible server on 127.0.0.1 (a child process: `python -m teamrt.bench.model_server
PORT_FILE`). The server's time is in both; the ratio is what the adapter adds."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from teamrt.bench.harness import Bench
from teamrt.bench.stats import Figure
from teamrt.models import ChatMessage, ToolSpec, allow_model_requests

_MESSAGES = [
    ChatMessage.system("You check stock. Answer in one sentence."),
    ChatMessage.user("How many earbuds are in stock?"),
]
_TOOLS = [
    ToolSpec(
        name="check_stock",
        description="How many of a SKU are in stock.",
        parameters={
            "type": "object",
            "properties": {"sku": {"type": "string"}},
            "required": ["sku"],
        },
    )
]


@contextmanager
def _server() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as scratch:
        port_file = Path(scratch) / "port"
        child = subprocess.Popen(
            [sys.executable, "-m", "teamrt.bench.model_server", str(port_file)],
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError("the bench's model server did not start")
                time.sleep(0.01)
            yield f"http://127.0.0.1:{port_file.read_text()}/v1"
        finally:
            child.terminate()
            child.wait(timeout=10)


async def _timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await call()
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


async def _compare(
    ours: Callable[[], Awaitable[object]],
    bare: Callable[[], Awaitable[object]],
    calls: int,
    rounds: int,
) -> tuple[list[float], list[float]]:
    """Median microseconds per call of each in every round, each round made of alternating
    blocks, after a warm-up."""
    await _timed(ours, 20)
    await _timed(bare, 20)
    mine: list[float] = []
    theirs: list[float] = []
    block = 25
    for _ in range(rounds):
        mine_now: list[float] = []
        theirs_now: list[float] = []
        for _ in range(max(1, calls // rounds // block)):
            mine_now += await _timed(ours, block)
            theirs_now += await _timed(bare, block)
        mine.append(statistics.median(mine_now))
        theirs.append(statistics.median(theirs_now))
    return mine, theirs


async def model_figures(bench: Bench) -> None:
    """The `models` group: plain and streamed calls through `OpenAIModel` beside the bare client."""
    import openai  # only here: `teamrt bench --only startup` must not pay for the SDK

    from teamrt.models import OpenAIModel

    calls = 100 if bench.smoke else 500 if bench.quick else 1000
    wire: Any = [
        {"role": "system", "content": _MESSAGES[0].content},
        {"role": "user", "content": _MESSAGES[1].content},
    ]
    tools: Any = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in _TOOLS
    ]
    with _server() as url, allow_model_requests():
        async with (
            openai.AsyncOpenAI(api_key="bench", base_url=url, max_retries=0) as client,
            OpenAIModel("bench-model", base_url=url, api_key="bench") as model,
        ):

            async def ours() -> object:
                return (await model.complete(_MESSAGES, _TOOLS)).text

            async def bare() -> object:
                answer = await client.chat.completions.create(
                    model="bench-model", messages=wire, tools=tools
                )
                return answer.choices[0].message.content

            async def ours_streamed() -> object:
                async for item in model.stream(_MESSAGES, _TOOLS):
                    last = item
                return last

            async def bare_streamed() -> object:
                stream = await client.chat.completions.create(
                    model="bench-model",
                    messages=wire,
                    tools=tools,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                return [chunk async for chunk in stream]

            for name, pair in (
                ("model call through OpenAIModel, p50", (ours, bare)),
                ("streamed model call through OpenAIModel, p50", (ours_streamed, bare_streamed)),
            ):
                mine, theirs = await _compare(*pair, calls, bench.rounds)
                bench.add(
                    Figure.of(
                        name,
                        *(mine, "us", "the bare openai client, same server", theirs),
                        target="<= 1.2x baseline",
                        check=lambda f: f.value <= 1.2 * (f.baseline_value or 0),
                    )
                )
