"""`FileMailboxes`: `Mailboxes` over a `FileStore`, in one constructor."""

from __future__ import annotations

import os
from collections.abc import Iterable

from teamrt.mail.filestore.store import FileStore
from teamrt.mail.mailboxes import DEFAULT_RESCAN_INTERVAL, Mailboxes
from teamrt.mail.store import DEFAULT_MAX_BLOB, DEFAULT_MAX_ENVELOPE, Durability


class FileMailboxes(Mailboxes):
    """Mailboxes in a team directory on local disk (see mailboxes/README.md for the format).

        async with FileMailboxes("mailboxes/demo", members=["lead", "writer"]) as mail:
            await mail.send(Envelope.message("lead", "writer", "hello"))
            envelope = await mail.inbox("writer").receive(timeout=5)

    - `durability="none"` (default): an acknowledged send survives kill -9 of any process;
      `"fsync"` also survives power loss, with concurrent senders sharing fsyncs.
    - `members`: names to add to the roster (idempotent); a recipient must be a member.
    - `rescan_interval`: the safety rescan behind file notifications, in seconds.
    - `segment_bytes`: log size at which an inbox rotates into a new segment; recorded in
      team.json when the team is created, and that recorded value wins afterwards.
    - `max_envelope`: the largest encoded envelope accepted (bytes); a larger payload travels
      as a claim check (a blob in `blobs/`) up to `max_blob` bytes (64 MiB by default).
    - `create=False`: refuse to create a team directory that does not exist.
    - `key`: a team key (or `TEAMRT_TEAM_KEY`): envelopes are signed with it, and unsigned or
      badly signed ones are quarantined (see mailboxes/README.md, "Trust"). team.json records
      whether the team was created signed, and which key: another key, none for a signed team,
      or one for an unsigned team, is refused with `TeamKeyMismatch`.
    - `shared_group=True` (or `TEAMRT_SHARED_GROUP=1`): accept a team directory shared by one
      group (group-writable); by default it must be this user's and writable by nobody else.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "none",
        members: Iterable[str] = (),
        rescan_interval: float = DEFAULT_RESCAN_INTERVAL,
        segment_bytes: int | None = None,
        max_envelope: int = DEFAULT_MAX_ENVELOPE,
        max_blob: int = DEFAULT_MAX_BLOB,
        create: bool = True,
        key: str | bytes | None = None,
        shared_group: bool | None = None,
    ) -> None:
        store = FileStore(
            path,
            durability=durability,
            segment_bytes=segment_bytes,
            max_envelope=max_envelope,
            max_blob=max_blob,
            create=create,
            shared_group=shared_group,
        )
        super().__init__(store, members=members, rescan_interval=rescan_interval, key=key)
        self.path = store.path
