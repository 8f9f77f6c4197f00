"""An MkDocs hook: the command-line reference is generated from the parser itself.

`<!-- teamrt-cli-reference -->` in a page becomes, for `teamrt` and each of its commands, a
heading and the command's `--help` as argparse prints it, so the page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- teamrt-cli-reference -->"


def reference() -> str:
    """The Markdown for every command's help, at a fixed width."""
    from teamrt.cli.main import build_parser

    parser = build_parser()
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the page should not vary
    try:
        sections = [_section("teamrt", parser)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    sections.append(_section(f"teamrt {name}", command))
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(sections)


def _section(title: str, parser: argparse.ArgumentParser) -> str:
    anchor = title.replace(" ", "-")
    return f"### `{title}` {{#{anchor}}}\n\n```text\n{parser.format_help().rstrip()}\n```\n"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference())
    return markdown
