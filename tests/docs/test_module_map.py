"""The module map in the docs' Explanation section matches the package: every module and folder of
teamrt is on it, nothing on it is missing from the package, and its layers are the contract's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import teamrt

ROOT = Path(teamrt.__file__).parent
MAP = ROOT.parent / "docs" / "explanation" / "modules.md"
BRANCH = re.compile(r"^((?:│   |    )*)[├└]── (\S+)")


def _tree(text: str) -> list[str]:
    """The paths the map's tree names, relative to teamrt/ (folders end with a slash)."""
    block = text.split("```text\nteamrt/\n", 1)[1].split("```", 1)[0]
    paths: list[str] = []
    stack: list[str] = []
    for line in block.splitlines():
        match = BRANCH.match(line)
        assert match, f"not a line of the tree: {line!r}"
        depth = len(match[1]) // 4
        stack[depth:] = [match[2]]
        paths.append("".join(stack))
    return paths


def _package() -> set[str]:
    found = set()
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if "__pycache__" in relative.parts or (
            relative.name == "__init__.py" and relative.parent.parts
        ):
            continue
        if path.is_dir():
            found.add(relative.as_posix() + "/")
        elif path.suffix == ".py" and "notes" not in relative.parts:
            found.add(relative.as_posix())
    return found


def test_the_tree_reads_back_as_paths() -> None:
    text = "```text\nteamrt/\n├── a/\n│   ├── b.py   x\n│   └── c/\n│       └── d.py\n└── e.py\n```"
    assert _tree(text) == ["a/", "a/b.py", "a/c/", "a/c/d.py", "e.py"]


def test_every_module_and_folder_is_on_the_map_and_nothing_else() -> None:
    named = _tree(MAP.read_text())
    assert len(named) == len(set(named)), "a path named twice"
    package = _package() - {"__main__.py"}
    assert sorted(package - set(named)) == [], "modules missing from docs/explanation/modules.md"
    assert sorted(set(named) - package) == [], "the map names modules that are not in teamrt/"


def test_the_layers_table_is_the_contracts_order() -> None:
    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers") == ["teamrt"]
    )
    layers = [sorted(re.findall(r"\w+", layer)) for layer in contract["layers"]]
    table = MAP.read_text().split("## Layers, top to bottom", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    documented = [sorted(re.findall(r"`(\w+)`", row)) for row in rows]
    assert documented == layers
