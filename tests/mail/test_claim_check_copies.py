"""Claim checks in the tools that copy or read a team: export and fork copy the blobs their
records name, replay flags a claim check (and a blob that is missing or corrupt), and repair
names the claim checks whose blob is damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from teamrt import Envelope
from teamrt.fork import fork_team
from teamrt.mail import FileMailboxes, Mailboxes, export_team, open_view, repair_team
from teamrt.mail.filestore.blobs import blob_digests, blob_path
from teamrt.mail.redisstore import RedisStore
from teamrt.replay import timeline
from tests.mail.test_claim_checks import MiB, payload
from tests.support.redis_server import RedisServer, needs_redis, shared_redis

__all__ = ["shared_redis"]  # the fixture


async def _team_with_a_blob(mail: Mailboxes) -> tuple[Envelope, Envelope]:
    """A claim check and an ordinary message after it in w's inbox."""
    big = Envelope.message("lead", "w", payload(2 * MiB))
    after = Envelope.message("lead", "w", "after")
    await mail.send(big)
    await mail.send(after)
    return big, after


async def _received(directory: Path, n: int) -> list[object]:
    async with FileMailboxes(directory) as mail:
        inbox = mail.inbox("w")
        return [(await inbox.receive(timeout=10)).body for _ in range(n)]


async def test_an_export_copies_the_blobs_its_records_name(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "src" / "t", members=["lead", "w"]) as mail:
        big, after = await _team_with_a_blob(mail)
    with open_view(tmp_path / "src" / "t") as view:
        export_team(view, tmp_path / "copy" / "t")
    digests = list(blob_digests(tmp_path / "copy" / "t"))
    assert digests == list(blob_digests(tmp_path / "src" / "t")) and len(digests) == 1
    assert blob_path(tmp_path / "copy" / "t", digests[0]).stat().st_mode & 0o777 == 0o600
    assert await _received(tmp_path / "copy" / "t", 2) == [big.body, after.body]


@needs_redis
async def test_an_export_of_a_redis_team_carries_its_blobs(
    tmp_path: Path, shared_redis: RedisServer
) -> None:
    url = shared_redis.url()
    async with Mailboxes(RedisStore(url), members=["lead", "w"]) as mail:
        big, after = await _team_with_a_blob(mail)
        team = mail.team
    with open_view(url) as view:
        export_team(view, tmp_path / team)
    assert await _received(tmp_path / team, 2) == [big.body, after.body]


async def test_a_fork_carries_the_blobs_of_its_cut(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        big, after = await _team_with_a_blob(mail)
    fork_team(str(tmp_path / "t"), after.id, tmp_path / "forks" / "f")
    assert await _received(tmp_path / "forks" / "f", 2) == [big.body, after.body]


async def test_replay_flags_a_claim_check_and_a_missing_blob(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        big, _ = await _team_with_a_blob(mail)
    (event,) = [e for e in timeline(tmp_path / "t") if e.id == big.id]
    assert event.flags == ["claim_check"]
    claim = event.body["$claim"]
    assert claim["size"] == 2 * MiB and claim["kind"] == "text"
    blob_path(tmp_path / "t", claim["sha256"]).unlink()
    (event,) = [e for e in timeline(tmp_path / "t") if e.id == big.id]
    assert event.flags == ["claim_check", "blob_missing"]
    assert event.reason == f"claim check blob {claim['sha256']} is missing"


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
async def test_repair_names_a_claim_check_whose_blob_is_damaged(
    tmp_path: Path, damage: str
) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:
        big, _ = await _team_with_a_blob(mail)
    (report,) = repair_team(tmp_path / "t", "w")
    assert report.ok
    (digest,) = blob_digests(tmp_path / "t")
    path = blob_path(tmp_path / "t", digest)
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(b"z" * (2 * MiB))
    (report,) = repair_team(tmp_path / "t", "w")
    (lost,) = report.lost
    assert lost.startswith(f"envelope {big.id} (seq 0, from lead): claim check blob {digest}")
    assert ("is missing" if damage == "missing" else "fails its digest check") in lost
