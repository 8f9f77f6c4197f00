"""Child processes for the lead's tests: a lead that asks and is killed, a flood of mail.

    python tests/support/lead_procs.py flood TEAM N       send N messages to the lead, then exit
    python tests/support/lead_procs.py ask TEAM OUT [KEY]  a lead that asks the remote w, writes OUT

TEAM is a team directory or a store URL (redis://...).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from teamrt.envelopes import Envelope
from teamrt.mail.locator import open_mailboxes
from teamrt.team import Team


async def flood(directory: str, count: int) -> None:
    async with open_mailboxes(directory) as mail:
        for start in range(0, count, 100):
            batch = range(start, min(count, start + 100))
            await mail.send_many([Envelope.message("other", "lead", f"n{i}") for i in batch])


async def ask(directory: str, out: str, key: str | None) -> None:
    """A lead of the remote w: asks it once (with `key`, if given), writes the answer."""
    async with open_mailboxes(directory) as mail, Team(mail, [], remote=["w"]) as team:
        Path(f"{out}.asking").write_text("asking")
        result = await team.ask("w", "what is the answer?", timeout=60, key=key)
        Path(out).write_text(result.answer or "")


if __name__ == "__main__":
    mode, directory = sys.argv[1:3]
    if mode == "flood":
        anyio.run(flood, directory, int(sys.argv[3]))
    else:
        anyio.run(ask, directory, sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
