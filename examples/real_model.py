"""A real model: the first agent on any OpenAI-compatible server.

Set OPENAI_MODEL, and OPENAI_API_KEY for OpenAI, or OPENAI_BASE_URL alone for a local server
that needs no key (Ollama: OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.1:8b).

Run it: python examples/real_model.py
"""

import anyio

from teamrt import Agent, Limits, OpenAIModel, tool


@tool
def check_stock(sku: str) -> dict[str, int]:
    """How many of a SKU (EARBUDS, CABLE) are in stock."""
    return {"quantity": {"EARBUDS": 14, "CABLE": 0}[sku.upper()]}


async def main() -> None:
    # the model name, the server and the key come from OPENAI_MODEL, OPENAI_BASE_URL and
    # OPENAI_API_KEY; a missing one is named in the error
    async with OpenAIModel() as model:
        agent = Agent(
            "clerk",
            model,
            instructions="You check stock with check_stock and answer in one sentence.",
            tools=[check_stock],
            limits=Limits(max_steps=6, model_timeout=120),
        )
        report = await agent.run("How many earbuds are in stock?")
    print(report.answer)
    print(report.summary())  # the stop reason, steps, tool calls, tokens and time


if __name__ == "__main__":
    anyio.run(main)
