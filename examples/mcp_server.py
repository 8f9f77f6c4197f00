"""A small MCP server with two tools, over stdin and stdout: what examples/mcp_tools.py starts.

It is built with the MCP SDK (pip install 'teamrt[mcp]'); any MCP server would do.
"""

from mcp.server.mcpserver import MCPServer

NOTES = {"todo.md": "- buy milk\n- write the report", "ideas.md": "- a team of clerks"}
server = MCPServer("notes", log_level="WARNING")


@server.tool()
def list_notes() -> list[str]:
    """The names of the notes."""
    return sorted(NOTES)


@server.tool()
def read_note(name: str) -> str:
    """The text of one note."""
    return NOTES[name]


if __name__ == "__main__":
    server.run("stdio")
