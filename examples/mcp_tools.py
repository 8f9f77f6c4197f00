"""MCP tools: an agent and a teammate that use the tools of an MCP server run as a command.

Needs the MCP SDK: pip install 'teamrt[mcp]'.
Run it: python examples/mcp_tools.py
"""

import sys
from pathlib import Path

import anyio

from teamrt import Agent, MCPTools, MemoryMailboxes, ScriptedModel, Team, Teammate, call

# the server is a program; `prefix` names its tools notes_list_notes and notes_read_note
notes = MCPTools.stdio(
    sys.executable, [str(Path(__file__).with_name("mcp_server.py"))], prefix="notes"
)


async def main() -> None:
    async with notes.connect() as connection:  # starts the server, lists its tools
        print([t.name for t in connection.tools])  # ['notes_list_notes', 'notes_read_note']
        model = ScriptedModel([call("notes_read_note", name="todo.md"), "Milk and the report."])
        agent = Agent("clerk", model, tools=[*connection.tools])
        report = await agent.run("What is on my list?")
        print(report.answer)
    # leaving the block stopped the server

    # a teammate connects its servers when each incarnation starts and closes them when it ends
    clerk = Teammate(
        "clerk",
        ScriptedModel([call("notes_list_notes"), "Two notes: ideas.md and todo.md."]),
        mcp=[notes],
    )
    async with MemoryMailboxes() as mail, Team(mail, [clerk]) as team:
        result = await team.ask("clerk", "Which notes are there?", timeout=60)
        print(result.answer)


if __name__ == "__main__":
    anyio.run(main)
