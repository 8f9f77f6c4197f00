"""Streaming a teammate's task: its text as it is written, each tool call, then the result.

Run it: python examples/streaming.py
"""

import anyio

from teamrt import (
    MemoryMailboxes,
    ProgressBody,
    ScriptedModel,
    TaskResult,
    Team,
    Teammate,
    call,
    tool,
)


@tool
def look_up(term: str) -> str:
    """A definition."""
    return "inotify: a Linux API that reports changes to files."


async def main() -> None:
    researcher = Teammate(
        "researcher",
        ScriptedModel(
            [call("look_up", term="inotify"), "inotify tells a process when a file changes."]
        ),
        tools=[look_up],
    )
    async with (
        MemoryMailboxes() as mail,
        Team(mail, [researcher]) as team,
        team.stream("researcher", "What is inotify?", timeout=60) as events,
    ):
        async for event in events:
            if isinstance(event, ProgressBody) and event.event == "text":
                print(event.text, end="", flush=True)
            elif isinstance(event, ProgressBody):
                print(f"[{event.event}]")  # [tool_call], [tool_result]
            elif isinstance(event, TaskResult):
                print("\nstopped:", event.stop_reason)  # stopped: answer


if __name__ == "__main__":
    anyio.run(main)
