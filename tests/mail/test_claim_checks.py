"""Payloads over the envelope limit travel as claim checks: a blob beside the inbox, fetched and
verified by the receiver, on every store; over `max_blob` a clear error, and a teammate whose
answer is too big answers with that error and goes on serving."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from anyio import WouldBlock

from teamrt import BlobTooLarge, Envelope, RemoteError
from teamrt.errors import UnsafeDirectory
from teamrt.mail import FileMailboxes, FileStore, Mailboxes, MemoryMailboxes
from teamrt.mail.claims import CLAIM, claim_of
from teamrt.mail.filestore.blobs import blob_path
from teamrt.mail.memory import MemoryStore
from teamrt.mail.redisstore import RedisStore
from teamrt.models import FunctionModel
from teamrt.models.base import ChatMessage, ToolSpec
from teamrt.team import Team, Teammate
from tests.support.redis_server import REDIS_SERVER, RedisServer, shared_redis
from tests.support.remote import exit_code, run_agent, until_running

__all__ = ["shared_redis"]  # the fixture

MiB = 1 << 20
STORES = ["files", "memory", pytest.param("redis", marks=pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed"))]  # fmt: skip


def payload(size: int, seed: str = "x") -> str:
    """`size` characters that differ all along (a blob mixed up with another shows)."""
    block = hashlib.sha256(seed.encode()).hexdigest()
    out, n = [], 0
    while n < size:
        block = hashlib.sha256(block.encode()).hexdigest()
        out.append(block)
        n += len(block)
    return "".join(out)[:size]


MakeMail = Callable[..., Mailboxes]


@pytest.fixture(params=STORES)
def make_mail(request: pytest.FixtureRequest, tmp_path: Path) -> MakeMail:
    kind: str = request.param

    def make(members: Sequence[str] = ("lead", "w"), **options: Any) -> Mailboxes:
        if kind == "files":
            return FileMailboxes(tmp_path / "t", members=members, **options)
        if kind == "memory":
            return MemoryMailboxes("t", members=members, **options)
        server: RedisServer = request.getfixturevalue("shared_redis")
        url = getattr(request.node, "_redis_url", None) or server.url()
        request.node._redis_url = url  # every store of one test opens the same team
        return Mailboxes(RedisStore(url, **options), members=members)

    return make


def tamper(mail: Mailboxes, digest: str, data: bytes | None) -> None:
    """Replace (or, with None, remove) a blob behind the store's back."""
    store = mail.store
    if isinstance(store, MemoryStore):
        if data is None:
            del store.blobs[digest]
        else:
            store.blobs[digest] = data
    elif isinstance(store, RedisStore):
        client: Any = redis.Redis(port=store.locator.port, protocol=2)
        try:
            if data is None:
                client.hdel(store.keys.blobs, digest)
            else:
                client.hset(store.keys.blobs, digest, data)
        finally:
            client.close()
    else:
        path = blob_path(Path(store.path), digest)  # type: ignore[attr-defined]
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)


def only_claim(mail: Mailboxes, member: str) -> str:
    """The digest of the one claim check in `member`'s inbox (as the log holds it)."""
    with mail.store.view() as view:
        claims = [claim_of(e.body) for e in map(_decoded, view.scan(member))]
    found = [c for c in claims if c is not None]
    assert len(found) == 1
    return found[0].sha256


def _decoded(entry: Any) -> Any:
    from teamrt.mail.log import decode_line

    return decode_line(entry.raw)


async def test_a_large_text_and_json_body_arrive_intact(make_mail: MakeMail) -> None:
    text, data = payload(3 * MiB), {"rows": [payload(1000, str(i)) for i in range(2000)]}
    async with make_mail() as mail:
        inbox = await mail.open_inbox("w")
        await mail.send(Envelope.message("lead", "w", text))
        await mail.send(Envelope.message("lead", "w", data, type="table"))
        await mail.send(Envelope.message("lead", "w", "small"))
        first, second, third = [await inbox.receive(timeout=10) for _ in range(3)]
        assert first.body == text and first.type == "text"
        assert second.body == data and second.type == "table"
        assert third.body == "small"
        await inbox.ack(first, second, third)
        with mail.store.view() as view:  # the log holds small references, not the payloads
            assert all(len(entry.raw) < 1024 for entry in view.scan("w"))


async def test_send_many_with_a_claim_check_keeps_the_order(make_mail: MakeMail) -> None:
    big = payload(2 * MiB)
    async with make_mail() as mail:
        inbox = await mail.open_inbox("w")
        await mail.send_many(
            [Envelope.message("lead", "w", body) for body in ("one", big, "three")]
        )
        got = [(await inbox.receive(timeout=10)).body for _ in range(3)]
        assert got == ["one", big, "three"]


async def test_a_payload_over_max_blob_is_refused_and_nothing_is_sent(
    make_mail: MakeMail,
) -> None:
    async with make_mail(max_blob=2 * MiB) as mail:
        inbox = await mail.open_inbox("w")
        with pytest.raises(BlobTooLarge, match=r"carries 3\.0 MiB, over max_blob=2\.0 MiB"):
            await mail.send(Envelope.message("lead", "w", payload(3 * MiB)))
        await mail.send(Envelope.message("lead", "w", "after"))
        assert (await inbox.receive(timeout=10)).body == "after"
        with mail.store.view() as view:
            assert len(list(view.scan("w"))) == 1


@pytest.mark.parametrize("damage", ["tampered", "truncated", "missing"])
async def test_a_damaged_blob_is_quarantined_never_delivered(
    make_mail: MakeMail, damage: str
) -> None:
    big = payload(2 * MiB)
    async with make_mail() as mail:
        await mail.send(Envelope.message("lead", "w", big))
        digest = only_claim(mail, "w")
        if damage == "tampered":
            tamper(mail, digest, b"y" + big.encode()[1:])  # same size, other bytes
        else:
            tamper(mail, digest, big.encode()[:1000] if damage == "truncated" else None)
        await mail.send(Envelope.message("lead", "w", "after"))
        inbox = await mail.open_inbox("w")
        got = await inbox.receive(timeout=10)
        assert got.body == "after"  # the damaged one was skipped, not delivered
        await inbox.ack(got)
        with pytest.raises(WouldBlock):
            inbox.receive_nowait()
        with mail.store.view() as view:
            (record,) = view.quarantined("w")
        reason = {
            "tampered": "fails its digest check",
            "truncated": "has 1000 bytes, not the 2097152",
            "missing": "is missing",
        }[damage]
        assert f"claim check blob {digest} {reason}" in record["reason"]


def _answers(sizes: dict[str, int]) -> FunctionModel:
    """A teammate that answers task `name` with `sizes[name]` characters."""

    def brain(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
        task = next(m.content or "" for m in reversed(messages) if m.role == "user")
        name = next(name for name in sizes if name in task)
        return payload(sizes[name], name)

    return FunctionModel(brain)


async def test_a_5_mib_answer_from_a_teammate_reaches_the_lead_intact(
    make_mail: MakeMail,
) -> None:
    answers = _answers({"big": 5 * MiB, "small": 10})
    async with make_mail() as mail, Team(mail, [Teammate("w", answers)]) as team:
        result = await team.ask("w", "the big one", timeout=30)
        assert result.answer == payload(5 * MiB, "big")
        result = await team.ask("w", "the small one", timeout=30)
        assert result.answer == payload(10, "small")


async def test_an_answer_over_max_blob_is_an_error_and_the_teammate_serves_on(
    make_mail: MakeMail,
) -> None:
    # max_blob is set low to keep the test fast: 100 MiB against the default is the same path
    async with make_mail(max_blob=4 * MiB) as mail:
        answers = _answers({"huge": 6 * MiB, "small": 10})
        async with Team(mail, [Teammate("w", answers)]) as team:
            with pytest.raises(RemoteError) as refused:
                await team.ask("w", "the huge one", timeout=30)
            assert refused.value.error_type == "BlobTooLarge"
            assert "w's answer" in refused.value.remote_message
            assert "6.0 MiB, over max_blob=4.0 MiB" in refused.value.remote_message
            result = await team.ask("w", "the small one", timeout=30)
            assert result.answer == payload(10, "small")
            # the teammate sends its answer, then marks itself idle: the ask may return between
            with anyio.fail_after(30):
                while team.status["w"].state != "idle":  # noqa: ASYNC110 -- the runner decides
                    await anyio.sleep(0.01)
            assert team.status["w"].restarts == 0


async def test_an_answer_over_the_default_max_blob_is_an_error(tmp_path: Path) -> None:
    async with MemoryMailboxes("t", members=["lead", "w"]) as mail:
        answers = _answers({"huge": 65 * MiB, "small": 10})
        async with Team(mail, [Teammate("w", answers)]) as team:
            with pytest.raises(RemoteError, match=r"over max_blob=64\.0 MiB"):
                await team.ask("w", "the huge one", timeout=50)
            assert (await team.ask("w", "the small one", timeout=30)).answer == payload(10, "small")


async def test_a_body_with_a_claim_key_among_others_is_ordinary(make_mail: MakeMail) -> None:
    async with make_mail() as mail:
        inbox = await mail.open_inbox("w")
        body = {CLAIM: {"sha256": "0" * 64, "size": 1, "kind": "text"}, "note": "mine"}
        await mail.send(Envelope.message("lead", "w", body, type="note"))
        assert (await inbox.receive(timeout=10)).body == body


async def test_a_blob_of_a_signed_team_is_vouched_for_by_the_signature(tmp_path: Path) -> None:
    big = payload(2 * MiB)
    key = "k" * 32
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"], key=key) as mail:
        await mail.send(Envelope.message("lead", "w", big))
        inbox = mail.inbox("w")
        with anyio.fail_after(10):
            got = await inbox.receive()
        assert got.body == big


def _sized(size: int) -> str:
    """What tests/support/claim_specs.py's `sizer` answers to "answer SIZE"."""
    return "".join(chr(ord("a") + i % 26) for i in range(26)) * (size // 26) + "z" * (size % 26)


# 65 MiB answers cost the child seconds of CPU in its event loop, which on a loaded machine can
# outlast its lease's 5 s without a heartbeat: a long run, not the quick suite's
@pytest.mark.stress
async def test_a_teammate_in_another_process_answers_large_and_too_large(tmp_path: Path) -> None:
    team_dir = tmp_path / "t"
    async with FileMailboxes(team_dir, members=["lead", "w"]) as mail:
        proc = run_agent(team_dir, "sizer", module="claim_specs")
        try:
            await until_running(mail, proc)
            async with Team(mail, [], remote=["w"]) as team:
                result = await team.ask("w", f"answer {5 * MiB}", timeout=50)
                assert result.answer == _sized(5 * MiB)
                with pytest.raises(RemoteError, match=r"65\.0 MiB, over max_blob=64\.0 MiB"):
                    await team.ask("w", f"answer {65 * MiB}", timeout=50)
                assert (await team.ask("w", "answer 10", timeout=50)).answer == _sized(10)
            code, err = await exit_code(proc, timeout=30)
            assert code == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_a_large_broadcast_reaches_every_other_member(make_mail: MakeMail) -> None:
    big = payload(2 * MiB)
    async with make_mail(("lead", "w", "v")) as mail:
        await mail.send(Envelope.broadcast("lead", big))
        for name in ("w", "v"):
            inbox = await mail.open_inbox(name)
            assert (await inbox.receive(timeout=10)).body == big


async def test_a_request_that_does_not_consume_gets_a_large_answer(tmp_path: Path) -> None:
    big = payload(2 * MiB)
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]) as mail:

        async def answer() -> None:
            inbox = mail.inbox("w")
            request = await inbox.receive(timeout=10)
            await mail.send(Envelope.response(request, big))
            await inbox.ack(request)

        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            asked = Envelope.request("lead", "w", "the big one", type="task")
            response = await mail.request(asked, timeout=10, consume=False, require_live=False)
        assert response.body == big


@pytest.mark.parametrize("kind", ["files", "redis"])
async def test_destroying_a_team_deletes_its_blobs(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    if kind == "redis" and REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")

    def store() -> FileStore | RedisStore:
        if kind == "files":
            return FileStore(tmp_path / "t")
        server: RedisServer = request.getfixturevalue("shared_redis")
        url = getattr(request.node, "_redis_url", None) or server.url()
        request.node._redis_url = url
        return RedisStore(url)

    async with Mailboxes(store(), members=["lead", "w"]) as mail:
        await mail.send(Envelope.message("lead", "w", payload(2 * MiB)))
        digest = only_claim(mail, "w")
    doomed = store()
    assert doomed.blob_get_nowait(digest) is not None
    await doomed.destroy()
    assert doomed.blob_get_nowait(digest) is None
    await doomed.close()


async def test_a_blobs_directory_another_could_write_is_refused(tmp_path: Path) -> None:
    async with FileMailboxes(tmp_path / "t", members=["lead", "w"]):
        pass
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "t" / "blobs").symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match="blobs is a symbolic link"):
        async with FileMailboxes(tmp_path / "t"):
            pass
