"""Your first team: a researcher reads a note and asks a writer to write it up. The two talk
only through inbox files under mailboxes/first-team, which stay there for you to look at.

Run it: python examples/first_team.py
"""

import shutil
from pathlib import Path

import anyio

from teamrt import FileMailboxes, ScriptedModel, Team, Teammate, call, tool

TEAM_DIR = Path("mailboxes/first-team")
NOTES = {"loop.md": "The agent loop asks the model, runs the tools it calls, and repeats."}


@tool
def read_note(name: str) -> str:
    """The text of one note."""
    return NOTES[name]


@tool
def write_file(name: str, content: str) -> str:
    """Write a file into the out/ directory."""
    path = Path("out") / Path(name).name
    path.parent.mkdir(exist_ok=True)
    path.write_text(content)
    return f"wrote {path}"


researcher = Teammate(
    "researcher",
    # each reply is what a model would say next: read the note, ask the writer, answer
    ScriptedModel(
        [
            call("read_note", name="loop.md"),
            call("request", to="writer", text="Write loop.md from: " + NOTES["loop.md"]),
            "The writer wrote out/loop.md.",
        ]
    ),
    instructions="You research from the notes, then have the writer write it up.",
    tools=[read_note],
)
writer = Teammate(
    "writer",
    ScriptedModel(
        [
            call("write_file", name="loop.md", content="# The agent loop\n\n" + NOTES["loop.md"]),
            "Wrote out/loop.md.",
        ]
    ),
    instructions="You write what you are asked to into files.",
    tools=[write_file],
)


async def main() -> None:
    shutil.rmtree(TEAM_DIR, ignore_errors=True)  # each run starts afresh
    async with (
        FileMailboxes(TEAM_DIR) as mail,
        Team(mail, [researcher, writer], agent_dir=TEAM_DIR / "agents") as team,
    ):
        result = await team.ask("researcher", "Write up the agent loop.", timeout=60)
    print(result.stop_reason, "-", result.answer)  # answer - The writer wrote out/loop.md.
    print(await anyio.Path("out/loop.md").read_text())


if __name__ == "__main__":
    anyio.run(main)
