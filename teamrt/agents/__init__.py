"""One agent's loop: state, limits and budgets, tools, memory, messaging and reports."""

from teamrt.agents.delegate import delegate_tool
from teamrt.agents.limits import PRICES, PRICES_DATE, Limits, cost_of
from teamrt.agents.loop import (
    Agent,
    AgentEvent,
    Answer,
    CallTools,
    Inbound,
    Malformed,
    ToolCallFinished,
    ToolCallStarted,
    decide,
)
from teamrt.agents.mcp_tools import MCPConnection, MCPTool, MCPTools
from teamrt.agents.memory import Compacted, Memory
from teamrt.agents.messaging import messaging_tools
from teamrt.agents.output import FINAL_TOOL, OutputType
from teamrt.agents.state import AgentState, RunReport, Stop
from teamrt.agents.tools import Tool, Toolbox, ToolResult, current_call_id, current_fence, tool

__all__ = [
    "FINAL_TOOL",
    "PRICES",
    "PRICES_DATE",
    "Agent",
    "AgentEvent",
    "AgentState",
    "Answer",
    "CallTools",
    "Compacted",
    "Inbound",
    "Limits",
    "MCPConnection",
    "MCPTool",
    "MCPTools",
    "Malformed",
    "Memory",
    "OutputType",
    "RunReport",
    "Stop",
    "Tool",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolResult",
    "Toolbox",
    "cost_of",
    "current_call_id",
    "current_fence",
    "decide",
    "delegate_tool",
    "messaging_tools",
    "tool",
]
