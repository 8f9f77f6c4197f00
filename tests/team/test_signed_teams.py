"""A signed team says so: the team records that it is signed and its key's fingerprint (never the
key), and a process holding no key, another key, or a key for an unsigned team is refused when
it opens the team (Mailboxes, Team, views, every CLI command), on files, in memory and in Redis.
A team made before teams recorded this opens as it always did."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from teamrt import Envelope, FileMailboxes, Mailboxes, open_mailboxes, open_view
from teamrt.errors import StoreError, TeamKeyMismatch, UsageError
from teamrt.mail.memory import MemoryStore
from teamrt.mail.signing import KEY_ENV, fingerprint
from teamrt.team import Team
from tests.support.redis_server import REDIS_SERVER, RedisServer, shared_redis
from tests.support.remote import TESTS

__all__ = ["shared_redis"]  # the fixture

KEY = "the team's key: 32 bytes of it.."
OTHER = "another key, not the team's one."
MEMBERS = ["lead", "w"]
STORES = ["files", pytest.param("redis", marks=pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed"))]  # fmt: skip


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture(params=STORES)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a team lives: a directory, or a Redis URL of a team of its own."""
    if request.param == "files":
        return str(tmp_path / "t")
    server: RedisServer = request.getfixturevalue("shared_redis")
    return server.url("t" + os.urandom(6).hex())


async def _make(where: str, key: str | bytes | None = KEY) -> str:
    """Create the team (signed with `key`), with one message in w's inbox; return its id."""
    async with open_mailboxes(where, members=MEMBERS, key=key) as mail:
        sent = Envelope.message("lead", "w", "hello")
        await mail.send(sent)
        return sent.id


def _settings(where: str, key: str | None = KEY) -> dict[str, Any]:
    """What the team records: team.json, or the team's meta hash in Redis."""
    if "://" not in where:
        data: dict[str, Any] = json.loads((Path(where) / "team.json").read_bytes())
        return data
    view: Any = open_view(where, key=key)
    view.close()
    client: Any = redis.Redis.from_url(where.partition("?")[0])
    try:
        return {k.decode(): v.decode() for k, v in client.hgetall(view.keys.meta).items()}
    finally:
        client.close()


# -- opening through the API --


async def test_a_signed_team_refuses_a_process_without_the_key(where: str) -> None:
    await _make(where)
    with pytest.raises(TeamKeyMismatch, match=f"is signed.*{KEY_ENV}") as caught:
        async with open_mailboxes(where, members=["intruder"]):
            pass
    assert "intruder" not in str(caught.value)
    async with open_mailboxes(where, key=KEY) as mail:
        assert await mail.members_now() == tuple(MEMBERS)  # the refused open added nobody


async def test_a_signed_team_refuses_another_key(where: str) -> None:
    await _make(where)
    with pytest.raises(TeamKeyMismatch, match="another key") as caught:
        async with open_mailboxes(where, key=OTHER):
            pass
    assert KEY not in str(caught.value) and OTHER not in str(caught.value)


async def test_a_signed_team_opens_with_its_key_given_or_in_the_environment(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _make(where)
    monkeypatch.setenv(KEY_ENV, KEY)
    async with open_mailboxes(where) as mail:
        inbox = await mail.open_inbox("w")
        received = await inbox.receive(timeout=10)
        assert received.body == "hello"
        await inbox.ack(received)
    monkeypatch.delenv(KEY_ENV)
    async with open_mailboxes(where, key=KEY) as mail:
        await mail.send(Envelope.message("lead", "w", "again"))
        inbox = await mail.open_inbox("w")
        assert (await inbox.receive(timeout=10)).body == "again"


async def test_an_unsigned_team_refuses_a_process_with_a_key(where: str) -> None:
    await _make(where, key=None)
    settings = _settings(where, key=None)
    assert settings.get("signed", settings.get("key_fingerprint")) in (False, "")
    with pytest.raises(TeamKeyMismatch, match="not signed"):
        async with open_mailboxes(where, key=KEY):
            pass
    async with open_mailboxes(where) as mail:
        inbox = await mail.open_inbox("w")
        assert (await inbox.receive(timeout=10)).body == "hello"


async def test_team_does_not_start_with_a_wrong_or_missing_key(where: str, tmp_path: Path) -> None:
    from tests.support.remote_specs import echo

    await _make(where)
    for key in (None, OTHER):
        with pytest.raises(TeamKeyMismatch):
            async with open_mailboxes(where, key=key) as mail, Team(mail, [echo]):
                pytest.fail("the team started without the team's key")
    async with (
        open_mailboxes(where, key=KEY) as mail,
        Team(mail, [echo], agent_dir=tmp_path / "agents") as team,
    ):
        assert (await team.ask("w", "say something", timeout=30)).answer == "echo"


async def test_a_memory_store_keeps_the_key_of_its_first_opening() -> None:
    store = MemoryStore("t")
    async with Mailboxes(store, members=MEMBERS, key=KEY) as mail:
        await mail.send(Envelope.message("lead", "w", "hello"))
    for key in (None, OTHER):
        with pytest.raises(TeamKeyMismatch):
            async with Mailboxes(store, key=key):
                pass
    async with Mailboxes(store, key=KEY) as mail:
        assert (await mail.inbox("w").receive(timeout=5)).body == "hello"
    unsigned = MemoryStore("u")
    async with Mailboxes(unsigned, members=MEMBERS):
        pass
    with pytest.raises(TeamKeyMismatch, match="not signed"):
        async with Mailboxes(unsigned, key=KEY):
            pass


async def test_views_refuse_a_wrong_or_missing_key(where: str) -> None:
    await _make(where)
    for key in (None, OTHER):
        with pytest.raises(TeamKeyMismatch):
            open_view(where, key=key)
    with open_view(where, key=KEY) as view:
        assert view.members() == tuple(MEMBERS)


# -- what the team records --


async def test_the_team_records_a_fingerprint_that_never_reveals_the_key(where: str) -> None:
    await _make(where)
    settings = _settings(where)
    team = open_view(where, key=KEY).team
    recorded = settings["key_fingerprint"]
    assert recorded == fingerprint(KEY.encode(), team)
    assert len(recorded) == 16 and int(recorded, 16) >= 0
    if "://" not in where:
        assert settings["signed"] is True
    raw = KEY.encode()
    shown = json.dumps(settings)
    for secret in (KEY, raw.hex(), hashlib.sha256(raw).hexdigest()[:16]):
        assert secret not in shown
    if "://" not in where:  # nor does anything else the team keeps
        files = [path for path in Path(where).rglob("*") if path.is_file()]
        assert files and not [path for path in files if raw in path.read_bytes()]
    assert fingerprint(OTHER.encode(), team) != recorded  # it tells keys apart
    assert fingerprint(raw, team + "x") != recorded  # and one key's teams apart


async def test_a_team_made_before_teams_recorded_signing_opens_as_before(tmp_path: Path) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS):
        pass
    roster = json.loads((team / "team.json").read_bytes())
    for field in ("signed", "key_fingerprint"):
        roster.pop(field, None)
    (team / "team.json").write_text(json.dumps(roster))
    async with FileMailboxes(team, key=KEY) as mail:  # signs, and checks signatures
        await mail.send(Envelope.message("lead", "w", "signed"))
        received = await mail.inbox("w").receive(timeout=5)
        assert received.body == "signed"
        await mail.inbox("w").ack(received)
    async with FileMailboxes(team) as mail:  # accepts anything
        await mail.send(Envelope.message("lead", "w", "unsigned"))
        assert (await mail.inbox("w").receive(timeout=5)).body == "unsigned"
    assert "signed" not in json.loads((team / "team.json").read_bytes())  # and stays as it was


@pytest.mark.parametrize("record", [{"signed": "yes"}, {"signed": True}, {"signed": 1}])
async def test_a_roster_with_a_malformed_signing_record_is_unreadable(
    tmp_path: Path, record: dict[str, Any]
) -> None:
    team = tmp_path / "t"
    async with FileMailboxes(team, members=MEMBERS, key=KEY):
        pass
    roster = json.loads((team / "team.json").read_bytes())
    roster.pop("key_fingerprint")
    (team / "team.json").write_text(json.dumps({**roster, **record}))
    with pytest.raises(StoreError, match="unreadable"):
        async with FileMailboxes(team, key=KEY):
            pass
    with pytest.raises(StoreError, match="unreadable"):
        open_view(team, key=KEY)


async def test_a_redis_team_made_before_teams_recorded_signing_opens_as_before(
    shared_redis: RedisServer,
) -> None:
    url = shared_redis.url()
    await _make(url, key=None)
    view: Any = open_view(url)
    view.close()
    client: Any = redis.Redis.from_url(url.partition("?")[0])
    try:
        client.hdel(view.keys.meta, "key_fingerprint")
    finally:
        client.close()
    async with open_mailboxes(url, key=KEY) as mail:
        inbox = await mail.open_inbox("w")
        await mail.send(Envelope.message("lead", "w", "signed"))
        assert [(await inbox.receive(timeout=10)).body] == ["signed"]  # "hello" is unsigned
    async with open_mailboxes(url) as mail:
        assert (await mail.open_inbox("w")) is not None


async def test_a_copy_of_a_signed_team_is_signed(tmp_path: Path) -> None:
    team, copy = tmp_path / "t", tmp_path / "copy" / "t"
    await _make(str(team))
    from teamrt.mail import export_team

    with open_view(team, key=KEY) as view:
        export_team(view, copy)
    assert _settings(str(copy))["key_fingerprint"] == _settings(str(team))["key_fingerprint"]
    with pytest.raises(TeamKeyMismatch):
        async with FileMailboxes(copy):
            pass
    async with FileMailboxes(copy, key=KEY) as mail:
        assert (await mail.inbox("w").receive(timeout=5)).body == "hello"


# -- every CLI command --


def _env(key: str | None) -> dict[str, str]:
    """This environment with `key` as the team key (or none), and tests/ importable."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])
    if key is not None:
        env[KEY_ENV] = key
    return env


def _teamrt(*args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teamrt", *args],
        capture_output=True,
        text=True,
        timeout=50,
        env=_env(key),
        check=False,
    )


def _spawn(*args: str, key: str | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "teamrt", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(key),
    )


def _commands(where: str, out: Path, at: str) -> Iterator[tuple[str, list[str]]]:
    """Each command on the team at `where` (the new directories it makes go under `out`)."""
    local = "://" not in where
    team = "t" if local else where.rpartition("team=")[2]  # a copy is named after its team
    yield "send", ["send", where, "--from", "lead", "--to", "w", "--text", "hi"]
    yield "inspect", ["inspect", where, "--json"]
    yield "replay", ["replay", where, "--format", "json"]
    yield "export", ["export", where, str(out / "export" / team)]
    yield "fork", ["fork", where, str(out / "fork" / team), "--at", at]
    if local:
        yield "repair", ["repair", where, "--json"]
        yield "repair --inbox", ["repair", where, "--inbox", "w", "--json"]


COMMANDS = ["send", "inspect", "replay", "export", "fork", "repair", "repair --inbox"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_wrong_or_missing_key(
    where: str, command: str, tmp_path: Path
) -> None:
    at = anyio.run(_make, where)
    commands = dict(_commands(where, tmp_path / "out", at))
    if command not in commands:
        pytest.skip(f"{command} is for team directories")
    args = commands[command]
    missing = _teamrt(*args, key=None)
    assert (missing.returncode, missing.stdout) == (2, ""), missing.stderr
    assert "is signed" in missing.stderr and KEY_ENV in missing.stderr
    wrong = _teamrt(*args, key=OTHER)
    assert wrong.returncode == 2 and "another key" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "out").exists()  # nothing was made by a refused command
    right = _teamrt(*args, key=KEY)
    assert right.returncode == 0, right.stderr
    if command == "export":  # the copy is signed as its source is
        (copy,) = (tmp_path / "out" / "export").iterdir()
        assert _settings(str(copy))["key_fingerprint"] == fingerprint(KEY.encode(), copy.name)
    if command == "inspect":  # which says that the team is signed, and with which key
        team = json.loads(right.stdout)["team"]
        assert json.loads(right.stdout)["signing"] == fingerprint(KEY.encode(), team)
        shown = _teamrt("inspect", where, key=KEY).stdout.splitlines()[0]
        assert shown.endswith(
            f"members, signed (key fingerprint {fingerprint(KEY.encode(), team)})"
        )


def _run_agent(where: str, agents: Path) -> list[str]:
    return ["run-agent", where, "--name", "w", "--spec", "remote_specs:echo",
            "--agent-dir", str(agents)]  # fmt: skip


def test_run_agent_refuses_a_wrong_or_missing_key(where: str, tmp_path: Path) -> None:
    anyio.run(_make, where)
    args = _run_agent(where, tmp_path / "agents")
    for key in (None, OTHER):
        refused = _teamrt(*args, key=key)
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        assert ("is signed" if key is None else "another key") in refused.stderr


async def test_run_agent_serves_a_signed_team_with_its_key(where: str, tmp_path: Path) -> None:
    await _make(where)
    proc = _spawn(*_run_agent(where, tmp_path / "agents"), key=KEY)
    try:
        async with open_mailboxes(where, key=KEY) as mail:
            with anyio.fail_after(40):
                while await mail.store.member_alive("w") is not True:
                    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                    await anyio.sleep(0.05)
            async with Team(mail, [], remote=["w"]) as team:
                assert (await team.ask("w", "say something", timeout=30)).answer == "echo"
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=40))
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


# -- keys that are not UTF-8 text --

RAW_KEY = bytes(range(128, 160))  # 32 bytes, none of them UTF-8 text


async def test_a_key_in_the_environment_is_its_bytes_even_when_they_are_not_utf8(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """POSIX environments hold bytes: `TEAMRT_TEAM_KEY` is the same key as those bytes given as
    `key=` (Python shows them as a str with surrogate escapes, which `str.encode` refuses)."""
    team = tmp_path / "t"
    await _make(str(team), key=RAW_KEY)
    monkeypatch.setitem(os.environb, KEY_ENV.encode(), RAW_KEY)
    async with FileMailboxes(team) as mail:
        assert (await mail.inbox("w").receive(timeout=5)).body == "hello"
    with open_view(team):
        pass


def test_a_command_takes_a_key_in_the_environment_that_is_not_utf8(tmp_path: Path) -> None:
    team = tmp_path / "t"
    anyio.run(_make, str(team), RAW_KEY)
    env: dict[bytes, bytes] = {k: v for k, v in os.environb.items() if k != KEY_ENV.encode()}
    env[KEY_ENV.encode()] = RAW_KEY
    done = subprocess.run(
        [sys.executable, "-m", "teamrt", "send", str(team), "--from", "lead", "--to", "w",
         "--text", "hi"],
        capture_output=True, text=True, timeout=50, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


async def test_a_str_key_with_surrogate_escapes_is_the_bytes_it_escapes(tmp_path: Path) -> None:
    """A key read from argv or the environment as str (surrogate escapes for bytes that are
    not UTF-8) opens the team made with those bytes."""
    team = tmp_path / "t"
    await _make(str(team), key=RAW_KEY)
    async with FileMailboxes(team, key=os.fsdecode(RAW_KEY)) as mail:
        assert (await mail.inbox("w").receive(timeout=5)).body == "hello"


def test_a_key_that_cannot_be_encoded_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="team key"):
        FileMailboxes("unused", key="\ud800" * 16)


async def test_a_renamed_signed_team_says_it_was_renamed_not_that_the_key_is_another(
    tmp_path: Path,
) -> None:
    """A team directory's name is its team, and the fingerprint (like every signature) covers
    it: after `mv t u` the right key no longer fits, and the refusal must say why."""
    await _make(str(tmp_path / "t"))
    (tmp_path / "t").rename(tmp_path / "u")
    with pytest.raises(TeamKeyMismatch) as caught:
        async with FileMailboxes(tmp_path / "u", key=KEY):
            pass
    message = str(caught.value)
    assert "'t'" in message and "renamed" in message and "another key" not in message


_RACER = """
import sys, time, anyio
from pathlib import Path
from teamrt import open_mailboxes
from teamrt.errors import TeamKeyMismatch
where, key, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
async def main() -> None:
    try:
        async with open_mailboxes(where, members=["lead", "w"], key=key):
            print("opened")
    except TeamKeyMismatch:
        print("refused")
anyio.run(main)
"""


def _racer(where: str, key: str, go: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _RACER, where, key, str(go)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_processes_creating_a_team_with_different_keys_agree_on_one(
    where: str, tmp_path: Path
) -> None:
    """Both start before the team exists: one creates it with its key, the other is refused,
    and the team records the winner's key."""
    go = tmp_path / "go"
    racers = [_racer(where, key, go) for key in (KEY, OTHER)]
    go.touch()
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=50)
        assert racer.returncode == 0, err
        outcomes.append(out.strip())
    assert sorted(outcomes) == ["opened", "refused"]
    winner = (KEY, OTHER)[outcomes.index("opened")]
    team = "t" if "://" not in where else where.rpartition("team=")[2]
    assert _settings(where, winner)["key_fingerprint"] == fingerprint(winner.encode(), team)
