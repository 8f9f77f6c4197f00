"""Hostile directories and forged answers: writes never follow links, a team directory someone
else could prepare is refused, misfiled envelopes are quarantined, `request()` takes its answer
only from the member it asked, and a signed team detects a forged sender."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from teamrt import Envelope, FileMailboxes, MemoryMailboxes
from teamrt.errors import TeamKeyMismatch, UnsafeDirectory, UsageError

MEMBERS = ("lead", "worker", "mallory")
KEY = "k" * 32


def _quarantine(team: Path, name: str = "worker") -> list[dict[str, Any]]:
    path = team / "inboxes" / f"{name}.quarantine.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _drain(mail: Any, name: str = "worker") -> list[Envelope]:
    inbox, out = mail.inbox(name), []
    while True:
        try:
            out.append(inbox.receive_nowait())
        except anyio.WouldBlock:
            return out


# -- files and directories --


async def test_a_planted_roster_temp_symlink_is_not_followed(tmp_path: Path) -> None:
    team, victim = tmp_path / "t", tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    async with FileMailboxes(team, members=["lead"]):
        pass
    (team / "team.json.tmp").symlink_to(victim)
    async with FileMailboxes(team, members=["lead", "worker"]) as mail:
        assert "worker" in mail.members
    assert victim.read_text() == "precious" and victim.stat().st_mode & 0o777 == 0o644
    assert not (team / "team.json.tmp").exists()


async def test_a_planted_cursor_temp_symlink_is_not_followed(tmp_path: Path) -> None:
    team, victim = tmp_path / "t", tmp_path / "victim"
    victim.write_text("precious")
    async with FileMailboxes(team, members=MEMBERS) as mail:
        await mail.send(Envelope.message("lead", "worker", 1))
        inbox = mail.inbox("worker")
        (team / "inboxes" / "worker.cursor.json.tmp").symlink_to(victim)
        await inbox.ack(await inbox.receive(timeout=5))  # the first commit writes the temp file
    assert victim.read_text() == "precious"
    assert not (team / "inboxes" / "worker.cursor.json").is_symlink()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
async def test_a_team_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    team = tmp_path / "t"
    team.mkdir()
    team.chmod(mode)
    with pytest.raises(UnsafeDirectory, match=r"writable by (every user|its group)"):
        async with FileMailboxes(team, members=MEMBERS):
            pass
    assert not (team / "team.json").exists()


async def test_a_team_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    team = tmp_path / "t"
    team.mkdir(mode=0o700)
    os.chown(team, 12345, 12345)
    with pytest.raises(UnsafeDirectory, match="belongs to uid 12345, not to this user"):
        async with FileMailboxes(team, members=MEMBERS):
            pass


async def test_a_team_shared_by_one_group_is_an_explicit_option(tmp_path: Path) -> None:
    team = tmp_path / "t"
    team.mkdir()
    team.chmod(0o2770)
    async with FileMailboxes(team, members=MEMBERS, shared_group=True) as mail:
        await mail.send(Envelope.message("lead", "worker", "hi"))
        assert (await mail.inbox("worker").receive(timeout=5)).body == "hi"
    assert (team / "inboxes").stat().st_mode & 0o070 == 0o070
    assert (team / "inboxes" / "worker.jsonl").stat().st_mode & 0o777 == 0o660
    team.chmod(0o2777)  # writable by others: refused even for a shared team
    with pytest.raises(UnsafeDirectory, match="writable by every user"):
        async with FileMailboxes(team, shared_group=True):
            pass


async def test_a_symlinked_inboxes_directory_is_refused(tmp_path: Path) -> None:
    team, other = tmp_path / "t", tmp_path / "other"
    async with FileMailboxes(team, members=MEMBERS), FileMailboxes(other, members=MEMBERS):
        pass
    os.rename(team / "inboxes", tmp_path / "moved")
    (team / "inboxes").symlink_to(other / "inboxes")
    with pytest.raises(UnsafeDirectory, match="inboxes is a symbolic link"):
        async with FileMailboxes(team):
            pass


async def test_envelopes_for_another_team_or_member_are_quarantined(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    async with FileMailboxes(ours, members=MEMBERS), FileMailboxes(theirs, members=MEMBERS):
        pass
    # their worker's inbox is a hard link to ours: their sends land in our log
    (theirs / "inboxes" / "worker.jsonl").unlink()
    os.link(ours / "inboxes" / "worker.jsonl", theirs / "inboxes" / "worker.jsonl")
    async with FileMailboxes(theirs) as mail:
        await mail.send(Envelope.message("lead", "worker", "for their worker"))
    async with FileMailboxes(ours) as mail:
        line = (ours / "inboxes" / "worker.jsonl").read_bytes()
        (ours / "inboxes" / "worker.jsonl").write_bytes(
            line
            + line.replace(b'"team":"theirs"', b'"team":"ours"').replace(
                b'"recipient":"worker"', b'"recipient":"lead"'
            )
        )
        await mail.send(Envelope.message("lead", "worker", "ours"))
        assert [e.body for e in await _drain(mail)] == ["ours"]
    reasons = [q["reason"] for q in _quarantine(ours)]
    assert reasons == [
        "wrong team: 'theirs' in the inbox of worker of 'ours'",
        "wrong recipient: 'lead' in the inbox of worker",
    ]


# -- answers --


async def test_request_accepts_its_answer_only_from_the_member_it_asked() -> None:
    async with MemoryMailboxes(members=MEMBERS) as mail, anyio.create_task_group() as tg:

        async def forge_then_answer() -> None:
            request = await mail.inbox("worker").receive(timeout=5)
            forged = Envelope.response(request, "forged").model_copy(update={"sender": "mallory"})
            await mail.send(forged)  # another member answers first
            await anyio.sleep(0.01)
            await mail.send(Envelope.response(request, "real"))

        tg.start_soon(forge_then_answer)
        response = await mail.request(Envelope.request("lead", "worker", "q"), timeout=5)
        assert (response.body, response.sender) == ("real", "worker")
        stats = mail.inbox("lead").statistics()
        assert (stats.rejected_responses, stats.duplicate_responses) == (1, 0)


async def test_a_signed_team_detects_a_forged_sender(tmp_path: Path) -> None:
    from teamrt.mail.filestore import FileStore
    from teamrt.mail.log import encode
    from teamrt.mail.signing import Signer

    team = tmp_path / "t"
    other = "another key of 32 bytes, not the team's"
    with pytest.raises(TeamKeyMismatch):  # teamrt refuses to open it with another key
        async with FileMailboxes(team, members=MEMBERS, key=KEY), FileMailboxes(team, key=other):
            pass
    forger = FileStore(team)  # a process that writes the files itself, as any of the user's can
    await forger.open([])
    async with (
        FileMailboxes(team, key=KEY) as mail,
        anyio.create_task_group() as tg,
    ):

        async def forge_then_answer() -> None:
            request = await mail.inbox("worker").receive(timeout=5)
            # a process without the team key pretends to be the worker
            forged = Envelope.response(request, "forged")
            await forger.append("lead", Signer(other.encode()).sign(encode(forged), "t"))
            await anyio.sleep(0.01)
            await mail.send(Envelope.response(request, "real"))

        tg.start_soon(forge_then_answer)
        response = await mail.request(Envelope.request("lead", "worker", "q"), timeout=5)
        assert response.body == "real"
    await forger.close()
    assert [q["reason"] for q in _quarantine(team, "lead")] == ["bad signature"]
    line = (team / "inboxes" / "worker.jsonl").read_bytes()
    assert b',"sig":"' in line  # every envelope carries its signature


async def test_signing_key_from_the_environment_and_unsigned_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from teamrt.mail.filestore import FileStore
    from teamrt.mail.log import encode

    team = tmp_path / "t"
    monkeypatch.setenv("TEAMRT_TEAM_KEY", KEY)
    async with FileMailboxes(team, members=MEMBERS):
        pass
    unsigned = FileStore(team)  # writing the files itself: teamrt would refuse it the team
    await unsigned.open([])
    await unsigned.append("worker", encode(Envelope.message("lead", "worker", "unsigned")))
    await unsigned.close()
    async with FileMailboxes(team) as mail:
        await mail.send(Envelope.message("lead", "worker", "signed"))
        assert [e.body for e in await _drain(mail)] == ["signed"]
    assert [q["reason"] for q in _quarantine(team)] == ["bad signature"]
    with pytest.raises(UsageError, match="at least 16 bytes"):
        MemoryMailboxes(key="short")


def test_a_signature_covers_the_team_and_every_byte_of_the_envelope() -> None:
    from teamrt.mail.log import encode, stamp
    from teamrt.mail.signing import Signer

    signer = Signer(KEY.encode())
    encoded = signer.sign(encode(Envelope.message("lead", "worker", {"n": 1})), "t")
    line = stamp(encoded, 7, b"t").rstrip(b"\n")
    assert signer.verify(line, "t")
    assert not signer.verify(line, "other")  # the team name is covered
    assert not signer.verify(line.replace(b'"n":1', b'"n":2'), "t")  # so is the body
    assert not signer.verify(line.replace(b'"sender":"lead"', b'"sender":"boss"'), "t")
    assert signer.verify(line.replace(b'"seq":7', b'"seq":8'), "t")  # seq is not (the lock's)
    assert not Signer(b"x" * 32).verify(line, "t")
