"""Run the researcher/writer demo: `python demos/research_writer.py [--model openai]`.

The same as `teamrt demo research-writer [--model openai] [--dir ROOT]`, errors included (one
line, never a traceback)."""

import sys

from teamrt.cli.main import main

sys.exit(main(["demo", "research-writer", *sys.argv[1:]]))
