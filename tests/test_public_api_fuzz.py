"""Only teamrt's errors leave the public API, whatever goes in: generated garbage given to the
public constructors, to `send`, to `team.ask` through a peer that answers garbage, and to the
CLI as its argv. Each call either works or raises an error of `teamrt.errors` (the CLI: prints
one line and exits with a code); the one other exception allowed is the documented
`TypeError` of a constructor given an argument of the wrong Python type (see `teamrt.errors`).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teamrt import MemoryMailboxes
from teamrt.agents import Limits
from teamrt.cli.main import main
from teamrt.envelopes import Broadcast, Envelope, ErrorBody, Message, Request, Response
from teamrt.errors import TeamrtError
from teamrt.models import ScriptedModel
from teamrt.team import (
    CrashBody,
    DecisionBody,
    IdleBody,
    PlanBody,
    ProgressBody,
    ShutdownBody,
    TaskResult,
    Team,
    Teammate,
)

FAST = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))

_garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=70),
    st.just("a" * 65),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2),
    st.binary(max_size=4),
    st.builds(object),
    st.lists(st.integers() | st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.none() | st.integers() | st.text(max_size=5)),
    st.dictionaries(st.integers(), st.none(), min_size=1, max_size=2),
    st.recursive(st.none(), lambda inner: st.lists(inner, max_size=1), max_leaves=40),
)


@contextlib.contextmanager
def only_ours(*, type_errors: bool = False) -> Iterator[None]:
    """Let a teamrt error (and, where documented, a TypeError) pass; anything else fails."""
    try:
        yield
    except TeamrtError:
        pass
    except TypeError:
        if not type_errors:
            raise


def _call(make: Callable[[], object], *, type_errors: bool = False) -> None:
    with only_ours(type_errors=type_errors):
        make()


# --- constructors --------------------------------------------------------------------------

_BODIES = [TaskResult, ProgressBody, ShutdownBody, PlanBody, DecisionBody, IdleBody, CrashBody]
_BODY_FIELDS = ["answer", "stop_reason", "steps", "task", "plan", "event", "cost", "output", "last"]
_FIELDS = ["id", "ts", "deadline", "trace_id", "traceparent", "type", "v", "seq"]


@FAST
@given(
    a=_garbage | st.just("lead"),
    b=_garbage | st.just("worker"),
    body=_garbage,
    type_=_garbage | st.just("text"),
    timeout=_garbage | st.just(5.0),
    field=st.sampled_from(_FIELDS),
    value=_garbage | st.just(math.nan) | st.just(math.inf),
    model=st.sampled_from(_BODIES),
    kwargs=st.dictionaries(st.sampled_from([*_BODY_FIELDS, "x"]), _garbage, max_size=4),
)
def test_constructors_raise_only_teamrt_errors(
    a: Any, b: Any, body: Any, type_: Any, timeout: Any, field: str, value: Any,
    model: type[Any], kwargs: dict[str, Any],
) -> None:  # fmt: skip
    request = Envelope.request("lead", "worker", "q", timeout=5)
    _call(lambda: Envelope.message(a, b, body, type=type_, trace_id=value))
    _call(lambda: Envelope.broadcast(a, body, type=type_, trace_id=value))
    _call(lambda: Envelope.request(a, b, body, type=type_, timeout=timeout))
    _call(lambda: Envelope.response(request, body, type=type_))
    _call(lambda: Envelope.error(request, body, type_))
    for kind in (Message, Request, Response, Broadcast):
        with only_ours():
            kind(sender="lead", recipient=b, in_reply_to=a, **{field: value})
    _call(lambda: ErrorBody(error=a, message=b))
    _call(lambda: model(**kwargs))
    _call(lambda: Limits(max_steps=a, deadline=value), type_errors=True)
    scripted = ScriptedModel(["done"])
    _call(lambda: Teammate(a, model=scripted, max_queue=b, context=type_), type_errors=True)


# --- send ----------------------------------------------------------------------------------


@FAST
@given(field=st.sampled_from([*_FIELDS, "body", "recipient", "kind"]), value=_garbage)
def test_send_raises_only_teamrt_errors(field: str, value: Any) -> None:
    async def send() -> None:
        async with MemoryMailboxes(members=["lead", "worker"]) as mail:
            made = Envelope.request("lead", "worker", "q")
            try:
                envelope = made.model_copy(update={field: value})
            except TeamrtError:
                return
            with only_ours():
                await mail.send(envelope)
            with only_ours(type_errors=True):  # not an envelope at all
                await mail.send(value)

    anyio.run(send)


# --- team.ask through a peer answering garbage ---------------------------------------------


@FAST
@given(
    answers=st.lists(
        st.tuples(st.sampled_from(["result", "error", "task_progress", "other"]), _garbage),
        min_size=1,
        max_size=3,
    ),
    stream=st.booleans(),
)
def test_ask_of_a_peer_answering_garbage_raises_only_teamrt_errors(
    answers: list[tuple[str, Any]], stream: bool
) -> None:
    async def ask() -> None:
        mail = MemoryMailboxes(members=["lead", "w"])
        async with mail, Team(mail, [], remote=["w"]) as team:
            inbox = await mail.open_inbox("w")

            async def peer() -> None:
                request = await inbox.receive()
                for type_, body in answers:
                    with only_ours():  # what the peer could not even send is not the test
                        if type_ == "task_progress":
                            await mail.send(Envelope.message("w", "lead", body, type=type_))
                        else:
                            await mail.send(Envelope.response(request, body, type=type_))
                # and one that always goes (a malformed result): the first answer counts
                await mail.send(Envelope.response(request, None))
                await inbox.ack(request)

            async with anyio.create_task_group() as tg:
                tg.start_soon(peer)
                with only_ours(), anyio.fail_after(30):
                    if stream:
                        async with team.stream("w", "answer me", timeout=5) as events:
                            async for _ in events:
                                pass
                    else:
                        await team.ask("w", "answer me", timeout=5)
                tg.cancel_scope.cancel()

    anyio.run(ask)


# --- the CLI -------------------------------------------------------------------------------

_COMMANDS = ["send", "inspect", "repair", "export", "replay", "rerun", "fork", "eval"]
_OPTIONS = [
    "--from", "--to", "--kind", "--body", "--text", "--type", "--in-reply-to", "--format", "-o",
    "--json", "--inbox", "--at", "--agent", "--spec", "--since", "--until", "--grep", "--member",
    "--target", "--compare", "--from-run", "--html", "--as-human", "--durability", "--trace",
    "--agent-dir", "--timeout", "--wait",
]  # fmt: skip


_TEMPLATES = [
    ["send", "V", "--from", "V", "--to", "V", "--body", "V"],
    ["send", "V", "--from", "V", "--kind", "V", "--text", "V", "--in-reply-to", "V"],
    ["send", "team", "--from", "lead", "--kind", "broadcast", "--type", "V", "--body", "V"],
    ["inspect", "V", "--json"],
    ["repair", "V", "--inbox", "V"],
    ["export", "V", "V"],
    ["replay", "V", "--format", "V", "--since", "V", "--until", "V", "--grep", "V"],
    ["replay", "team", "--kind", "V", "--type", "V", "--trace", "V", "-o", "V"],
    ["fork", "V", "--at", "V", "V"],
    ["eval", "V", "--target", "V", "--json", "V"],
    ["eval", "--from-run", "V", "-o", "V", "--member", "V"],
    ["eval", "--compare", "V", "V"],
    ["rerun", "V", "--agent", "V", "--spec", "V"],
]


@pytest.fixture(scope="module")
def cli_cwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with a team of three in `team/` (the CLI may change it, and write
    files here)."""
    cwd = tmp_path_factory.mktemp("cli")

    async def make() -> None:
        async with MemoryMailboxes(members=[]):  # (imports, nothing else)
            pass
        from teamrt.mail import open_mailboxes

        async with open_mailboxes(cwd / "team", members=["lead", "worker", "w"]) as mail:
            request = Envelope.request("lead", "worker", {"q": 1}, type="task")
            await mail.send(request)
            await mail.send(Envelope.message("lead", "w", "hi"))

    anyio.run(make)
    return cwd


def _values(cwd: Path) -> st.SearchStrategy[str]:
    team = cwd / "team"
    words = [
        "team", str(team), f"file://{team}", "missing", str(team / "team.json"), "", "-", "{",
        '{"x": 1}', "[[[[", "nan", "-1", "1e999", "0.01", "../x", "a" * 65, "🙂", "lead",
        "worker", "w", "*", "request", "response", "json", "html", "out.html",
        "nowhere/out.html", "teamrt.demos.research_writer:researcher", "x:y",
        "redis://127.0.0.1:1/0?team=t", "http://x/", "file:relative", "\x00", "a\x00b",
        "2026-01-01", "yesterday", "--", "-x",
    ]  # fmt: skip
    return st.sampled_from(words) | st.text(max_size=8)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_cli_answers_any_argv_in_one_line(
    cli_cwd: Path, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = _values(cli_cwd)
    if data.draw(st.booleans()):  # words in any order
        command = data.draw(st.sampled_from(_COMMANDS))
        words = data.draw(st.lists(st.sampled_from(_OPTIONS) | value, max_size=6))
        if "--wait" in words or "--timeout" in words:  # a request nobody answers waits on
            words = [w for w in words if w not in ("--wait", "--timeout")]
        argv = [command, *words]
    else:  # a command as its usage says, with any values
        template = data.draw(st.sampled_from(_TEMPLATES))
        argv = [data.draw(value) if word == "V" else word for word in template]
    monkeypatch.chdir(cli_cwd)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage error: one line, exit code 2
            code = exc.code if isinstance(exc.code, int) else -1
            assert code == 2, (argv, err.getvalue())
    said = err.getvalue()
    assert isinstance(code, int), argv
    assert "Traceback" not in said and "unexpected" not in said, (argv, said)
    if code != 0:
        assert said.strip(), (argv, "exits", code, "saying nothing")
    assert os.getcwd() == str(cli_cwd)
