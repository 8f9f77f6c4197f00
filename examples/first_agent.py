"""Your first agent: one tool, a scripted model, limits, and the report of how it stopped.

Run it: python examples/first_agent.py
"""

import anyio

from teamrt import Agent, Limits, ScriptedModel, call, tool


@tool
def check_stock(sku: str) -> dict[str, int]:
    """How many of a SKU are in stock."""
    return {"quantity": {"EARBUDS": 14, "CABLE": 0}[sku]}


async def main() -> None:
    # the model's replies, in order: a tool call, then the answer
    model = ScriptedModel([call("check_stock", sku="EARBUDS"), "14 in stock."])
    agent = Agent(
        "clerk",
        model,
        instructions="You check stock.",
        tools=[check_stock],
        limits=Limits(max_steps=10, max_tool_calls=5),
    )
    report = await agent.run("How many earbuds?")
    print(report.answer)  # 14 in stock.
    print(report.summary())  # clerk: stopped (answer): ...; 2 steps, 1 tool calls, ...


if __name__ == "__main__":
    anyio.run(main)
