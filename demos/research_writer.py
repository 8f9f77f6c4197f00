"""Run the researcher/writer demo: `python demos/research_writer.py [--model openai]`."""

import sys
from pathlib import Path

import anyio

from teamrt.demos.research_writer import run

model = (
    "openai"
    if "--model=openai" in sys.argv or sys.argv[-2:] == ["--model", "openai"]
    else ("offline")
)
sys.exit(anyio.run(run, Path("mailboxes"), model))
