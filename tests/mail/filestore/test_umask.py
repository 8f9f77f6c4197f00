"""Everything teamrt writes is its user's alone, whatever the umask: under umask 000, the team
directory's missing parents, a demo's files, replay pages, eval reports, derived cases, exports
and forks are created 0700 (directories) and 0600 (files). Real commands, in a child process
with umask 000."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from teamrt.replay import timeline

CREATE_DEEP_TEAM = """
import anyio
from teamrt.mail import open_mailboxes

async def main():
    async with open_mailboxes("deep/er/team", members=["lead", "worker"]):
        pass

anyio.run(main)
"""


def _under_umask_000(cwd: Path, *argv: str, codes: tuple[int, ...] = (0,)) -> None:
    def umask_000() -> None:
        os.umask(0)

    env = {k: v for k, v in os.environ.items() if k != "TEAMRT_DEMO_SCRATCH"}
    result = subprocess.run(
        argv, cwd=cwd, env=env, preexec_fn=umask_000, capture_output=True, text=True, timeout=50
    )
    assert result.returncode in codes, (argv, result.stdout[-2000:], result.stderr[-2000:])


def _first_request(team: Path) -> str:
    return next(e.id for e in timeline(team) if e.kind == "request")


def _modes(root: Path) -> dict[str, str]:
    """Every path under `root` (itself excluded) with its permission bits, in octal."""
    found = {}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


@pytest.mark.timeout(120)
def test_nothing_teamrt_makes_is_open_to_others_under_umask_000(tmp_path: Path) -> None:
    teamrt = [sys.executable, "-m", "teamrt"]
    (tmp_path / "reports").mkdir(mode=0o700)
    _under_umask_000(tmp_path, sys.executable, "-c", CREATE_DEEP_TEAM)
    _under_umask_000(tmp_path, *teamrt, "demo", "--dir", "out/demos")
    team = "out/demos/research-writer"
    _under_umask_000(
        tmp_path, *teamrt, "replay", team, "--format", "html", "-o", "reports/run.html"
    )
    _under_umask_000(tmp_path, *teamrt, "eval", "--from-run", team, "-o", "reports/cases.jsonl")
    _under_umask_000(
        tmp_path, *teamrt, "eval", "reports/cases.jsonl",
        "--target", "teamrt.demos.research_writer:teammates",
        "--json", "reports/eval.json", "--html", "reports/eval.html",
        codes=(0, 1),  # 1: a case failed, as derived cases may here (the run's own paths)
    )  # fmt: skip
    _under_umask_000(tmp_path, *teamrt, "export", team, "snaps/of/research-writer")
    _under_umask_000(tmp_path, *teamrt, "fork", team, "--at", _first_request(tmp_path / team),
                     "forks/of/research-writer-2")  # fmt: skip
    modes = _modes(tmp_path)
    assert {"deep", "deep/er", "deep/er/team", "out", "out/demos", team} <= modes.keys()
    assert {"reports/run.html", "reports/cases.jsonl", "reports/eval.json"} <= modes.keys()
    assert f"{team}/scratch/agent-loop.md" in modes
    assert {"snaps/of/research-writer/team.json", "forks/of/research-writer-2/team.json"} <= (
        modes.keys()
    )
    open_to_others = {
        path: mode
        for path, mode in modes.items()
        if mode != ("0o700" if (tmp_path / path).is_dir() else "0o600")
    }
    assert open_to_others == {}
