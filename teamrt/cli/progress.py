"""Progress on stderr for the commands that take a while: `teamrt bench`, `replay` and `repair`.

On a terminal, one line redrawn in place with rich's `Progress`: a spinner, what is being done, a
bar and how far (of the total, where it is known), the elapsed time and a detail (the last figure
measured, the number of events read). It is transient, erased when the command ends, so what stays
on the screen is the command's output, and that goes to stdout untouched: the line is drawn on
stderr only. Anywhere else (a pipe, a file, a test) nothing is drawn; a command may ask for one
plain line per section it starts (`bench` does), and none prints more. `--quiet` turns both off.

The cost is kept to the callers' few attribute writes: `update` only stores numbers, and rich's own
thread reads them when it redraws, a few times a second. rich is imported only when a line is
drawn, so the commands that show nothing do not pay for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress as RichProgress


def on_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal that can redraw a line in place."""
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (ValueError, AttributeError):  # closed, or no isatty at all
        return False


class Progress:
    """How far a command has got, shown on stderr while it works.

    ```
    with Progress("replay demo", total=size, unit="bytes", quiet=args.quiet) as progress:
        progress.update(done, detail="1,024 events")  # as often as convenient: it only stores
    ```

    `unit` is `"bytes"` (shown as 1.2/40.1 MB) or a word for what is counted (`"sections"`:
    3/12 sections). `section(name, index, count)` says a new part started: on a terminal it
    becomes the line's title, elsewhere, with `plain=True`, one plain line. `refresh` is how many
    times a second the line is redrawn (at most)."""

    def __init__(
        self,
        what: str,
        *,
        total: float | None = None,
        unit: str = "",
        plain: bool = False,
        quiet: bool = False,
        refresh: float = 4.0,
        stream: TextIO | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.what = what
        self.total = total
        self.unit = unit
        self.done: float = 0
        self.detail = ""
        self.drawn = not quiet and on_terminal(self.stream)
        self.plain = plain and not quiet and not self.drawn
        self.refresh = refresh
        self.started = time.monotonic()
        self._title = what
        self._bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if self.drawn:
            self._bar = _rich_progress(self)
            self._bar.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()  # transient: the line is erased
            self._bar = None

    def update(
        self, done: float | None = None, *, total: float | None = None, detail: str | None = None
    ) -> None:
        """Store how far the work has got (read by the next redraw)."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if detail is not None:
            self.detail = detail

    def section(self, name: str, index: int, count: int) -> None:
        """Part `index` (from 1) of `count` started: `name` is what it does."""
        self._title = f"{self.what}: {name}"
        self.done, self.total, self.detail = index - 1, count, ""
        if self.plain:
            self.stream.write(
                f"{self.what}: {name} ({index}/{count}, {self.elapsed():.0f} s elapsed)\n"
            )
            self.stream.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # what the drawn line shows, read from rich's thread

    def title(self) -> str:
        return self._title

    def amount(self) -> str:
        """How far, in the unit: `1.2/40.1 MB`, `3/12 sections`, or just the count."""
        if self.unit == "bytes":
            return _bytes(self.done, self.total)
        done_text = f"{self.done:,.0f}"
        if self.total is not None:
            done_text += f"/{self.total:,.0f}"
        return f"{done_text} {self.unit}".rstrip()


def _bytes(done: float, total: float | None) -> str:
    """`1.2/40.1 MB` (both in the unit that suits the total), or `1.2 MB` without one."""
    scale = done if total is None else total
    size, suffix = 1.0, "bytes"
    for suffix_here in ("kB", "MB", "GB", "TB"):
        if scale < size * 1000:
            break
        size, suffix = size * 1000, suffix_here
    digits = 0 if suffix == "bytes" else 1
    shown = f"{done / size:,.{digits}f}"
    if total is not None:
        shown += f"/{total / size:,.{digits}f}"
    return f"{shown} {suffix}"


def _rich_progress(source: Progress) -> RichProgress:
    """rich's Progress with one task whose every column reads `source` when it redraws."""
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import (
        ProgressColumn,
        SpinnerColumn,
        Task,
        TimeElapsedColumn,
    )
    from rich.progress_bar import ProgressBar
    from rich.table import Column
    from rich.text import Text

    class Show(ProgressColumn):
        def __init__(self, render: Callable[[], RenderableType], *, give: bool = False) -> None:
            # a column that gives (the detail) is narrowed first when the line is too long
            super().__init__(table_column=Column(no_wrap=not give))
            self._render = render

        def render(self, task: Task) -> RenderableType:
            return self._render()

    def bar() -> ProgressBar:
        total = source.total
        return ProgressBar(
            total=total,
            completed=0 if total is None else min(source.done, total),
            width=24,
            pulse=total is None,
        )

    def text(value: Callable[[], str], style: str = "") -> Callable[[], Any]:
        return lambda: Text(value(), style=style, no_wrap=True, overflow="ellipsis")

    progress = RichProgress(
        SpinnerColumn(),
        Show(text(source.title, "bold")),
        Show(bar),
        Show(text(source.amount)),
        TimeElapsedColumn(),
        Show(text(lambda: source.detail, "dim"), give=True),
        console=Console(file=source.stream, force_terminal=True),
        refresh_per_second=source.refresh,
        transient=True,
        redirect_stdout=False,  # stdout is the command's output, byte for byte
        # a log line or a signal's notice written to stderr meanwhile goes above the line
        redirect_stderr=source.stream is sys.stderr,
    )
    progress.add_task(source.what, total=None)
    return progress
