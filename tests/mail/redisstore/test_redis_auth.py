"""A Redis server that wants credentials: a wrong password, a wrong or disabled ACL user and a
missing password each say so (`StoreAuthFailed`), through the store, the view and the command
line; never "check that redis-server runs", never "Protocol error", never the password."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from teamrt.envelopes import Envelope
from teamrt.errors import StoreAuthFailed, StoreUnavailable, UsageError
from teamrt.mail.locator import open_mailboxes, open_view, redacted
from teamrt.mail.redisstore import RedisStore, parse_locator
from tests.support.redis_server import PASSWORD, RedisServer, password_redis

__all__ = ["password_redis"]  # the fixture

USER, USER_PASSWORD = "writer", "pw-user-Kd93hQ"


@pytest.fixture
def acl_user(password_redis: RedisServer) -> RedisServer:
    """`password_redis` with an ACL user USER (password USER_PASSWORD) allowed everything."""
    admin: Any = redis.Redis(port=password_redis.port, password=PASSWORD, protocol=2)
    admin.execute_command("ACL", "SETUSER", USER, "on", f">{USER_PASSWORD}", "~*", "+@all")
    admin.close()
    return password_redis


def _url(server: RedisServer, credentials: str) -> str:
    return f"redis://{credentials}127.0.0.1:{server.port}/0?team=auth"


def _check(message: str, *, says: str, secret: str) -> None:
    assert says in message
    assert "redis-server runs" not in message
    assert "Protocol error" not in message
    assert secret not in message


async def _open_and_send(url: str) -> None:
    async with open_mailboxes(url, members=["lead", "worker"]) as mail:
        await mail.send(Envelope.message("lead", "worker", "hello"))


CASES = [
    ("", "requires a password"),  # none given: the store's first pipeline is refused whole
    (":wrong-pw-7b@", "authentication failed for user 'default'"),
    (f"{USER}:wrong-pw-7b@", f"authentication failed for user '{USER}'"),
    ("nobody:wrong-pw-7b@", "authentication failed for user 'nobody'"),
]


@pytest.mark.parametrize(("credentials", "says"), CASES)
def test_the_store_says_what_is_wrong_with_the_credentials(
    acl_user: RedisServer, credentials: str, says: str
) -> None:
    with pytest.raises(StoreAuthFailed) as caught:
        anyio.run(_open_and_send, _url(acl_user, credentials))
    assert not isinstance(caught.value, StoreUnavailable)  # retrying would not help
    _check(str(caught.value), says=says, secret="wrong-pw-7b")


@pytest.mark.parametrize(("credentials", "says"), CASES)
def test_the_view_says_what_is_wrong_with_the_credentials(
    acl_user: RedisServer, credentials: str, says: str
) -> None:
    anyio.run(_open_and_send, _url(acl_user, f":{PASSWORD}@"))  # the team exists
    with pytest.raises(StoreAuthFailed) as caught, open_view(_url(acl_user, credentials)) as view:
        view.members()
    _check(str(caught.value), says=says, secret="wrong-pw-7b")


def test_a_disabled_user_is_told_authentication_failed(acl_user: RedisServer) -> None:
    admin: Any = redis.Redis(port=acl_user.port, password=PASSWORD, protocol=2)
    admin.execute_command("ACL", "SETUSER", USER, "off")
    admin.close()
    with pytest.raises(StoreAuthFailed) as caught:
        anyio.run(_open_and_send, _url(acl_user, f"{USER}:{USER_PASSWORD}@"))
    _check(str(caught.value), says="authentication failed", secret=USER_PASSWORD)


def test_the_right_password_and_the_right_user_work(acl_user: RedisServer) -> None:
    anyio.run(_open_and_send, _url(acl_user, f":{PASSWORD}@"))
    anyio.run(_open_and_send, _url(acl_user, f"{USER}:{USER_PASSWORD}@"))
    with open_view(_url(acl_user, f"{USER}:{USER_PASSWORD}@")) as view:
        assert view.members() == ("lead", "worker")
        assert len(list(view.scan("worker"))) == 2


def test_the_command_line_says_authentication_failed(acl_user: RedisServer) -> None:
    anyio.run(_open_and_send, _url(acl_user, f":{PASSWORD}@"))
    for credentials, says in CASES:
        for command in (["inspect"], ["send", "--from", "lead", "--to", "worker", "--text", "x"]):
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "teamrt",
                    command[0],
                    _url(acl_user, credentials),
                    *command[1:],
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode != 0, (command, credentials)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr  # one line, no traceback
            _check(lines[0], says=says, secret="wrong-pw-7b")


# --- a store URL's password never shows: in no output, log or file of any command ---


WRONG = "wrong-Pw-55xq"


SPEC = "teamrt.demos.research_writer:writer"


def teamrt(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run `teamrt --log-level DEBUG ARGS`; everything it printed (stdout and stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "teamrt", "--log-level", "DEBUG", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return done.stdout + done.stderr


async def _make_team(url: str) -> str:
    async with open_mailboxes(url, members=["lead", "worker"]) as mail:
        request = Envelope.request("lead", "worker", {"task": "write"})
        await mail.send(request)
        await mail.send(Envelope.message("worker", "lead", "on it"))
        return str(request.id)


def _commands(url: str, at: str, work: Path) -> list[tuple[str, ...]]:
    """Every command that takes a locator, in the ways it shows one: success, errors, output."""
    return [
        ("send", url, "--from", "lead", "--to", "worker", "--text", "hi"),
        ("send", url, "--from", "ghost", "--to", "worker", "--text", "hi"),
        ("send", url, "--from", "lead", "--to", "ghost", "--text", "hi"),
        ("inspect", url),
        ("inspect", url, "--json"),
        ("replay", url),
        ("replay", url, "--format", "json"),
        ("replay", url, "--format", "html", "-o", str(work / "replay.html")),
        ("export", url, str(work / "masked")),
        ("fork", url, "--at", at, str(work / "forked")),
        ("repair", url),
        ("rerun", url, "--agent", "worker"),
        ("eval", "--from-run", url),
        ("run-agent", url, "--name", "ghost", "--spec", SPEC),
        ("bench", "--store", url.replace(PASSWORD, WRONG), "--quick"),
        ("demo", "two-hosts", "--store", url.replace(PASSWORD, WRONG)),
    ]


def _assert_hidden(text: str, where: str) -> None:
    assert PASSWORD not in text, where
    assert WRONG not in text, where


def _files_made(work: Path) -> str:
    return "\n".join(
        path.read_text(errors="replace") for path in sorted(work.rglob("*")) if path.is_file()
    )


COMMANDS = [" ".join(command[:1] + command[2:3]) for command in _commands("URL", "AT", Path())]


@pytest.mark.parametrize("password", [PASSWORD, WRONG])
@pytest.mark.parametrize("which", range(len(COMMANDS)), ids=COMMANDS)
def test_no_command_shows_the_password(
    password_redis: RedisServer, tmp_path: Path, password: str, which: int
) -> None:
    right = password_redis.url("masked")
    at = anyio.run(_make_team, right)
    url = right.replace(PASSWORD, password)
    work = tmp_path / "work"
    work.mkdir()
    command = _commands(url, at, work)[which]
    out = teamrt(*command, cwd=work)
    _assert_hidden(out, out)
    if command[1] == url:  # the same with the URL in TEAMRT_STORE
        again = teamrt(command[0], *command[2:], cwd=work, env={"TEAMRT_STORE": url})
        _assert_hidden(again, again)
    _assert_hidden(_files_made(work), "the files the command wrote")
    if password == WRONG and command[0] not in ("repair", "rerun"):  # those read files only
        assert "authentication failed" in out, out


def test_the_commands_ran_against_the_team(password_redis: RedisServer, tmp_path: Path) -> None:
    """The masking test's commands do reach the team with the right password."""
    url = password_redis.url("masked")
    at = anyio.run(_make_team, url)
    assert "exported 2 envelopes" in teamrt("export", url, str(tmp_path / "masked"), cwd=tmp_path)
    assert "worker" in teamrt("inspect", url, cwd=tmp_path)
    assert at in teamrt("replay", url, "--format", "json", cwd=tmp_path)


def test_run_agent_start_and_stop_lines_hide_the_password(
    password_redis: RedisServer, tmp_path: Path
) -> None:
    url = password_redis.url("agent")
    anyio.run(_make_team, url)
    child = subprocess.Popen(
        [sys.executable, "-m", "teamrt", "--log-level", "DEBUG", "run-agent", url,
         "--name", "worker", "--spec", SPEC],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        started = child.stdout.readline()
        assert "running as incarnation" in started, started
        assert "redis://:***@127.0.0.1" in started
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    _assert_hidden(started + out + err, "run-agent")


def test_redacted_masks_the_password_in_both_places() -> None:
    assert redacted("redis://:s3@h:1/0?team=a") == "redis://:***@h:1/0?team=a"
    assert redacted("redis://bob:s3@h/0?team=a&password=s4") == (
        "redis://bob:***@h/0?team=a&password=***"
    )
    assert redacted("unix://:s3@/run/redis.sock?db=0") == "unix://:***@/run/redis.sock?db=0"
    assert redacted("redis://h:1/0?team=a") == "redis://h:1/0?team=a"  # nothing to hide
    assert redacted("mailboxes/demo") == "mailboxes/demo"


def test_stores_and_their_errors_hide_the_password() -> None:
    url = "redis://bob:s3cr3t-x@127.0.0.1:1/0?team=a&password=s3cr3t-y"
    store = RedisStore(url)
    assert "s3cr3t" not in repr(store)
    assert "s3cr3t" not in parse_locator(url).shown
    with pytest.raises(UsageError) as caught:
        parse_locator(url.replace("team=a", "lease_ttl=no"))
    assert "s3cr3t" not in str(caught.value)
