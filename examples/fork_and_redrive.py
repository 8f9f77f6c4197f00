"""Forking a run: the first team's run (examples/first_team.py), forked at the moment the
researcher asked the writer, and driven on from there with a different writer.

Run it: python examples/fork_and_redrive.py
"""

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import anyio
import first_team  # examples/first_team.py, beside this file

from teamrt import (
    ChatMessage,
    FileMailboxes,
    FunctionModel,
    ModelReply,
    Team,
    Teammate,
    ToolSpec,
    call,
)
from teamrt.fork import fork_team, wait_for_answers

SOURCE = Path("mailboxes/first-team")
FORK = Path("forks/try-1")


def researcher_model(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    # resumed from its journal, the researcher sends its request again (the same id) and
    # then has only the writer's answer to report
    writer_said = json.loads(messages[-1].content or "{}")["answer"]["answer"]
    return f"The writer reports: {writer_said}"


def terse_writer(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ModelReply | str:
    if messages[-1].role == "tool":
        return "Wrote a shorter out/loop.md."
    return call("write_file", name="loop.md", content="# The loop\n\nAsk, act, repeat.\n")


async def main() -> None:
    await first_team.main()  # the run to fork
    # the moment: the researcher's request, the first line of the writer's inbox file
    inbox = SOURCE / "inboxes" / "writer.jsonl"
    request = next(e for e in map(json.loads, inbox.open()) if e["sender"] == "researcher")
    shutil.rmtree(FORK, ignore_errors=True)
    summary = fork_team(SOURCE, request["id"], FORK)
    asked = [r.id for r in summary.open_requests if r.sender == "lead"]  # the lead's open task

    researcher = Teammate(
        "researcher", FunctionModel(researcher_model), tools=[first_team.read_note]
    )
    writer = Teammate("writer", FunctionModel(terse_writer), tools=[first_team.write_file])
    async with (
        FileMailboxes(FORK) as mail,
        # lead_here=False: this program reads the lead's inbox itself, for the open task's answer
        Team(mail, [researcher, writer], agent_dir=FORK / "agents", lead_here=False),
    ):
        answers = await wait_for_answers(mail, asked, timeout=60)
    for answer in answers.values():
        print(answer.body["answer"])  # The writer reports: Wrote a shorter out/loop.md.
    print(await anyio.Path("out/loop.md").read_text())


if __name__ == "__main__":
    anyio.run(main)
