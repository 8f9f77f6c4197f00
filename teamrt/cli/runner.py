"""The one place `teamrt` commands run: what went wrong becomes one line on stderr (exit code 2
for the caller's mistake, 1 for a failure, never a traceback unless `--log-level DEBUG` asks),
and SIGINT / SIGTERM cancel the command, which shuts down whatever team it runs gracefully
(exit code 130 / 143). Commands raise teamrt's own errors; this module only words them."""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import os
import signal
import sys
import threading
from typing import NoReturn

import anyio
from anyio.abc import TaskStatus

from teamrt import telemetry
from teamrt.errors import TeamrtError, UsageError

log = logging.getLogger("teamrt.cli")

#: The exit code of `teamrt run-agent --exit-on-outage` stopped by a store outage longer than
#: its tolerance (EX_TEMPFAIL: a supervisor may start it again later).
EXIT_OUTAGE = 75


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake said on one line (what was wrong, where to read more)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record comes (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


_handler = _Stderr()
_handler.setFormatter(
    logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
)


def configure_logging(level: str) -> None:
    """teamrt's loggers (`teamrt.*`) to stderr from `level` up."""
    logger = logging.getLogger("teamrt")
    _handler.setLevel(level)
    if _handler not in logger.handlers:
        logger.addHandler(_handler)
    if logger.getEffectiveLevel() > _handler.level:
        logger.setLevel(level)


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside task-group exception groups: the one worth a line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _os_error(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


async def supervised(args: argparse.Namespace) -> int:
    """Run an async command and end it on the first SIGINT or SIGTERM, with 128 + the signal.

    A command marked `graceful` is told through `args.stop` (an event) and winds down itself,
    e.g. leaves its team's block so that the team asks its teammates to stop after their step;
    any other is cancelled. A second signal gets the default handling: it stops at once."""
    received: list[int] = []
    args.stop = anyio.Event()
    code = 0

    async def watch(task_status: TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                received.append(signum)
                print(
                    f"teamrt {args.command}: {signal.Signals(signum).name} received, stopping "
                    "(a second one stops at once)",
                    file=sys.stderr,
                    flush=True,
                )
                if getattr(args, "graceful", False):
                    args.stop.set()
                else:
                    tg.cancel_scope.cancel()
                return

    async with anyio.create_task_group() as tg:
        if threading.current_thread() is threading.main_thread():  # where signals arrive
            await tg.start(watch)
        code = await args.run(args)
        tg.cancel_scope.cancel()
    return 128 + received[0] if received else code


class _Terminated(BaseException):
    """SIGTERM during a command that runs no team (inspect, replay, bench): unwinds it like
    Ctrl-C does, so that its `finally` blocks (scratch directories, say) still run."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def execute(args: argparse.Namespace) -> int:
    """Run one command; say what went wrong in one line, with the exit code that fits."""
    name = f"teamrt {args.command}"
    try:
        telemetry.enable_from_env()  # TEAMRT_OTEL=1: spans through the global tracer provider
        if inspect.iscoroutinefunction(args.run):
            return int(anyio.run(supervised, args))
        if threading.current_thread() is not threading.main_thread():
            return int(args.run(args))
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            return int(args.run(args))
        finally:
            signal.signal(signal.SIGTERM, previous)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"{name}: SIGTERM received, stopped", file=sys.stderr)
        return 143
    except BrokenPipeError:  # `teamrt replay DIR | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a message for the user, e.g. a missing extra
            print(f"{name}: {exc.code}", file=sys.stderr)
            return 1
        raise
    except BaseException as raised:
        failure = _leaf(raised)
        if isinstance(failure, KeyboardInterrupt):
            print(f"{name}: interrupted", file=sys.stderr)
            return 130
        if isinstance(failure, SystemExit) and isinstance(failure.code, str):
            print(f"{name}: {failure.code}", file=sys.stderr)  # raised inside a task group
            return 1
        if not isinstance(failure, Exception):
            raise
        log.debug("%s failed", name, exc_info=failure)
        if isinstance(failure, UsageError):
            print(f"{name}: {failure}", file=sys.stderr)
            return 2
        if isinstance(failure, TeamrtError):
            print(f"{name}: {failure}", file=sys.stderr)
        elif isinstance(failure, OSError):
            print(f"{name}: {_os_error(failure)}", file=sys.stderr)
        else:
            print(
                f"{name}: unexpected {type(failure).__name__}: {failure} (run again with "
                "--log-level DEBUG to see where; please report it if teamrt is at fault)",
                file=sys.stderr,
            )
        return 1
