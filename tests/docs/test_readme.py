"""The README is a front door: short, its one example runs as pasted, and each of its links
leads to a file of the repository (the site's pages, the format, an example)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from teamrt.cli.main import build_parser
from tests.support.paths import ROOT

README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_door_of_150_to_250_lines() -> None:
    assert 150 <= len(README.splitlines()) <= 250


def test_its_example_runs_as_pasted(tmp_path: Path) -> None:
    """The first Python block, saved as a file and run in an empty directory."""
    found = re.search(r"^```python\n(.*?)^```", README, re.S | re.M)
    assert found
    (tmp_path / "team.py").write_text(found.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "team.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "answer - The writer wrote loop.md.\n"
    assert (tmp_path / "loop.md").read_text() == "# The loop\n"
    assert (tmp_path / "mailboxes" / "readme" / "inboxes" / "writer.jsonl").stat().st_size > 0


def test_every_link_leads_to_a_file_of_the_repository() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert len(links) > 20
    broken = [
        link
        for link in links
        if link.startswith(("http:", "https:")) or not (ROOT / link.split("#")[0]).is_file()
    ]
    assert broken == []


def test_it_names_the_two_commands_and_every_demo() -> None:
    assert "make demo" in README and "make test" in README
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    (name,) = [a for a in commands.choices["demo"]._actions if a.dest == "name"]
    assert name.choices
    missing = [c for c in name.choices if f"- `{c}`" not in README]
    assert missing == []
