"""A `file://` URL names a team directory (the path it spells, never a directory called `file:`
in the working directory), through the API, `TEAMRT_STORE` and the CLI; a URL of a scheme no
store has, or a file URL teamrt cannot take as a local path, is refused in one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from teamrt import Envelope
from teamrt.cli.main import main
from teamrt.errors import UsageError
from teamrt.mail import open_mailboxes, open_view
from teamrt.mail.locator import from_env, local_path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that must stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


@pytest.mark.parametrize("spelling", ["file://{}", "file://localhost{}", "file:{}"])
async def test_a_file_url_is_the_directory_it_names(
    tmp_path: Path, elsewhere: Path, spelling: str
) -> None:
    team = tmp_path / "my dir" / "team"
    url = spelling.format(str(team).replace(" ", "%20"))
    async with open_mailboxes(url, members=["lead", "worker"]) as mail:
        await mail.send(Envelope.message("lead", "worker", "hi"))
    assert (team / "team.json").is_file()
    with open_view(url) as view:
        assert list(view.members()) == ["lead", "worker"]
    assert list(elsewhere.iterdir()) == []


def test_the_cli_and_teamrt_store_take_a_file_url(
    tmp_path: Path, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "team"

    async def create() -> None:
        async with open_mailboxes(team, members=["lead", "worker"]):
            pass

    anyio.run(create)
    sent = ["send", f"file://{team}", "--from", "lead", "--to", "worker", "--text", "hi"]
    assert main(sent) == 0
    monkeypatch.setenv("TEAMRT_STORE", f"file://{team}")
    assert from_env(None) == str(team)
    assert main(["inspect"]) == 0
    with open_view(team) as view:
        assert [e.raw.count(b'"hi"') for e in view.scan("worker")] == [1]
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("locator", "says"),
    [
        ("file://otherhost/srv/team", "another host"),
        ("file:relative/team", "absolute"),
        ("file:///srv/team?team=x", "query"),
        ("http://example.com/team", "no store"),
        ("memory://team", "no store"),
    ],
)
def test_a_url_no_store_takes_is_refused(elsewhere: Path, locator: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        local_path(locator)
    with pytest.raises(UsageError, match=says):
        open_view(locator)
    assert list(elsewhere.iterdir()) == []


def test_plain_directories_are_left_as_they_are() -> None:
    assert local_path("mailboxes/demo") == "mailboxes/demo"
    assert local_path(Path("a:b")) == Path("a:b")  # a colon in a file name is no scheme
    assert local_path("redis://127.0.0.1:6379/0?team=t") == "redis://127.0.0.1:6379/0?team=t"
    assert os.fspath(local_path("./x")) == "./x"
