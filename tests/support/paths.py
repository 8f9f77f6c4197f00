"""Where the tests find the checkout: its root (for docs, examples and the recorded samples), this
directory of helpers (child processes and the specs they load), and the samples."""

from __future__ import annotations

from pathlib import Path

#: The helpers' directory: put on a child's PYTHONPATH, its modules load as `MODULE:SPEC`.
SUPPORT = Path(__file__).resolve().parent
#: The checkout (on a child's PYTHONPATH, `tests.*` and the working tree's `teamrt` import).
ROOT = SUPPORT.parent.parent
#: The recorded team runs under mailboxes/samples/.
SAMPLES = ROOT / "mailboxes" / "samples"
