"""How the docs' programs and shell snippets are run by the tests: in a scratch directory
holding a copy of examples/, with `python`, `python3` and `teamrt` on PATH being this
interpreter and this checkout's teamrt (whatever PYTHONPATH a snippet sets adds to it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"


def scratch(tmp_path: Path) -> dict[str, str]:
    """Copy examples/ into `tmp_path`, put the wrappers in `tmp_path/.bin`, and return the
    environment to run programs and snippets with."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    # the checkout first on the path, then whatever the command itself asks for
    prefix = f'PYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"'
    wrappers = {
        "python": f'{prefix} exec "{sys.executable}" "$@"',
        "python3": f'{prefix} exec "{sys.executable}" "$@"',
        "teamrt": f'{prefix} exec "{sys.executable}" -m teamrt "$@"',
    }
    for name, line in wrappers.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TEAMRT_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        TEAMRT_ALLOW_MODEL_REQUESTS="0",  # no real model, as in the rest of the suite
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",  # the conductor's checks: pytest without plugins
        NO_COLOR="1",
    )
    return env


def run(
    argv: list[str], cwd: Path, env: Mapping[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run to the end (pytest's per-test timeout bounds it), stdout and stderr captured."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=dict(env),
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
