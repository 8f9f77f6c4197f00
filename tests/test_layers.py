"""The store seam holds where imports cannot tell: read every module's names, fail when a layer
reaches past it.

- nothing above the stores (teams, agents, the conductor, replay, the CLI, the demos) names a
  store class or opens an inbox file itself: it goes through `Mailboxes`, `open_mailboxes` /
  `open_view` and the `TeamView` tools read;
- the store-agnostic mail modules (mailboxes, inbox, store, log, cursor) name no concrete store.

What each layer may import (that nothing above the stores imports a concrete store's module, that
the mailbox layer imports nothing above it) is said by the import-linter contracts in
pyproject.toml, which `make lint` checks (`lint-imports`).

The benchmarks are the one exception above the stores: they measure the file store itself (raw
locked appends, rotation, depth), so they may name it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import teamrt

ROOT = Path(teamrt.__file__).parent
STORE_NAMES = {"FileStore", "MemoryStore", "RedisStore", "FileReader", "InboxPaths", "FileView"}
AGNOSTIC = ["mail/mailboxes.py", "mail/inbox.py", "mail/store.py", "mail/log.py",
            "mail/cursor.py", "mail/group.py", "mail/signing.py"]  # fmt: skip
# the benchmarks: they may name a concrete store, they measure it
MEASURES = ROOT / "bench"


def _modules(under: str = "") -> list[Path]:
    return sorted((ROOT / under).rglob("*.py"))


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found |= {alias.name for alias in node.names}
    return found


def _above_stores() -> list[Path]:
    return [
        p
        for p in _modules()
        if not p.is_relative_to(ROOT / "mail")
        and not p.is_relative_to(MEASURES)
        and p.name != "__init__.py"  # the package re-exports every public class
        and not p.is_relative_to(ROOT / "testing")  # the conformance suite tests stores
    ]


def test_nothing_above_the_stores_names_a_store_class() -> None:
    offenders = [
        f"{p.relative_to(ROOT)} names {sorted(_names(p) & STORE_NAMES)}"
        for p in _above_stores()
        if _names(p) & STORE_NAMES
    ]
    assert offenders == []


def test_nothing_above_the_stores_opens_an_inbox_file() -> None:
    """Inbox files are `inboxes/<name>.jsonl`; a tool that builds that path reads past the
    store. (Agents' own journals under agents/ are theirs to read.)"""
    path_join = re.compile(r"""/\s*["']inboxes\b|["']inboxes["']\s*/|\.jsonl["'].*inbox""")
    offenders = [
        str(p.relative_to(ROOT)) for p in _above_stores() if path_join.search(p.read_text())
    ]
    assert offenders == []


def test_the_store_agnostic_modules_name_no_concrete_store() -> None:
    offenders = []
    for relative in AGNOSTIC:
        named = _names(ROOT / relative) & (STORE_NAMES | {"FileMailboxes", "MemoryMailboxes"})
        if named:
            offenders.append(f"{relative}: {sorted(named)}")
    assert offenders == []
