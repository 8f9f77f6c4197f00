"""The shell snippets of the docs run as written. A page's ```console blocks are its runnable
ones: each `$ ` line is a command (other lines show what it prints, and are not compared); all
of a page's commands run in order, as one `bash -e` script, in a fresh directory holding a
copy of examples/, so a later block may use what an earlier one made. Blocks marked ```sh are
illustrations (servers, placeholders) and are not run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.docs_programs import DOCS, run, scratch

CONSOLE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


def commands(page: Path) -> list[str]:
    """The `$ ` lines of the page's console blocks, in order."""
    return [
        line[2:]
        for block in CONSOLE.findall(page.read_text())
        for line in block.splitlines()
        if line.startswith("$ ")
    ]


PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if commands(p))


def test_the_tutorial_and_the_guides_have_shell_snippets_to_run() -> None:
    assert {"tutorial/first-agent.md", "tutorial/looking-at-a-run.md", "how-to/forks.md",
            "how-to/evals.md", "how-to/repair.md"} <= set(PAGES)  # fmt: skip


def test_a_console_block_without_commands_is_refused() -> None:
    """A ```console block is there to be run: one with no `$ ` line is a mistake of the page
    (output shown without its command, or a block that should be ```sh)."""
    empty = [
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        for block in CONSOLE.findall(p.read_text())
        if not any(line.startswith("$ ") for line in block.splitlines())
    ]
    assert empty == []


@pytest.mark.parametrize("page", PAGES)
def test_the_page_s_shell_snippets_run(page: str, tmp_path: Path) -> None:
    env = scratch(tmp_path)
    script = "set -euo pipefail\n" + "\n".join(commands(DOCS / page)) + "\n"
    done = run(["bash", "-c", script], tmp_path, env)
    assert done.returncode == 0, f"{page}:\n{script}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
