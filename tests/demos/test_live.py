"""The live view: a table on a terminal, plain lines otherwise, and a last frame that matches
the team's state when the view stops."""

from __future__ import annotations

import io
from collections.abc import Sequence

import anyio

from teamrt import MemoryMailboxes
from teamrt.agents import tool
from teamrt.demos.live import live_view
from teamrt.models import ChatMessage, FunctionModel, ModelReply, ToolSpec, Usage, call
from teamrt.team import Team, Teammate


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@tool
def step(i: int) -> int:
    """One step."""
    return i


def four_steps(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply:
    done = sum(1 for m in messages if m.role == "tool")
    if done < 3:
        return call("step", i=done)
    return ModelReply(text="done", usage=Usage(requests=1, input_tokens=40, output_tokens=2))


async def _run(out: io.StringIO) -> None:
    member = Teammate("w", FunctionModel(four_steps), tools=[step])
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [member]) as team,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: live_view(team, interval=3600, out=out))  # one frame, then...
        await team.ask("w", "go", timeout=5)
        tg.cancel_scope.cancel()  # ...the last frame, drawn as the view stops


async def test_the_last_plain_frame_matches_the_end_of_the_run() -> None:
    out = io.StringIO()
    await _run(out)
    last = out.getvalue().splitlines()[-1].split()
    assert last[:2] == ["w", "idle"] and "4" in last  # step 4, not "idle step 0 tasks 0"
    assert last[last.index("tasks") + 1] == "1"


async def test_a_terminal_gets_a_table_with_the_final_state() -> None:
    out = Terminal()
    await _run(out)
    text = out.getvalue()
    assert "\x1b[" in text  # drawn in place
    final = text.rsplit("member", 1)[-1]  # the last table drawn
    assert "idle" in final and "done" not in final.split("idle")[0]
