"""One agent's loop: state, limits and budgets, tools, memory, messaging and reports."""

from teamrt.agents.limits import PRICES, PRICES_DATE, Limits, cost_of
from teamrt.agents.loop import Agent, Answer, CallTools, Malformed, decide
from teamrt.agents.memory import Memory
from teamrt.agents.messaging import messaging_tools
from teamrt.agents.state import AgentState, RunReport, Stop
from teamrt.agents.tools import Tool, Toolbox, ToolResult, tool

__all__ = [
    "PRICES",
    "PRICES_DATE",
    "Agent",
    "AgentState",
    "Answer",
    "CallTools",
    "Limits",
    "Malformed",
    "Memory",
    "RunReport",
    "Stop",
    "Tool",
    "ToolResult",
    "Toolbox",
    "cost_of",
    "decide",
    "messaging_tools",
    "tool",
]
