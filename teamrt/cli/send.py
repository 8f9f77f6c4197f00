"""`teamrt send`: one envelope from the shell, checked before anything is written.

The body is JSON (`--body`) or a plain string (`--text`); the sender is a member of the team, or
a person outside it who says so (`--as-human`), so a misspelt name is refused, not delivered."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pydantic import ValidationError

from teamrt.envelopes import Envelope, Request, Response
from teamrt.errors import InvalidEnvelope, UsageError
from teamrt.mail import open_mailboxes
from teamrt.mail.locator import from_env, is_url, redacted
from teamrt.names import validate_name


def team_dir(path: str) -> str:
    """A team directory argument that names a file is the caller's mistake, said up front."""
    if not path:
        raise UsageError("the team directory is an empty string; give one, e.g. mailboxes/demo")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(
            f"{path} is a file, not a team directory (one holds team.json and inboxes/)"
        )
    return path


def team_at(value: str | None) -> str:
    """A team argument: a store URL as given, a directory checked like `team_dir`, or
    `TEAMRT_STORE` when none was given."""
    locator = str(from_env(value))
    return locator if is_url(locator) else team_dir(locator)


MAX_DEPTH = 200  # the envelope encoder gives up at about 255 levels of nesting


def _depth(value: Any) -> int:
    """How deeply `value` nests lists and objects, without recursing."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            level.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _body(args: argparse.Namespace) -> Any:
    if args.text is not None:
        return args.text
    try:
        body = json.loads(args.body)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--body is not JSON ({exc.msg} at column {exc.colno}); quote a string as "
            "'\"like this\"', or send plain text with --text"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    if _depth(body) > MAX_DEPTH:
        raise _too_deep()
    return body


def _too_deep() -> UsageError:
    return UsageError(
        f"--body nests lists or objects more than {MAX_DEPTH} levels deep; send a flatter body"
    )


def _check_send(args: argparse.Namespace) -> None:
    args.dir = team_at(args.dir)
    validate_name(args.sender, what="sender (--from)")
    if args.kind == "broadcast":
        if args.to is not None:
            raise UsageError("a broadcast goes to every member: drop --to")
    elif args.to is None:
        raise UsageError(f"--kind {args.kind} needs --to NAME (the recipient)")
    if args.wait is not None and args.kind != "request":
        raise UsageError("--wait is only for --kind request")
    if args.kind == "response" and not args.in_reply_to:
        raise UsageError("--kind response needs --in-reply-to REQUEST_ID")
    if args.in_reply_to is not None and args.kind != "response":
        raise UsageError("--in-reply-to is only for --kind response")


def _envelope(args: argparse.Namespace, body: Any) -> Envelope:
    if args.kind == "message":
        return Envelope.message(args.sender, args.to, body, type=args.type or "text")
    if args.kind == "broadcast":
        return Envelope.broadcast(args.sender, body, type=args.type or "text")
    if args.kind == "request":
        return Envelope.request(
            args.sender, args.to, body, type=args.type or "request", timeout=args.wait
        )
    try:
        return Response(
            sender=args.sender,
            recipient=args.to,
            body=body,
            type=args.type or "result",
            in_reply_to=args.in_reply_to,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "envelope"
        hint = " (--in-reply-to takes the id of the request answered)" * (where == "in_reply_to")
        raise InvalidEnvelope(f"invalid response: {where}: {first['msg']}{hint}") from None


async def send(args: argparse.Namespace) -> int:
    _check_send(args)
    body = _body(args)
    async with open_mailboxes(args.dir, create=False, durability=args.durability) as mail:
        members = await mail.members_now()
        if args.sender not in members:
            if not args.as_human:
                raise UsageError(
                    f"--from {args.sender!r} is not a member of {redacted(args.dir)} (members: "
                    f"{', '.join(members) or 'none'}); check the spelling, or pass --as-human "
                    "to send as a person outside the roster"
                )
            if args.wait is not None:
                raise UsageError(
                    f"--wait needs an inbox for the answer, and {args.sender!r} is not a "
                    "member: send without --wait, or as a member"
                )
        envelope = _envelope(args, body)
        if isinstance(envelope, Request) and args.wait is not None:
            # watch for the answer; the sender's inbox is not consumed
            response = await mail.request(envelope, timeout=args.wait, consume=False)
            print(response.model_dump_json())
            return 0
        await mail.send(envelope)
        print(envelope.id)
    return 0
