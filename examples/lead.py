"""The lead is a member: it answers its teammates' requests, asks idempotently with a key, and
reads the mail sent to it.

Run it: python examples/lead.py
"""

import contextlib

import anyio

from teamrt import Envelope, MemoryMailboxes, ScriptedModel, Team, Teammate, call


async def deploys(request: Envelope) -> str:
    """The lead's answer to a teammate's `request` tool (any request type without a handler)."""
    return "yes" if "staging" in str(request.body) else "not today"


async def main() -> None:
    writer = Teammate(
        "writer",
        ScriptedModel(
            [
                call("request", to="lead", text="May I deploy to staging?"),
                call("send_message", to="lead", text="FYI: deploying the draft to staging."),
                "Drafted and deployed to staging.",
            ]
        ),
    )
    async with MemoryMailboxes() as mail, Team(mail, [writer], on_request=deploys) as team:
        # with a key, the task runs at most once: asking again returns the first outcome
        result = await team.ask("writer", "Draft it.", timeout=30, key="draft-42")
        again = await team.ask("writer", "Draft it.", timeout=30, key="draft-42")
        print(result.answer, "|", again.answer == result.answer)
        # messages to the lead, in order; leave the loop inside aclosing to ack the last one
        async with contextlib.aclosing(team.lead_mail()) as mailbox:
            async for envelope in mailbox:
                print(envelope.sender, "says:", envelope.body)
                break


if __name__ == "__main__":
    anyio.run(main)
