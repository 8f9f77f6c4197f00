"""Each demo's one directory: `<--dir>/<demo's directory>`, holding its team, its agents' journals
and its scratch files, said at the start, and never taken from a run that is still going.

A run holds an exclusive `flock` on `.demo.lock` in its directory for as long as it runs (the
file names the holder; it is never deleted, so two runs always lock the same file). Before
starting over, a run empties the directory of its earlier run, all but that lock, and only when
nothing there is alive: another run of a demo holding the lock, or a member of a team in the
directory (a `teamrt run-agent` started by hand, say) holding its lease, is `MemberBusy` naming
it; nothing is removed then.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from teamrt.errors import MemberBusy, StoreError
from teamrt.mail import open_view
from teamrt.private_files import FILE_MODE, make_dirs
from teamrt.teamdir import DEMO_LOCK, ROSTER, TeamDir

LOCK = DEMO_LOCK

__all__ = ["LOCK", "claim"]


@contextlib.contextmanager
def claim(directory: Path, demo: str, *, what: str) -> Iterator[Path]:
    """Hold `directory` for this run of `demo` and empty it of an earlier run's files; say
    where the run writes (`what`: what is in there). `MemberBusy` if a run or a member there
    is alive. Yields `directory`."""
    make_dirs(directory)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(TeamDir(directory).demo_lock, flags, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another demo"
            raise MemberBusy(
                f"{directory} is in use by {holder}: wait for it to finish, or give this run a "
                "directory of its own (--dir)"
            ) from None
        _check_no_live_member(directory)
        _empty(directory)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"the {demo} demo (process {os.getpid()}, started {started})\n".encode(), 0)
        print(f"demo {demo}: writing in {directory}/ ({what})", flush=True)
        yield directory
    finally:
        os.close(fd)  # the lock goes with it


def _teams(directory: Path) -> list[Path]:
    """The team directories in `directory`: itself, and those one or two levels below."""
    found = [directory] if TeamDir(directory).holds_team() else []
    found += sorted(p.parent for p in directory.glob(f"*/{ROSTER}"))
    found += sorted(p.parent for p in directory.glob(f"*/*/{ROSTER}"))
    return found


def _check_no_live_member(directory: Path) -> None:
    for team in _teams(directory):
        try:
            with open_view(team) as view:
                busy = [(name, view.holder(name)) for name in view.members()]
        except StoreError:  # not a team this user could open: removing it is not ours either
            raise MemberBusy(
                f"{team} holds a team this demo cannot check for running members: move it "
                "away, or give this run a directory of its own (--dir)"
            ) from None
        for name, holder in busy:
            if holder is not None:
                raise MemberBusy(
                    f"member {name!r} of the team in {team} is running ({holder}): stop it, "
                    "or give this run a directory of its own (--dir)"
                )


def _empty(directory: Path) -> None:
    """Remove an earlier run's files (never the lock; a symlink goes, not what it names)."""
    for entry in directory.iterdir():
        if entry.name == DEMO_LOCK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
