"""A Redis server that wants credentials: a wrong password, a wrong or disabled ACL user and a
missing password each say so (`StoreAuthFailed`), through the store, the view and the command
line; never "check that redis-server runs", never "Protocol error", never the password."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import anyio
import pytest
import redis

from teamrt.envelopes import Envelope
from teamrt.errors import StoreAuthFailed, StoreUnavailable
from teamrt.mail.locator import open_mailboxes, open_view
from tests.redis_server import PASSWORD, RedisServer, password_redis

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
