"""The mailboxes on their own: a lead asks a writer through inbox files under mailboxes/demo.

Run it: python examples/mailboxes.py
"""

import anyio

from teamrt import Envelope, FileMailboxes


async def main() -> None:
    async with FileMailboxes("mailboxes/demo", members=["lead", "writer"]) as mail:

        async def writer() -> None:
            inbox = mail.inbox("writer")
            request = await inbox.receive(timeout=10)
            await mail.send(Envelope.response(request, {"words": len(request.body.split())}))
            await inbox.ack(request)

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            request = Envelope.request("lead", "writer", "count these words", type="task")
            response = await mail.request(request, timeout=10)
            print(response.body)  # {'words': 3}


if __name__ == "__main__":
    anyio.run(main)
