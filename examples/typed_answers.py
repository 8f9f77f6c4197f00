"""Typed answers: an agent and a teammate that answer with a pydantic model.

Run it: python examples/typed_answers.py
"""

import anyio
from pydantic import BaseModel

from teamrt import Agent, MemoryMailboxes, ScriptedModel, Team, Teammate, call


class Invoice(BaseModel):
    """An invoice for one customer."""

    customer: str
    total: int


async def main() -> None:
    # a model that only does tools answers through the final_answer tool; its first answer
    # is wrong, the validation error goes back to it once, and it corrects itself
    model = ScriptedModel(
        [
            call("final_answer", customer="ACME", total="twelve"),
            call("final_answer", customer="ACME", total=12),
        ]
    )
    report = await Agent("clerk", model, output_type=Invoice).run("Bill ACME for 12.")
    print(report.output)  # customer='ACME' total=12

    # a model with structured output gets the schema with each call and answers in JSON
    # (as OpenAIModel does, with response_format json_schema)
    clerk = Teammate(
        "clerk",
        ScriptedModel(['{"customer": "Initech", "total": 7}'], structured_output=True),
        output_type=Invoice,
    )
    async with MemoryMailboxes() as mail, Team(mail, [clerk]) as team:
        invoice = await team.ask("clerk", "Bill Initech for 7.", output_type=Invoice, timeout=10)
        print(invoice.total)  # 7


if __name__ == "__main__":
    anyio.run(main)
