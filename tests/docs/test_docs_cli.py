"""The command-line reference says what the parser does: its command summary names every
option each command has (and none it lacks) with each option's choices, and the generated part
of the page has every command's --help."""

from __future__ import annotations

import argparse
import importlib.util
import re

from teamrt.cli.main import build_parser
from tests.support.paths import ROOT

PAGE = (ROOT / "docs" / "reference" / "cli.md").read_text()
HOOK = ROOT / "docs" / "hooks" / "cli_reference.py"
_spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
assert _spec and _spec.loader
cli_reference = importlib.util.module_from_spec(_spec)  # the site's hook, as MkDocs loads it
_spec.loader.exec_module(cli_reference)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **subparsers.choices}


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """The option strings of each option a command documents in its --help (not -h, not the
    hidden ones): `("-q", "--quiet")`."""
    return [
        tuple(action.option_strings)
        for action in parser._actions
        if action.option_strings
        and action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction)
    ]


def _summary() -> dict[str, str]:
    """The page's command summary (its first fenced block): each command's lines, keyed by the
    command's name."""
    found = re.search(r"^```\n(.*?)^```", PAGE, re.S | re.M)
    assert found, "no command summary on the CLI page"
    lines: dict[str, str] = {}
    current = ""
    for line in found.group(1).splitlines():
        words = line.split()
        if words[:1] == ["teamrt"]:
            current = "" if words[1].startswith("[") else words[1]
        lines[current] = lines.get(current, "") + " " + line.split("#")[0]
    return lines


def test_the_command_summary_has_every_command_and_option() -> None:
    summary = _summary()
    commands = _commands()
    assert set(summary) == set(commands)
    for name, parser in commands.items():
        shown = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", summary[name]))
        options = _options(parser)
        missing = [o for o in options if not shown & set(o)]
        assert not missing, f"teamrt {name}: the summary lacks {missing}"
        unknown = shown - {s for o in options for s in o}
        assert not unknown, f"teamrt {name}: the summary shows {unknown}, which it does not have"


def test_each_option_choice_in_the_summary_is_the_command_s() -> None:
    summary = _summary()
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                if action.option_strings and action.dest != "only":  # --only GROUP
                    assert "|".join(str(c) for c in action.choices) in summary[name], action.dest
                elif not action.option_strings:  # the demo's name
                    assert "|".join(str(c) for c in action.choices) in summary[name], name


def test_the_generated_reference_has_every_command_s_help() -> None:
    assert cli_reference.MARKER in PAGE
    reference = cli_reference.reference()
    for name in _commands():
        title = f"teamrt {name}".strip()
        assert f"### `{title}`" in reference, title
        section = reference[reference.index(f"### `{title}`") :]
        assert f"usage: {title} " in section.split("```")[1], title
